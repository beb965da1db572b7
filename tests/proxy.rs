//! The data path end to end: real gateway, real mock, curl.

use loopgate_tests::*;

#[test]
fn chat_completion_goes_through_with_the_provider_key_only() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let r = post_chat(
        &gw,
        AGENT_KEY,
        &[
            "-H",
            "x-agent-id: billing",
            "-H",
            "x-agent-task-id: task-7",
            "-H",
            "x-agent-call-id: call-3",
            "-H",
            "x-agent-tool-name: search",
            "-H",
            "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "gpt-4o-mini");
    assert!(v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .starts_with("Hello"));
    let rid = r
        .header("x-request-id")
        .expect("x-request-id on the response");

    let seen = mock.last_request();
    assert_eq!(seen["path"], "/v1/chat/completions");
    assert_eq!(
        recorded_header(&seen, "authorization"),
        Some(format!("Bearer {UPSTREAM_KEY}").as_str())
    );
    assert_eq!(recorded_header(&seen, "x-request-id"), Some(rid));
    assert_eq!(
        recorded_header(&seen, "host"),
        Some(mock.addr.to_string().as_str())
    );
    for (h, v) in [
        ("x-agent-id", "billing"),
        ("x-agent-task-id", "task-7"),
        ("x-agent-call-id", "call-3"),
        ("x-agent-tool-name", "search"),
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
    ] {
        assert_eq!(recorded_header(&seen, h), Some(v), "{h}");
    }
    // The agent's key reached no header at all.
    let all = seen["headers"].to_string();
    assert!(!all.contains(AGENT_KEY), "agent key leaked upstream: {all}");
    assert_eq!(recorded_header(&seen, "x-api-key"), None);
    assert_eq!(seen["body_sha256"], sha256_hex(CHAT.as_bytes()));
}

#[test]
fn agent_request_id_is_kept_both_ways_and_junk_ids_are_replaced() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let r = post_chat(&gw, AGENT_KEY, &["-H", "x-request-id: agent-req-123"]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-id"), Some("agent-req-123"));
    assert_eq!(
        recorded_header(&mock.last_request(), "x-request-id"),
        Some("agent-req-123")
    );

    let r = post_chat(&gw, AGENT_KEY, &["-H", "x-request-id: bad id with spaces"]);
    assert_eq!(r.status, 200);
    let rid = r.header("x-request-id").unwrap();
    assert_eq!(rid.len(), 32, "{rid}");
    assert_eq!(
        recorded_header(&mock.last_request(), "x-request-id"),
        Some(rid)
    );
}

/// The same stream from the mock and through the gateway; the mock's
/// OpenAI streams carry usage only when asked, as OpenAI's do.
fn stream_both_ways(path: &str, key_header: &str, body: &str) -> (Resp, Resp, Mock) {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let direct = curl(&[
        &format!("{}{}", mock.url(), path),
        "-N",
        "-H",
        "x-mock-chunks: 20",
        "-H",
        "x-mock-usage-if-asked: 1",
        "-d",
        body,
    ]);
    let via = curl(&[
        &gw.url(path),
        "-N",
        "-H",
        key_header,
        "-H",
        "x-mock-chunks: 20",
        "-H",
        "x-mock-usage-if-asked: 1",
        "-d",
        body,
    ]);
    (direct, via, mock)
}

#[test]
fn openai_stream_is_byte_identical_to_the_provider() {
    let body =
        r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let (direct, via, mock) = stream_both_ways("/v1/chat/completions", &auth(AGENT_KEY), body);
    assert_eq!(via.status, 200, "{}", via.text());
    assert_eq!(via.header("content-type"), Some("text/event-stream"));
    assert_eq!(
        via.header("content-length"),
        None,
        "a stream must not get a length"
    );
    assert!(via.text().ends_with("data: [DONE]\n\n"));
    assert_eq!(via.text().matches("\"content\":").count(), 21);
    // The gateway asked the provider for the usage (a priced model, to
    // settle on it), and kept the usage chunk the agent did not ask for.
    assert!(!via.text().contains("\"usage\""), "no usage chunk");
    assert_eq!(
        direct.body, via.body,
        "SSE bytes differ from calling the mock directly"
    );
    let sent: serde_json::Value =
        serde_json::from_str(mock.last_request()["body"].as_str().unwrap()).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true, "{sent}");
    assert_eq!(
        recorded_header(&mock.last_request(), "authorization"),
        Some(format!("Bearer {UPSTREAM_KEY}").as_str())
    );
}

#[test]
fn anthropic_stream_is_byte_identical_and_uses_anthropic_auth() {
    let body = r#"{"model":"claude-3-5-haiku-latest","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let (direct, via, mock) =
        stream_both_ways("/v1/messages", &format!("x-api-key: {AGENT_KEY}"), body);
    assert_eq!(via.status, 200, "{}", via.text());
    assert_eq!(via.header("content-type"), Some("text/event-stream"));
    assert!(via.text().starts_with("event: message_start\n"));
    assert!(via
        .text()
        .ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
    assert_eq!(direct.body, via.body);
    let seen = mock.last_request();
    assert_eq!(recorded_header(&seen, "x-api-key"), Some(UPSTREAM_KEY));
    assert_eq!(
        recorded_header(&seen, "anthropic-version"),
        Some("2023-06-01")
    );
    assert_eq!(recorded_header(&seen, "authorization"), None);
}

#[test]
fn x_agent_token_also_authenticates_and_is_stripped() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let r = curl(&[
        &gw.url("/v1/embeddings"),
        "-H",
        &format!("x-agent-token: {AGENT_KEY}"),
        "-d",
        r#"{"model":"text-embedding-3-small","input":["a","b"]}"#,
    ]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["data"].as_array().unwrap().len(), 2);
    let seen = mock.last_request();
    assert_eq!(recorded_header(&seen, "x-agent-token"), None);
    assert!(!seen["headers"].to_string().contains(AGENT_KEY));
}

#[test]
fn streams_are_delivered_as_they_arrive() {
    // 5 chunks 300 ms apart: the first bytes must reach the client long
    // before the stream ends. Measured as order of events, not a threshold:
    // curl's time to first byte is less than half its total time.
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "-N",
            "-o",
            "/dev/null",
            "-w",
            "%{time_starttransfer} %{time_total}",
        ])
        .arg(gw.url("/v1/chat/completions"))
        .args([
            "-H",
            &auth(AGENT_KEY),
            "-H",
            "x-mock-chunks: 5",
            "-H",
            "x-mock-chunk-delay-ms: 300",
        ])
        .args([
            "-d",
            r#"{"model":"gpt-4o-mini","stream":true,"messages":[]}"#,
        ])
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    let (ttfb, total): (f64, f64) = {
        let mut it = s.split_whitespace().map(|x| x.parse::<f64>().unwrap());
        (it.next().unwrap(), it.next().unwrap())
    };
    assert!(total >= 1.5, "the mock paces 8 events 300 ms apart: {s}");
    assert!(
        ttfb < total / 2.0,
        "response was buffered: ttfb {ttfb}s of {total}s"
    );
}

#[test]
fn models_lists_only_what_the_agent_may_use() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let r = curl(&[&gw.url("/v1/models"), "-H", &auth(AGENT_KEY)]);
    assert_eq!(r.status, 200);
    let ids: Vec<String> = r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["gpt-4o-mini", "text-embedding-3-small"]);
    let r = curl(&[&gw.url("/v1/models"), "-H", &auth(NARROW_KEY)]);
    // The narrow agent may only call chat completions.
    r.assert_gateway_error(403, "path_not_allowed");
    assert!(
        mock.requests().is_empty(),
        "models is answered by the gateway"
    );
}

#[test]
fn provider_errors_pass_through_unchanged() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let r = post_chat(
        &gw,
        AGENT_KEY,
        &["-H", "x-mock-status: 429", "-H", "x-mock-retry-after: 7"],
    );
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("7"));
    assert_eq!(
        r.header("x-loopgate-error"),
        None,
        "a provider error is not a gateway error"
    );
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
}

#[test]
fn unreachable_provider_is_502_and_slow_provider_is_504() {
    let mock = Mock::start();
    let closed = free_port();
    let yaml = default_config(&mock)
        .replace(&format!("base_url: {}\n    api_key_env: LOOPGATE_TEST_UPSTREAM_KEY\n    timeouts: {{ connect_ms: 1000, read_ms: 5000", mock.url()),
                 &format!("base_url: http://127.0.0.1:{closed}\n    api_key_env: LOOPGATE_TEST_UPSTREAM_KEY\n    timeouts: {{ connect_ms: 1000, read_ms: 5000"));
    assert!(yaml.contains(&closed.to_string()));
    let gw = Gateway::start(&yaml);
    let r = post_chat(&gw, AGENT_KEY, &[]);
    r.assert_gateway_error(502, "upstream_unreachable");
    assert_eq!(r.json()["error"]["retryable"], true);

    let yaml = default_config(&mock).replace("read_ms: 5000", "read_ms: 300");
    let gw = Gateway::start(&yaml);
    let r = post_chat(&gw, AGENT_KEY, &["-H", "x-mock-latency-ms: 3000"]);
    r.assert_gateway_error(504, "upstream_timeout");
}

#[test]
fn upstream_connections_are_reused() {
    // Two threads: a work-stealing runtime. One thread: a single-threaded
    // runtime (see server.rs); both must keep one pool.
    for threads in ["threads: 2", "threads: 1"] {
        let mock = Mock::start();
        let gw = Gateway::start(&default_config(&mock).replace("threads: 2", threads));
        assert_upstream_reuse(&mock, &gw, threads);
    }
}

fn assert_upstream_reuse(mock: &Mock, gw: &Gateway, threads: &str) {
    for _ in 0..20 {
        let r = post_chat(gw, AGENT_KEY, &[]);
        assert_eq!(r.status, 200);
    }
    // Each fresh curl is a new downstream connection; upstream the gateway
    // keeps a pool. The mock counts the connections it accepted.
    let r = curl(&[&format!("{}/_mock/stats", mock.url())]);
    let conns = r.json()["connections"].as_u64().unwrap();
    assert!(
        conns <= 4,
        "{threads}: 20 requests used {conns} upstream connections"
    );
}

#[test]
fn unreachable_provider_on_the_large_body_path_is_502_too() {
    let mock = Mock::start();
    let closed = free_port();
    let yaml = default_config(&mock).replacen(
        &format!("base_url: {}", mock.url()),
        &format!("base_url: http://127.0.0.1:{closed}"),
        1,
    );
    let gw = Gateway::start(&yaml);
    let mut body = br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":""#.to_vec();
    body.extend(std::iter::repeat_n(b'x', 200 * 1024));
    body.extend_from_slice(br#""}]}"#);
    let r = post_json(&gw, AGENT_KEY, "/v1/chat/completions", &[], &body);
    r.assert_gateway_error(502, "upstream_unreachable");
}

#[test]
fn a_stream_the_provider_breaks_mid_way_ends_without_hurting_the_gateway() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let out = std::process::Command::new("curl")
        .args(["-s", "-N", "-m", "10"])
        .arg(gw.url("/v1/chat/completions"))
        .args([
            "-H",
            &auth(AGENT_KEY),
            "-H",
            "x-mock-reset-after: 3",
            "-H",
            "x-mock-chunks: 10",
        ])
        .args([
            "-d",
            r#"{"model":"gpt-4o-mini","stream":true,"messages":[]}"#,
        ])
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    // The three events sent before the break arrived untouched, then the
    // gateway ended the stream with an error event instead of a silent cut.
    let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 4, "{body}");
    assert!(events[..3]
        .iter()
        .all(|e| e.contains("chat.completion.chunk")));
    let err: serde_json::Value =
        serde_json::from_str(events[3].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(err["error"]["code"], "upstream_error");
    assert_eq!(err["error"]["retryable"], true);
    assert!(!body.contains("[DONE]"));
    assert!(out.status.success(), "the stream is ended properly");
    // The gateway is fine afterwards.
    let r = post_chat(&gw, AGENT_KEY, &[]);
    assert_eq!(r.status, 200);
}
