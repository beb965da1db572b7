//! HTTP tool upstreams at `/tools/{tool}/{path}`: who may call what, with
//! whose credential, and a breaker per tool.

use loopgate_tests::*;

fn config(mock: &Mock, breaker: &str) -> String {
    format!(
        r#"
{head}
tools:
  weather:
    base_url: "{mock}/echo/weather"
    auth: {{ header: x-tool-key, value_env: LOOPGATE_TEST_TOOL_KEY }}
    breaker: {{ {breaker} }}
  orders:
    base_url: "{mock}/echo/orders"
    auth: {{ bearer_env: LOOPGATE_TEST_TOOL_KEY }}
  strict:
    base_url: "{mock}/echo/strict"
    expect_json: true
    breaker: {{ consecutive_failures: 2, open_ms: 60000 }}
  ledger:
    base_url: "{mock}/echo/ledger"
    timeouts: {{ read_ms: 500 }}
    idempotency: {{ mode: required }}
  retrying:
    base_url: "{mock}/echo/retrying"
    timeouts: {{ read_ms: 500 }}
    idempotency: {{ mode: optional, retry_after_failure: true }}
  moving:
    base_url: "{mock}/echo/moving"
    pass_redirects: true
agents:
  tester:
    key_sha256: "{agent}"
    models: [gpt-4o-mini]
    tool_access:
      weather: {{ methods: [GET], paths: ["/v1/forecast", "/v1/city/*"] }}
      orders: {{ methods: [GET, POST], paths: ["/orders*"], max_body_bytes: 2097152 }}
      ledger: {{ methods: [GET, POST], paths: ["/*"] }}
      retrying: {{ methods: [POST], paths: ["/*"] }}
      strict: {{ methods: [GET], paths: ["/*"] }}
      moving: {{ methods: [GET], paths: ["/*"] }}
  narrow:
    key_sha256: "{narrow}"
    models: [gpt-4o-mini]
"#,
        mock = mock.url(),
        head = config_head(mock, "gpt-4o-mini", ""),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
        narrow = sha256_hex(NARROW_KEY.as_bytes()),
    )
}

fn start(mock: &Mock, breaker: &str) -> Gateway {
    Gateway::start(&config(mock, breaker))
}

fn get(gw: &Gateway, key: &str, path: &str) -> Resp {
    curl(&[&gw.url(path), "--path-as-is", "-H", &auth(key)])
}

#[test]
fn an_allowed_call_goes_to_the_tool_with_its_credential_only() {
    let mock = Mock::start();
    let gw = start(&mock, "");
    let r = get(
        &gw,
        AGENT_KEY,
        "/tools/weather/v1/forecast?city=Paris&days=3",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = r.json();
    assert_eq!(echo["path"], "/echo/weather/v1/forecast");
    assert_eq!(echo["query"], "city=Paris&days=3");
    assert_eq!(r.header("x-loopgate-provider"), Some("weather"));
    let seen = mock.last_request();
    assert_eq!(recorded_header(&seen, "x-tool-key"), Some(TOOL_KEY));
    assert!(!seen["headers"].to_string().contains(AGENT_KEY));
    assert_eq!(recorded_header(&seen, "authorization"), None);
    // Bearer credentials, and encoded names that stay inside the allowed prefix.
    let r = get(&gw, AGENT_KEY, "/tools/weather/v1/city/S%C3%A3o%20Paulo");
    assert_eq!(r.status, 200);
    let r = get(&gw, AGENT_KEY, "/tools/orders/orders/42");
    assert_eq!(r.status, 200);
    assert_eq!(
        recorded_header(&mock.last_request(), "authorization"),
        Some(format!("Bearer {TOOL_KEY}").as_str())
    );
}

#[test]
fn bodies_of_any_type_stream_through_unchanged() {
    let mock = Mock::start();
    let gw = start(&mock, "");
    let body: Vec<u8> = (0..1_500_000u32).map(|i| (i % 251) as u8).collect();
    let r = curl_body(
        &[
            &gw.url("/tools/orders/orders/upload"),
            "-H",
            &auth(AGENT_KEY),
            "-H",
            "content-type: application/octet-stream",
        ],
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["body_sha256"], sha256_hex(&body));
    assert_eq!(
        recorded_header(&mock.last_request(), "content-type"),
        Some("application/octet-stream")
    );
}

#[test]
fn every_tool_denial_is_answered_without_forwarding() {
    let mock = Mock::start();
    let gw = start(&mock, "");
    let (tester, narrow) = (Some(AGENT_KEY), Some(NARROW_KEY));
    let chunked: &[&str] = &["-H", "Transfer-Encoding: chunked", "-d", "x"];
    // (the agent's key, path, more curl arguments, status, code)
    type Case<'a> = (Option<&'a str>, &'a str, &'a [&'a str], u16, &'a str);
    #[rustfmt::skip]
    let cases: [Case; 11] = [
        (None, "/tools/weather/v1/forecast", &[], 401, "missing_key"),
        (tester, "/tools/nope/x", &[], 404, "not_found"),
        (narrow, "/tools/weather/v1/forecast", &[], 403, "tool_not_allowed"),
        (tester, "/tools/weather/v1/forecast", &["-X", "POST"], 405, "method_not_allowed"),
        (tester, "/tools/weather/v1/admin", &[], 403, "path_not_allowed"),
        (tester, "/tools/weather/v1/forecast2", &[], 403, "path_not_allowed"),
        (tester, "/tools/weather/v1/city/../../admin", &["--path-as-is"], 400, "invalid_path"),
        (tester, "/tools/weather/v1/city/%2e%2e/%2e%2e/admin", &[], 400, "invalid_path"),
        (tester, "/tools/weather/v1/city/x%2f..%2f..%2fadmin", &[], 400, "invalid_path"),
        (tester, "/tools/weather/v1//forecast", &["--path-as-is"], 400, "invalid_path"),
        (tester, "/tools/orders/orders", chunked, 411, "length_required"),
    ];
    for (key, path, extra, status, code) in cases {
        let url = gw.url(path);
        let key = key.map(auth);
        let mut args = vec![url.as_str()];
        if let Some(k) = &key {
            args.extend(["-H", k.as_str()]);
        }
        args.extend_from_slice(extra);
        let r = curl(&args);
        r.assert_gateway_error(status, code);
        assert_eq!(
            r.json()["error"]["upstream_failed"],
            false,
            "{code}: a gateway decision"
        );
    }
    let big = vec![b'x'; 2_097_153];
    curl_body(
        &[&gw.url("/tools/orders/orders"), "-H", &auth(AGENT_KEY)],
        &big,
    )
    .assert_gateway_error(413, "body_too_large");
    assert_eq!(mock.connections(), 0, "a refused body reached the tool");
    assert!(mock.requests().is_empty(), "{:?}", mock.requests());
}

#[test]
fn a_tool_breaker_opens_on_a_500_storm_and_half_open_sends_only_the_probe() {
    let mock = Mock::start();
    let gw = start(
        &mock,
        "consecutive_failures: 3, open_ms: 1500, probe: { path: /health }",
    );
    for _ in 0..3 {
        let r = curl(&[
            &gw.url("/tools/weather/v1/forecast"),
            "-H",
            &auth(AGENT_KEY),
            "-H",
            "x-mock-status: 500",
        ]);
        assert_eq!(r.status, 500);
    }
    let r = get(&gw, AGENT_KEY, "/tools/weather/v1/forecast");
    r.assert_gateway_error(503, "circuit_open");
    assert_eq!(mock.requests().len(), 3);
    // The probe (GET {base}/health) closes it; no agent call was the probe.
    assert!(eventually(5, || mock
        .requests()
        .iter()
        .any(|r| r["path"] == "/echo/weather/health")));
    assert!(eventually(5, || get(
        &gw,
        AGENT_KEY,
        "/tools/weather/v1/forecast"
    )
    .status
        == 200));
    let probe = mock
        .requests()
        .into_iter()
        .find(|r| r["path"] == "/echo/weather/health")
        .unwrap();
    assert_eq!(probe["method"], "GET");
    assert_eq!(recorded_header(&probe, "x-tool-key"), Some(TOOL_KEY));
    let agent_calls = mock
        .requests()
        .iter()
        .filter(|r| r["path"] == "/echo/weather/v1/forecast")
        .count();
    assert_eq!(agent_calls, 4, "3 failing calls and the one after closing");
}

fn post(gw: &Gateway, path: &str, key: Option<&str>, extra: &[&str], body: &[u8]) -> Resp {
    let k = key.map(|k| format!("Idempotency-Key: {k}"));
    let mut args = vec![];
    if let Some(k) = &k {
        args.extend(["-H", k.as_str()]);
    }
    args.extend_from_slice(extra);
    post_json(gw, AGENT_KEY, path, &args, body)
}

fn tool_calls(mock: &Mock, path: &str) -> usize {
    mock.requests().iter().filter(|r| r["path"] == path).count()
}

#[test]
fn idempotency_keys_replay_refuse_and_protect() {
    let mock = Mock::start();
    let gw = start(&mock, "");
    let body = br#"{"amount":42,"to":"acct-7"}"#;
    // Required and missing (or malformed): refused, not forwarded.
    post(&gw, "/tools/ledger/transfers", None, &[], body)
        .assert_gateway_error(400, "idempotency_key_required");
    post(&gw, "/tools/ledger/transfers", Some("bad key!"), &[], body)
        .assert_gateway_error(400, "idempotency_key_required");
    // Reads need no key.
    assert_eq!(get(&gw, AGENT_KEY, "/tools/ledger/balance").status, 200);

    let first = post(&gw, "/tools/ledger/transfers", Some("k-1"), &[], body);
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("x-loopgate-idempotent-replay"), None);
    assert_eq!(tool_calls(&mock, "/echo/ledger/transfers"), 1);
    // The same call again: the recorded answer, not a second transfer.
    let again = post(&gw, "/tools/ledger/transfers", Some("k-1"), &[], body);
    assert_eq!(again.status, 200);
    assert_eq!(again.header("x-loopgate-idempotent-replay"), Some("true"));
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("content-type"), Some("application/json"));
    assert_eq!(tool_calls(&mock, "/echo/ledger/transfers"), 1);
    // The same key with another body.
    post(
        &gw,
        "/tools/ledger/transfers",
        Some("k-1"),
        &[],
        br#"{"amount":43}"#,
    )
    .assert_gateway_error(422, "idempotency_key_reused");
    assert_eq!(tool_calls(&mock, "/echo/ledger/transfers"), 1);
}

#[test]
fn of_two_concurrent_duplicates_exactly_one_reaches_the_tool() {
    let mock = Mock::start();
    let gw = start(&mock, "");
    let url = gw.url("/tools/ledger/slow");
    let key = auth(AGENT_KEY);
    let first = std::thread::spawn(move || {
        curl(&[
            &url,
            "-H",
            &key,
            "-H",
            "Idempotency-Key: k-2",
            "-H",
            "x-mock-latency-ms: 400",
            "-d",
            "{}",
        ])
    });
    assert!(eventually(5, || tool_calls(&mock, "/echo/ledger/slow") == 1));
    let dup = post(
        &gw,
        "/tools/ledger/slow",
        Some("k-2"),
        &["-H", "x-mock-latency-ms: 400"],
        b"{}",
    );
    dup.assert_gateway_error(409, "request_in_progress");
    assert_eq!(dup.json()["error"]["retryable"], true);
    assert_eq!(first.join().unwrap().status, 200);
    assert_eq!(tool_calls(&mock, "/echo/ledger/slow"), 1);
    let later = post(&gw, "/tools/ledger/slow", Some("k-2"), &[], b"{}");
    assert_eq!(later.header("x-loopgate-idempotent-replay"), Some("true"));
    assert_eq!(tool_calls(&mock, "/echo/ledger/slow"), 1);
}

#[test]
fn a_call_lost_in_transport_is_not_repeated_unless_the_tool_allows_it() {
    let mock = Mock::start();
    let gw = start(&mock, "");
    let slow = ["-H", "x-mock-latency-ms: 2000"];
    post(&gw, "/tools/ledger/pay", Some("k-3"), &slow, b"{}")
        .assert_gateway_error(504, "upstream_timeout");
    post(&gw, "/tools/ledger/pay", Some("k-3"), &[], b"{}")
        .assert_gateway_error(409, "outcome_unknown");
    assert_eq!(tool_calls(&mock, "/echo/ledger/pay"), 1, "never sent twice");
    // A tool that says retries are safe gets the retry.
    post(&gw, "/tools/retrying/pay", Some("k-4"), &slow, b"{}")
        .assert_gateway_error(504, "upstream_timeout");
    assert_eq!(
        post(&gw, "/tools/retrying/pay", Some("k-4"), &[], b"{}").status,
        200
    );
    assert_eq!(tool_calls(&mock, "/echo/retrying/pay"), 2);
    // Optional mode: no key, no idempotency.
    assert_eq!(
        post(&gw, "/tools/retrying/pay", None, &[], b"{}").status,
        200
    );
}

#[test]
fn large_idempotent_bodies_are_forwarded_whole_and_replayed() {
    let mock = Mock::start();
    let gw = start(&mock, "");
    let body: Vec<u8> = std::iter::repeat_n(b'a', 300 * 1024).collect();
    let first = post(&gw, "/tools/ledger/import", Some("k-5"), &[], &body);
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.json()["body_sha256"], sha256_hex(&body));
    let again = post(&gw, "/tools/ledger/import", Some("k-5"), &[], &body);
    assert_eq!(again.header("x-loopgate-idempotent-replay"), Some("true"));
    assert_eq!(again.body, first.body);
    assert_eq!(tool_calls(&mock, "/echo/ledger/import"), 1);
}

#[test]
fn a_tool_called_in_a_loop_is_stopped_like_a_model_loop() {
    let mock = Mock::start();
    let yaml = config(&mock, "").replace(
        "    tool_access:\n      weather:",
        "    loop_guard: { repeats: 3 }\n    tool_access:\n      weather:",
    );
    assert!(yaml.contains("loop_guard"));
    let gw = Gateway::start(&yaml);
    let call = || {
        curl(&[
            &gw.url("/tools/weather/v1/forecast?city=Oslo"),
            "-H",
            &auth(AGENT_KEY),
            "-H",
            "x-agent-task-id: t-9",
        ])
    };
    assert_eq!(call().status, 200);
    assert_eq!(call().status, 200);
    let r = call();
    r.assert_gateway_error(409, "loop_detected");
    assert_eq!(r.json()["error"]["upstream_failed"], false);
    assert_eq!(tool_calls(&mock, "/echo/weather/v1/forecast?city=Oslo"), 2);
}

#[test]
fn expect_json_counts_a_garbage_200_as_a_failure() {
    let mock = Mock::start();
    let gw = start(&mock, "");
    let call = |extra: &[&str]| {
        let url = gw.url("/tools/strict/status");
        let key = auth(AGENT_KEY);
        let mut args = vec![url.as_str(), "-H", &key];
        args.extend_from_slice(extra);
        curl(&args)
    };
    // JSON answers are successes, whatever their number.
    for _ in 0..3 {
        assert_eq!(call(&[]).status, 200);
    }
    // "200 but unusable": passed through unchanged, but counted.
    for _ in 0..2 {
        let r = call(&["-H", "x-mock-body: <html>maintenance</html>"]);
        assert_eq!(
            (r.status, r.text().as_str()),
            (200, "<html>maintenance</html>")
        );
    }
    call(&[]).assert_gateway_error(503, "circuit_open");
    // Other tools are not affected.
    assert_eq!(
        get(&gw, AGENT_KEY, "/tools/weather/v1/forecast").status,
        200
    );
}

#[test]
fn a_task_that_keeps_getting_the_same_failure_is_cut_off_from_the_tool() {
    let mock = Mock::start();
    // The same failing call, on purpose: the loop guard would stop it first.
    let yaml = config(&mock, "").replace(
        "    tool_access:\n      weather:",
        "    loop_guard: { enabled: false }\n    tool_access:\n      weather:",
    );
    let gw = Gateway::start(&yaml);
    let call = |task: &str, extra: &[&str]| {
        let url = gw.url("/tools/weather/v1/forecast");
        let key = auth(AGENT_KEY);
        let t = format!("x-agent-task-id: {task}");
        let mut args = vec![url.as_str(), "-H", &key, "-H", &t];
        args.extend_from_slice(extra);
        curl(&args)
    };
    for _ in 0..3 {
        assert_eq!(call("t-iso", &["-H", "x-mock-status: 503"]).status, 503);
    }
    let r = call("t-iso", &[]);
    r.assert_gateway_error(409, "tool_isolated");
    assert_eq!(r.json()["error"]["upstream_failed"], false);
    assert!(r.header("retry-after").is_some());
    assert_eq!(mock.requests().len(), 3);
    // Other tasks still reach the tool (its breaker did not open).
    assert_eq!(call("t-other", &[]).status, 200);
}

#[test]
fn the_task_watchdog_counts_tool_calls() {
    let mock = Mock::start();
    let yaml = config(&mock, "").replace(
        "    tool_access:\n      weather:",
        "    watchdog: { yellow: { steps: 2 }, red: { steps: 3 }, action: stop }\n    loop_guard: { enabled: false }\n    tool_access:\n      weather:",
    );
    let gw = Gateway::start(&yaml);
    let call = || {
        curl(&[
            &gw.url("/tools/weather/v1/city/a"),
            "-H",
            &auth(AGENT_KEY),
            "-H",
            "x-agent-task-id: t-w",
        ])
    };
    assert_eq!(call().header("x-loopgate-guard"), None);
    assert_eq!(call().header("x-loopgate-guard"), Some("warn"));
    call().assert_gateway_error(429, "task_stopped");
    assert_eq!(mock.requests().len(), 2);
}

/// Issue 41 item 9: a tool's redirect is its failure (502, no `Location`),
/// unless the tool is configured to pass them (`pass_redirects: true`).
#[test]
fn a_tool_redirect_is_a_failure_unless_the_tool_passes_redirects() {
    let mock = Mock::start();
    let gw = start(&mock, "consecutive_failures: 5");
    let redirect = |path: &str| {
        curl(&[
            &gw.url(path),
            "-H",
            &auth(AGENT_KEY),
            "-H",
            "x-mock-status: 302",
            "-H",
            "x-mock-response-header: location: http://elsewhere.invalid/x",
        ])
    };
    let r = redirect("/tools/weather/v1/forecast");
    r.assert_gateway_error(502, "upstream_error");
    assert_eq!(r.header("location"), None, "{r:?}");
    let r = redirect("/tools/moving/a");
    assert_eq!(r.status, 302, "{r:?}");
    assert_eq!(r.header("location"), Some("http://elsewhere.invalid/x"));
    assert_eq!(r.header("x-loopgate-error"), None);
    assert_eq!(mock.received(), 2, "each went to its tool once");
}
