//! Agent guards over the mock: loops stopped with evidence, budgets enforced
//! before anything goes upstream (and mid-stream), the watchdog degrading
//! and stopping tasks.

use loopgate_tests::*;
use serde_json::Value;

fn config(mock: &Mock, guards: &str) -> String {
    format!(
        r#"
{head}
admin: {{ listen: "127.0.0.1:{{ADMIN_PORT}}" }}
agents:
  tester:
    key_sha256: "{agent}"
    models: [gpt-4o, gpt-4o-mini]
{guards}
"#,
        head = config_head(mock, "gpt-4o, gpt-4o-mini", ""),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
    )
}

fn call(gw: &Gateway, task: Option<&str>, extra: &[&str], body: &str) -> Resp {
    let task_h = task.map(|t| format!("x-agent-task-id: {t}"));
    let mut args = vec![];
    if let Some(t) = &task_h {
        args.extend(["-H", t.as_str()]);
    }
    args.extend_from_slice(extra);
    post_json(gw, AGENT_KEY, "/v1/chat/completions", &args, body)
}

fn ask(q: &str) -> String {
    format!(
        r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"plan"}},{{"role":"assistant","content":"calling search"}},{{"role":"tool","content":"{q}"}}],"user":"u-{q}"}}"#
    )
}

fn posts(mock: &Mock) -> usize {
    mock.requests()
        .iter()
        .filter(|r| r["method"] == "POST")
        .count()
}

#[test]
fn a_task_repeating_itself_is_stopped_on_the_third_repeat_with_a_snapshot() {
    let mock = Mock::start();
    let dir = scratch_dir("loops");
    let gw = Gateway::start(&config(
        &mock,
        &format!(
            "    loop_guard: {{ window: 10, repeats: 3, snapshot_dir: \"{}\" }}",
            dir.display()
        ),
    ));
    assert_eq!(
        call(&gw, Some("task-1"), &[], &ask("no results")).status,
        200
    );
    // Same call, noise differs (key order, whitespace, the `user` id).
    let noisy = r#"{"messages":[{"content":"plan","role":"user"},{"role":"assistant","content":"calling  search"},{"role":"tool","content":"no results"}],"user":"other","model":"gpt-4o"}"#;
    assert_eq!(call(&gw, Some("task-1"), &[], noisy).status, 200);
    let r = call(&gw, Some("task-1"), &[], &ask("no results"));
    r.assert_gateway_error(409, "loop_detected");
    assert_eq!(r.json()["error"]["retryable"], false);
    // The official SDKs would retry a 409 after its Retry-After without this.
    assert_eq!(r.header("x-should-retry"), Some("false"));
    let after: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((29..=30).contains(&after), "{after}");
    assert_eq!(posts(&mock), 2, "the provider saw only the allowed calls");
    // Still cooling down, whatever the request.
    call(&gw, Some("task-1"), &[], &ask("something else"))
        .assert_gateway_error(409, "loop_detected");
    // Another task, and requests without a task id, are not affected.
    assert_eq!(
        call(&gw, Some("task-2"), &[], &ask("no results")).status,
        200
    );
    for _ in 0..3 {
        assert_eq!(call(&gw, None, &[], &ask("no results")).status, 200);
    }
    assert_eq!(
        gw.metric(r#"loopgate_loop_trips_total{agent="tester"}"#),
        1.0
    );

    assert!(eventually(5, || std::fs::read_dir(&dir).is_ok_and(|d| d.count() == 1)));
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(file
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("task-1-"));
    let snap: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(snap["agent"], "tester");
    assert_eq!(snap["task"], "task-1");
    assert_eq!(snap["fingerprints"].as_array().unwrap().len(), 3);
    assert_eq!(snap["thresholds"]["repeats"], 3);
    assert_eq!(snap["state"]["trips"], 1);
}

#[test]
fn an_alternating_cycle_trips_too() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock, "    loop_guard: {}"));
    for (i, q) in ["a", "b", "a", "b", "a"].iter().enumerate() {
        assert_eq!(call(&gw, Some("t"), &[], &ask(q)).status, 200, "step {i}");
    }
    call(&gw, Some("t"), &[], &ask("b")).assert_gateway_error(409, "loop_detected");
    assert_eq!(posts(&mock), 5);
}

const SMALL: &str = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn a_task_over_budget_is_denied_before_upstream() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(
        &mock,
        "    budgets: { task_tokens: 300, default_max_tokens: 100 }",
    ));
    // Reserves ~101, then settles at the reported 16 + 250.
    let r = call(&gw, Some("t"), &["-H", "x-mock-chunks: 250"], SMALL);
    assert_eq!(r.status, 200);
    let r = call(&gw, Some("t"), &[], SMALL);
    r.assert_gateway_error(402, "budget_exceeded");
    assert_eq!(r.json()["error"]["retryable"], false);
    assert_eq!(posts(&mock), 1);
    // Other tasks have their own budget.
    assert_eq!(call(&gw, Some("t2"), &[], SMALL).status, 200);
}

#[test]
fn streamed_usage_is_counted_against_the_budget() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(
        &mock,
        "    budgets: { task_tokens: 300, default_max_tokens: 100 }",
    ));
    let body = r#"{"model":"gpt-4o","stream":true,"max_tokens":250,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = call(&gw, Some("t"), &["-N", "-H", "x-mock-chunks: 240"], body);
    assert_eq!(r.status, 200);
    assert!(r.text().ends_with("data: [DONE]\n\n"));
    call(&gw, Some("t"), &[], SMALL).assert_gateway_error(402, "budget_exceeded");
}

#[test]
fn a_stream_outgrowing_its_budget_is_cut_with_an_error_event() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(
        &mock,
        "    budgets: { task_tokens: 200, default_max_tokens: 50 }",
    ));
    let body = r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = call(
        &gw,
        Some("t"),
        &[
            "-N",
            "-H",
            "x-mock-chunks: 2000",
            "-H",
            "x-mock-chunk-delay-ms: 1",
        ],
        body,
    );
    assert_eq!(r.status, 200);
    let text = r.text();
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    let err: Value = serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(err["error"]["code"], "budget_exceeded", "{last}");
    let delivered = text.matches("\"content\":").count();
    assert!(
        (150..400).contains(&delivered),
        "delivered {delivered} of 2000: the cut is bounded"
    );
    assert!(!text.contains("[DONE]"));
    assert_eq!(
        gw.metric(r#"loopgate_budget_cuts_total{agent="tester"}"#),
        1.0
    );
}

#[test]
fn the_watchdog_warns_then_degrades_to_the_cheaper_model() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(
        &mock,
        "    watchdog: { yellow: { steps: 2 }, red: { steps: 3 }, action: degrade, degrade_to: gpt-4o-mini }\n    loop_guard: { enabled: false }",
    ));
    let r = call(&gw, Some("t"), &[], SMALL);
    assert_eq!((r.status, r.header("x-loopgate-guard")), (200, None));
    let r = call(&gw, Some("t"), &[], SMALL);
    assert_eq!(r.header("x-loopgate-guard"), Some("warn"));
    let r = call(&gw, Some("t"), &[], SMALL);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-loopgate-guard"), Some("degraded"));
    assert_eq!(r.header("x-loopgate-degraded"), Some("gpt-4o->gpt-4o-mini"));
    assert_eq!(r.json()["model"], "gpt-4o-mini");
    let seen = mock.last_request();
    let renamed = SMALL.replace("gpt-4o", "gpt-4o-mini");
    assert_eq!(
        seen["body_sha256"],
        sha256_hex(renamed.as_bytes()),
        "the provider got the cheaper model"
    );
}

#[test]
fn the_watchdog_can_stop_a_task() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(
        &mock,
        "    watchdog: { red: { calls_per_minute: 3 }, action: stop }\n    loop_guard: { enabled: false }",
    ));
    for _ in 0..2 {
        assert_eq!(call(&gw, Some("t"), &[], SMALL).status, 200);
    }
    let r = call(&gw, Some("t"), &[], SMALL);
    r.assert_gateway_error(429, "task_stopped");
    assert_eq!(r.json()["error"]["retryable"], false);
    assert_eq!(posts(&mock), 2);
}
