//! Breakers, fallback and retries, driven by the mock's fault injection.

use loopgate_tests::*;
use std::time::Duration;

const B_KEY: &str = "agent-b-key-0007";

/// One route `gpt-4o-mini` over `targets` (provider names), with the
/// providers given as `(name, base_url, breaker settings)`.
fn config(providers: &[(&str, String, &str)], targets: &str) -> String {
    let mut yaml = String::from("listen: 127.0.0.1:{PORT}\nadmin: { listen: \"127.0.0.1:{ADMIN_PORT}\" }\nthreads: 2\nproviders:\n");
    for (name, url, breaker) in providers {
        yaml += &format!(
            "  {name}:\n    kind: openai_compatible\n    base_url: \"{url}\"\n    api_key_env: LOOPGATE_TEST_UPSTREAM_KEY\n    timeouts: {{ connect_ms: 1000, read_ms: 2000 }}\n    breaker: {{ {breaker} }}\n"
        );
    }
    yaml += &format!(
        // A large filler body below is far past gpt-4o-mini's real
        // context window: the window guard is tested in prices.rs.
        "models:\n  gpt-4o-mini: {{ context_window: 1000000000 }}\nroutes:\n  - models: [gpt-4o-mini]\n    targets: {targets}\nagents:\n  a:\n    key_sha256: \"{}\"\n    models: [gpt-4o-mini]\n  b:\n    key_sha256: \"{}\"\n    models: [gpt-4o-mini]\n",
        sha256_hex(AGENT_KEY.as_bytes()),
        sha256_hex(B_KEY.as_bytes())
    );
    yaml
}

#[test]
fn a_500_storm_opens_the_breaker_then_exactly_one_probe_closes_it() {
    let mock = Mock::start();
    // The probe below is held 2.5 s at the mock, so that the three refused
    // requests surely fall inside it on a loaded machine; the read timeout
    // is raised to let it answer.
    let gw = Gateway::start(
        &config(
            &[("p", mock.url(), "consecutive_failures: 3, open_ms: 1500")],
            "[ { provider: p } ]",
        )
        .replace("read_ms: 2000", "read_ms: 6000"),
    );
    for _ in 0..3 {
        // The only target: its 500 passes through unchanged.
        let r = post_chat(&gw, AGENT_KEY, &["-H", "x-mock-status: 500"]);
        assert_eq!(r.status, 500);
        assert_eq!(r.header("x-loopgate-error"), None);
    }
    assert_eq!(mock.received(), 3);
    // Open: refused at once, nothing reaches the provider.
    for _ in 0..5 {
        let r = post_chat(&gw, AGENT_KEY, &[]);
        r.assert_gateway_error(503, "circuit_open");
        assert_eq!(r.json()["error"]["retryable"], true);
        let after: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=2).contains(&after), "{after}");
    }
    assert_eq!(
        mock.received(),
        3,
        "the provider was called while the circuit was open"
    );

    std::thread::sleep(Duration::from_millis(1600));
    // Half-open: one slow probe goes through; concurrent requests are refused.
    let url = gw.url("/v1/chat/completions");
    let key = auth(AGENT_KEY);
    let probe = std::thread::spawn(move || {
        curl(&[
            &url,
            "-H",
            &key,
            "-H",
            "x-mock-latency-ms: 2500",
            "-d",
            CHAT,
        ])
    });
    assert!(eventually(5, || mock.received() == 4));
    for _ in 0..3 {
        post_chat(&gw, AGENT_KEY, &[]).assert_gateway_error(503, "circuit_open");
    }
    assert_eq!(mock.received(), 4, "exactly one probe reached the provider");
    assert_eq!(probe.join().unwrap().status, 200);
    // The probe succeeded: closed again.
    assert_eq!(post_chat(&gw, AGENT_KEY, &[]).status, 200);
    assert_eq!(mock.received(), 5);
}

#[test]
fn client_errors_never_trip_the_breaker() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(
        &[(
            "p",
            mock.url(),
            "consecutive_failures: 2, failure_rate: 0.1, min_requests: 2",
        )],
        "[ { provider: p } ]",
    ));
    for status in ["400", "401", "404", "422", "400", "400"] {
        assert_eq!(
            post_chat(&gw, AGENT_KEY, &["-H", &format!("x-mock-status: {status}")]).status,
            status.parse::<u16>().unwrap()
        );
    }
    assert_eq!(post_chat(&gw, AGENT_KEY, &[]).status, 200);
}

#[test]
fn a_refused_connection_falls_back_to_the_next_target_with_headers() {
    let mock = Mock::start();
    let dead = format!("http://127.0.0.1:{}", free_port());
    let gw = Gateway::start(&config(
        &[("primary", dead, ""), ("secondary", mock.url(), "")],
        "[ { provider: primary, weight: 1000000 }, { provider: secondary, weight: 1 } ]",
    ));
    let r = post_chat(&gw, AGENT_KEY, &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-loopgate-provider"), Some("secondary"));
    assert_eq!(r.header("x-loopgate-fallback"), Some("primary"));
    // A large body falls back intact too.
    let mut body = br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":""#.to_vec();
    body.extend(std::iter::repeat_n(b'z', 300 * 1024));
    body.extend_from_slice(br#""}]}"#);
    let r = post_json(&gw, AGENT_KEY, "/v1/chat/completions", &[], &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-loopgate-fallback"), Some("primary"));
    assert_eq!(mock.last_request()["body_sha256"], sha256_hex(&body));
}

#[test]
fn a_5xx_before_the_first_byte_falls_back_and_the_last_answer_passes_through() {
    let failing = Mock::start_with(&["--status", "503"]);
    let healthy = Mock::start();
    let gw = Gateway::start(&config(
        &[
            ("primary", failing.url(), ""),
            ("secondary", healthy.url(), ""),
        ],
        "[ { provider: primary, weight: 1000000 }, { provider: secondary, weight: 1 } ]",
    ));
    let r = post_chat(&gw, AGENT_KEY, &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-loopgate-provider"), Some("secondary"));
    assert_eq!(r.header("x-loopgate-fallback"), Some("primary"));
    assert_eq!(failing.received(), 1);
    // Both failing: the last provider's own 503 goes back unchanged.
    let gw = Gateway::start(&config(
        &[
            ("primary", failing.url(), ""),
            ("secondary", failing.url(), ""),
        ],
        "[ { provider: primary }, { provider: secondary } ]",
    ));
    let r = post_chat(&gw, AGENT_KEY, &[]);
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["message"], "injected fault");
    assert!(r.header("x-loopgate-fallback").is_some());
}

#[test]
fn a_429_with_retry_after_takes_the_target_out_of_rotation() {
    let limited = Mock::start_with(&["--status", "429", "--retry-after", "30"]);
    let healthy = Mock::start();
    let gw = Gateway::start(&config(
        &[
            ("primary", limited.url(), ""),
            ("secondary", healthy.url(), ""),
        ],
        "[ { provider: primary, weight: 1000000 }, { provider: secondary, weight: 1 } ]",
    ));
    for _ in 0..5 {
        let r = post_chat(&gw, AGENT_KEY, &[]);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-loopgate-provider"), Some("secondary"));
    }
    assert_eq!(
        limited.received(),
        1,
        "the rate-limited provider was asked again before Retry-After"
    );
}

#[test]
fn a_mid_stream_reset_is_an_error_event_and_a_breaker_failure() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(
        &[("p", mock.url(), "consecutive_failures: 1, open_ms: 60000")],
        "[ { provider: p } ]",
    ));
    let r = curl(&[
        &gw.url("/v1/chat/completions"),
        "-N",
        "-H",
        &auth(AGENT_KEY),
        "-H",
        "x-mock-reset-after: 2",
        "-d",
        r#"{"model":"gpt-4o-mini","stream":true,"messages":[]}"#,
    ]);
    assert_eq!(r.status, 200);
    assert!(r.text().trim_end().ends_with("}"), "{}", r.text());
    assert!(r.text().contains(r#"data: {"error":"#), "{}", r.text());
    post_chat(&gw, AGENT_KEY, &[]).assert_gateway_error(503, "circuit_open");
}

#[test]
fn isolation_by_agent_keeps_agent_b_served_while_a_is_cut_off() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(
        &[(
            "p",
            mock.url(),
            "consecutive_failures: 2, open_ms: 60000, isolate_by: agent",
        )],
        "[ { provider: p } ]",
    ));
    for _ in 0..2 {
        assert_eq!(
            post_chat(&gw, AGENT_KEY, &["-H", "x-mock-status: 502"]).status,
            502
        );
    }
    post_chat(&gw, AGENT_KEY, &[]).assert_gateway_error(503, "circuit_open");
    assert_eq!(
        post_chat(&gw, B_KEY, &[]).status,
        200,
        "agent B must not be cut off by A's failures"
    );
}

#[test]
fn an_active_probe_tests_half_open_instead_of_live_traffic() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(
        &[(
            "p",
            mock.url(),
            "consecutive_failures: 1, open_ms: 1500, probe: { path: /v1/models }",
        )],
        "[ { provider: p } ]",
    ));
    assert_eq!(
        post_chat(&gw, AGENT_KEY, &["-H", "x-mock-status: 500"]).status,
        500
    );
    post_chat(&gw, AGENT_KEY, &[]).assert_gateway_error(503, "circuit_open");
    // The gateway's own GET /v1/models closes it; no agent request was the probe.
    assert!(eventually(5, || mock
        .requests()
        .iter()
        .any(|r| r["path"] == "/v1/models")));
    assert!(eventually(5, || post_chat(&gw, AGENT_KEY, &[]).status == 200));
    let posts = mock
        .requests()
        .iter()
        .filter(|r| r["method"] == "POST")
        .count();
    assert_eq!(
        posts, 2,
        "only the failing request and the one after closing went upstream"
    );
    let probe = mock
        .requests()
        .into_iter()
        .find(|r| r["path"] == "/v1/models")
        .unwrap();
    assert_eq!(
        recorded_header(&probe, "authorization"),
        Some(format!("Bearer {UPSTREAM_KEY}").as_str())
    );
}

#[test]
fn targets_can_rename_the_model() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(
        &[("p", mock.url(), "")],
        "[ { provider: p, model: local-llama } ]",
    ));
    let r = post_chat(&gw, AGENT_KEY, &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["model"], "local-llama");
    let renamed = CHAT.replace("gpt-4o-mini", "local-llama");
    let seen = mock.last_request();
    assert_eq!(seen["body_sha256"], sha256_hex(renamed.as_bytes()));
    assert_eq!(
        recorded_header(&seen, "content-length"),
        Some(renamed.len().to_string().as_str())
    );
}

#[test]
fn a_first_byte_timeout_falls_back() {
    let slow = Mock::start_with(&["--latency-ms", "5000"]);
    let healthy = Mock::start();
    let gw = Gateway::start(&config(
        &[("slow", slow.url(), ""), ("fast", healthy.url(), "")],
        "[ { provider: slow, weight: 1000000 }, { provider: fast, weight: 1 } ]",
    ));
    let r = post_chat(&gw, AGENT_KEY, &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-loopgate-provider"), Some("fast"));
    assert_eq!(r.header("x-loopgate-fallback"), Some("slow"));
}

#[test]
fn the_retry_budget_bounds_attempts() {
    let mocks: Vec<Mock> = (0..3)
        .map(|_| Mock::start_with(&["--status", "503"]))
        .collect();
    let mut yaml = config(
        &[
            ("m0", mocks[0].url(), ""),
            ("m1", mocks[1].url(), ""),
            ("m2", mocks[2].url(), ""),
        ],
        "[ { provider: m0 }, { provider: m1 }, { provider: m2 } ]",
    );
    yaml = yaml.replace("agents:\n", "    retry: { max_attempts: 2 }\nagents:\n");
    let gw = Gateway::start(&yaml);
    let r = post_chat(&gw, AGENT_KEY, &[]);
    assert_eq!(r.status, 503, "the last provider's own answer");
    let total: u64 = mocks.iter().map(Mock::received).sum();
    assert_eq!(total, 2, "max_attempts: 2 allows two upstream calls in all");
}

/// Open descriptor numbers of process `pid`.
fn open_fds(pid: u32) -> std::collections::BTreeSet<u32> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read /proc/<pid>/fd")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Sets process `pid`'s open-file limits with util-linux's `prlimit`.
fn set_nofile(pid: u32, soft: u64, hard: u64) {
    let out = std::process::Command::new("prlimit")
        .args([&format!("--pid={pid}"), &format!("--nofile={soft}:{hard}")])
        .output()
        .expect("run prlimit (util-linux)");
    assert!(
        out.status.success(),
        "prlimit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_gateways_own_socket_shortage_is_not_the_providers_failure() {
    let mock = Mock::start();
    // One failure would open this breaker for a minute.
    let gw = Gateway::start(&config(
        &[("p", mock.url(), "consecutive_failures: 1, open_ms: 60000")],
        "[ { provider: p } ]",
    ));
    let pid = gw.pid();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let (soft, hard): (u64, u64) = limits
        .lines()
        .find_map(|l| {
            let v: Vec<&str> = l
                .strip_prefix("Max open files")?
                .split_whitespace()
                .collect();
            Some((v[0].parse().ok()?, v[1].parse().ok()?))
        })
        .expect("open-file limits");
    // Leave exactly one free descriptor number below the limit: the agent's
    // connection takes it, and the upstream socket finds none. (No request
    // went upstream yet, so no pooled connection can be reused.) Retried
    // until the gateway's descriptors hold still across the change.
    let mut limited = false;
    for _ in 0..50 {
        let before = open_fds(pid);
        let mut free = (0u32..).filter(|n| !before.contains(n));
        let (_, second) = (free.next().unwrap(), free.next().unwrap());
        set_nofile(pid, u64::from(second), hard);
        std::thread::sleep(Duration::from_millis(100));
        if open_fds(pid) == before {
            limited = true;
            break;
        }
        set_nofile(pid, soft, hard);
    }
    assert!(limited, "the gateway's descriptors never held still");

    // (The second waits out Pingora's pause after a refused accept, while
    // the first one's descriptor is closed.)
    for _ in 0..2 {
        let r = post_chat(&gw, AGENT_KEY, &[]);
        r.assert_gateway_error(503, "gateway_overloaded");
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.json()["error"]["retryable"], true);
    }
    assert_eq!(
        mock.received(),
        0,
        "nothing could have reached the provider"
    );

    // Descriptors back: the provider's breaker never counted the shortage,
    // so the next request goes straight through.
    set_nofile(pid, soft, hard);
    let r = post_chat(&gw, AGENT_KEY, &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-loopgate-provider"), Some("p"));
    assert_eq!(mock.received(), 1);
}

/// With the circuit open, a body past Pingora's 64 KiB retry buffer (the
/// large-body subrequest) gets the same answer as a small one: 503
/// `circuit_open` with `Retry-After`, never a 500. The subrequest answers
/// and reports its failure at once, so the answer must not depend on which
/// of the two the main request sees first; many requests in parallel give
/// both orders their chance.
#[test]
fn an_open_circuit_answers_large_and_small_bodies_alike() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(
        &[("p", mock.url(), "consecutive_failures: 1, open_ms: 60000")],
        "[ { provider: p } ]",
    ));
    assert_eq!(
        post_chat(&gw, AGENT_KEY, &["-H", "x-mock-status: 500"]).status,
        500
    );
    let mut large = br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":""#.to_vec();
    large.extend(std::iter::repeat_n(b'z', 80 * 1024));
    large.extend_from_slice(br#""}]}"#);
    let answers: Vec<(bool, Resp)> = std::thread::scope(|s| {
        let sent: Vec<_> = (0..40)
            .flat_map(|_| [true, false])
            .map(|big| {
                let (gw, large) = (&gw, &large);
                s.spawn(move || {
                    let body = if big {
                        large.as_slice()
                    } else {
                        CHAT.as_bytes()
                    };
                    let path = "/v1/chat/completions";
                    (big, post_json(gw, AGENT_KEY, path, &[], body))
                })
            })
            .collect();
        sent.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (big, r) in &answers {
        r.assert_gateway_error(503, "circuit_open");
        let after: u64 = r
            .header("retry-after")
            .unwrap_or_else(|| panic!("large: {big}: no Retry-After: {r:?}"))
            .parse()
            .unwrap();
        assert!(after >= 1, "{after}");
    }
    assert_eq!(mock.received(), 1, "nothing reached the open provider");
}
