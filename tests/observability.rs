//! Metrics, the JSON access log and the admin API, as an operator uses them.

use loopgate_tests::*;
use serde_json::Value;
use std::time::Duration;

const PROMPT: &str = "confidential-prompt-text-4471";

fn config(mock: &Mock, dir: &std::path::Path, admin_extra: &str) -> String {
    format!(
        r#"
{head}
admin: {{ listen: "127.0.0.1:{{ADMIN_PORT}}", token_env: LOOPGATE_TEST_ADMIN_TOKEN{admin_extra} }}
access_log: {{ path: "{log}" }}
agents:
  tester:
    key_sha256: "{agent}"
    models: [gpt-4o-mini]
"#,
        head = config_head(
            mock,
            "gpt-4o-mini",
            "breaker: { consecutive_failures: 2, open_ms: 60000 }"
        ),
        log = dir.join("access.log").display(),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
    )
}

fn chat(gw: &Gateway, extra: &[&str], body: &str) -> Resp {
    post_json(gw, AGENT_KEY, "/v1/chat/completions", extra, body)
}

fn admin(gw: &Gateway, method: &str, path: &str, token: Option<&str>) -> Resp {
    let url = gw.admin_url(path);
    let bearer = token.map(|t| format!("Authorization: Bearer {t}"));
    let mut args = vec![url.as_str(), "-X", method];
    if let Some(b) = &bearer {
        args.extend(["-H", b.as_str()]);
    }
    curl(&args)
}

fn body(model: &str, stream: bool) -> String {
    format!(
        r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"{PROMPT}"}}]}}"#
    )
}

#[test]
fn metrics_move_with_traffic() {
    let mock = Mock::start();
    let dir = scratch_dir("obs");
    let gw = Gateway::start(&config(&mock, &dir, ""));
    let denied = r#"loopgate_denials_total{code="model_not_allowed"}"#;
    let before = gw.metric(denied);
    assert_eq!(chat(&gw, &[], &body("gpt-4o", false)).status, 403);
    assert_eq!(gw.metric(denied), before + 1.0);

    let tokens = r#"loopgate_tokens_total{agent="tester",kind="completion",model="gpt-4o-mini"}"#;
    let r = chat(
        &gw,
        &["-N", "-H", "x-mock-chunks: 37"],
        &body("gpt-4o-mini", true),
    );
    assert!(r.text().ends_with("data: [DONE]\n\n"));
    assert!(
        eventually(5, || gw.metric(tokens) == 37.0),
        "{}",
        gw.metric(tokens)
    );
    assert_eq!(gw.metric("loopgate_active_streams"), 0.0);
    let ok = r#"loopgate_requests_total{agent="tester",decision="allow",model="gpt-4o-mini",provider="oa",status_class="2xx"}"#;
    assert_eq!(gw.metric(ok), 1.0);
    assert!(gw.metric("loopgate_gateway_overhead_seconds_count") >= 2.0);
    assert_eq!(
        gw.metric(r#"loopgate_upstream_ttfb_seconds_count{provider="oa"}"#),
        1.0
    );
    // Unknown models and agents do not mint label values.
    let _ = chat(&gw, &[], &body("model-xyz-123", false));
    let _ = curl(&[
        &gw.url("/v1/chat/completions"),
        "-H",
        "Authorization: Bearer nope",
        "-d",
        "{}",
    ]);
    let page = curl(&[&gw.admin_url("/metrics")]).text();
    assert!(!page.contains("model-xyz-123") && !page.contains("nope"));
}

#[test]
fn access_log_lines_are_json_with_every_field_and_no_secrets() {
    let mock = Mock::start();
    let dir = scratch_dir("obs");
    let gw = Gateway::start(&config(&mock, &dir, ""));
    let task = [
        "-H",
        "x-agent-task-id: task-9",
        "-H",
        "x-agent-call-id: call-2",
        "-H",
        "x-agent-tool-name: search",
    ];
    assert_eq!(chat(&gw, &task, &body("gpt-4o-mini", false)).status, 200);
    assert_eq!(chat(&gw, &["-N"], &body("gpt-4o-mini", true)).status, 200);
    assert_eq!(chat(&gw, &[], &body("gpt-4o", false)).status, 403);
    let _ = admin(&gw, "GET", "/admin/config", Some(ADMIN_TOKEN));
    let path = dir.join("access.log");
    assert!(eventually(5, || std::fs::read_to_string(&path)
        .is_ok_and(|t| t.lines().count() >= 3)));
    let text = std::fs::read_to_string(&path).unwrap();
    for secret in [
        AGENT_KEY,
        UPSTREAM_KEY,
        ADMIN_TOKEN,
        &sha256_hex(AGENT_KEY.as_bytes()),
        PROMPT,
    ] {
        assert!(!text.contains(secret), "access log contains {secret:?}");
    }
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines.len(), 3, "one line per request");
    for l in &lines {
        for field in [
            "time",
            "request_id",
            "agent_id",
            "task_id",
            "call_id",
            "tool_name",
            "method",
            "path",
            "model",
            "provider",
            "breaker_state",
            "decision",
            "code",
            "would_deny",
            "upstream_status",
            "status",
            "latency_ms",
            "ttfb_ms",
            "overhead_us",
            "bytes_in",
            "bytes_out",
            "prompt_tokens",
            "completion_tokens",
            "fallback_used",
            "fallback_to",
        ] {
            assert!(l.get(field).is_some(), "missing {field} in {l}");
        }
    }
    let ok = &lines[0];
    assert_eq!(
        (
            ok["agent_id"].as_str(),
            ok["task_id"].as_str(),
            ok["tool_name"].as_str()
        ),
        (Some("tester"), Some("task-9"), Some("search"))
    );
    assert_eq!(
        (
            ok["decision"].as_str(),
            ok["status"].as_u64(),
            ok["provider"].as_str()
        ),
        (Some("allow"), Some(200), Some("oa"))
    );
    assert_eq!(ok["breaker_state"], "closed");
    assert!(ok["completion_tokens"].as_u64().unwrap() > 0);
    assert!(ok["time"].as_str().unwrap().ends_with('Z'));
    assert_eq!(lines[1]["stream"], true);
    assert!(lines[1]["bytes_out"].as_u64().unwrap() > 500);
    let denied = &lines[2];
    assert_eq!(
        (
            denied["decision"].as_str(),
            denied["code"].as_str(),
            denied["status"].as_u64()
        ),
        (Some("deny"), Some("model_not_allowed"), Some(403))
    );
}

#[test]
fn admin_api_needs_the_token_and_shows_no_secret() {
    let mock = Mock::start();
    let dir = scratch_dir("obs");
    let gw = Gateway::start(&config(&mock, &dir, ""));
    for (method, path) in [
        ("GET", "/admin/breakers"),
        ("GET", "/admin/config"),
        ("POST", "/admin/reload"),
        ("POST", "/admin/breakers/oa/reset"),
    ] {
        assert_eq!(
            admin(&gw, method, path, None).status,
            401,
            "{path} without token"
        );
        assert_eq!(
            admin(&gw, method, path, Some("wrong")).status,
            401,
            "{path} with a wrong token"
        );
    }
    // Open by default; the proxy port never serves the admin API.
    assert_eq!(admin(&gw, "GET", "/metrics", None).status, 200);
    assert_eq!(admin(&gw, "GET", "/health", None).status, 200);
    assert_eq!(
        curl(&[
            &gw.url("/admin/breakers"),
            "-H",
            &format!("Authorization: Bearer {ADMIN_TOKEN}")
        ])
        .status,
        404
    );

    let r = admin(&gw, "GET", "/admin/config", Some(ADMIN_TOKEN));
    assert_eq!(r.status, 200);
    let text = r.text();
    for secret in [UPSTREAM_KEY, ADMIN_TOKEN, &sha256_hex(AGENT_KEY.as_bytes())] {
        assert!(!text.contains(secret), "/admin/config shows {secret:?}");
    }
    let v = r.json();
    assert_eq!(v["providers"][0]["api_key"], "[redacted]");
    assert_eq!(v["agents"][0]["name"], "tester");
    assert_eq!(v["admin"]["token"], "[redacted]");

    // Metrics can be closed too.
    let gw = Gateway::start(&config(&mock, &dir, ", open: [health]"));
    assert_eq!(admin(&gw, "GET", "/metrics", None).status, 401);
    assert_eq!(admin(&gw, "GET", "/metrics", Some(ADMIN_TOKEN)).status, 200);
    assert_eq!(admin(&gw, "GET", "/health", None).status, 200);
}

#[test]
fn breakers_are_inspected_and_reset_by_an_operator() {
    let mock = Mock::start();
    let dir = scratch_dir("obs");
    let gw = Gateway::start(&config(&mock, &dir, ""));
    for _ in 0..2 {
        assert_eq!(
            chat(
                &gw,
                &["-H", "x-mock-status: 500"],
                &body("gpt-4o-mini", false)
            )
            .status,
            500
        );
    }
    chat(&gw, &[], &body("gpt-4o-mini", false)).assert_gateway_error(503, "circuit_open");
    let b = admin(&gw, "GET", "/admin/breakers", Some(ADMIN_TOKEN)).json();
    let oa = &b["breakers"][0];
    assert_eq!(
        (oa["key"].as_str(), oa["state"].as_str()),
        (Some("oa"), Some("open"))
    );
    assert!(oa["open_remaining_ms"].as_u64().unwrap() > 50_000);
    assert_eq!(gw.metric(r#"loopgate_breaker_state{key="oa"}"#), 1.0);
    assert_eq!(
        gw.metric(r#"loopgate_breaker_transitions_total{from="closed",key="oa",to="open"}"#),
        1.0
    );

    assert_eq!(
        admin(&gw, "POST", "/admin/breakers/oa/reset", Some(ADMIN_TOKEN)).status,
        200
    );
    assert_eq!(
        admin(&gw, "POST", "/admin/breakers/nope/reset", Some(ADMIN_TOKEN)).status,
        404
    );
    assert_eq!(chat(&gw, &[], &body("gpt-4o-mini", false)).status, 200);
    assert_eq!(gw.metric(r#"loopgate_breaker_state{key="oa"}"#), 0.0);
}

#[test]
fn headers_no_request_could_send_are_refused_at_load() {
    let mock = Mock::start();
    let dir = scratch_dir("obs");
    let gw = Gateway::start(&config(&mock, &dir, ""));
    let good = std::fs::read_to_string(&gw.config_path).unwrap();
    let reload_with = |text: String| {
        std::fs::write(&gw.config_path, text).unwrap();
        admin(&gw, "POST", "/admin/reload", Some(ADMIN_TOKEN))
    };

    // A provider key with a control byte: refused, naming the variable and
    // never the value; the running config keeps answering.
    let r = reload_with(good.replace("LOOPGATE_TEST_UPSTREAM_KEY", "LOOPGATE_TEST_BAD_KEY"));
    assert_eq!(r.status, 422, "{}", r.text());
    let errors = r.json()["errors"].to_string();
    assert!(
        errors.contains(
            "gateway.yaml: providers.oa.api_key_env: the key holds characters an HTTP header cannot carry"
        ),
        "{errors}"
    );
    assert!(
        !r.text().contains("secret-31"),
        "the key leaked: {}",
        r.text()
    );
    let ok = chat(&gw, &[], &body("gpt-4o-mini", false));
    assert_eq!(ok.status, 200);
    assert_eq!(ok.header("x-loopgate-provider"), Some("oa"));

    // A provider name that cannot be sent in x-loopgate-provider.
    let r = reload_with(
        good.replace("  oa:", "  \"o\\x01a\":")
            .replace("provider: oa", "provider: \"o\\x01a\""),
    );
    assert_eq!(r.status, 422, "{}", r.text());
    let errors = r.json()["errors"].to_string();
    assert!(
        errors.contains("an HTTP header cannot carry (it is sent in x-loopgate-provider)"),
        "{errors}"
    );
    assert_eq!(chat(&gw, &[], &body("gpt-4o-mini", false)).status, 200);

    // `loopgate check` says the same and exits 1.
    let (code, stderr) = check_config(&gw.config_path);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("the name holds characters an HTTP header cannot carry"),
        "{stderr}"
    );
}

#[test]
fn admin_reload_reports_errors_and_keeps_the_old_config() {
    let mock = Mock::start();
    let dir = scratch_dir("obs");
    let gw = Gateway::start(&config(&mock, &dir, ""));
    let good = std::fs::read_to_string(&gw.config_path).unwrap();
    std::fs::write(
        &gw.config_path,
        good.replace(
            "models: [gpt-4o-mini]\n",
            "models: [gpt-4o-mini]\n    bogus: 1\n",
        ),
    )
    .unwrap();
    let r = admin(&gw, "POST", "/admin/reload", Some(ADMIN_TOKEN));
    assert_eq!(r.status, 422);
    let errors = r.json()["errors"].to_string();
    assert!(
        errors.contains("gateway.yaml: routes[0].bogus: unknown field `bogus`"),
        "{errors}"
    );
    assert_eq!(chat(&gw, &[], &body("gpt-4o-mini", false)).status, 200);
    std::fs::write(&gw.config_path, &good).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        admin(&gw, "POST", "/admin/reload", Some(ADMIN_TOKEN)).status,
        200
    );
}
