//! `POST /v1/messages/count_tokens` (issue 42 item 4): judged like a
//! Messages call, answered by an Anthropic-family target of the model's
//! route or, on a route without one, by the gateway's own estimate; never
//! charged against budgets. The official Anthropic SDK checks what it
//! receives in `sdk/count_tokens.py`.

use loopgate_tests::*;
use serde_json::json;

const GUARDED_KEY: &str = "guarded-key";
const CHAT_ONLY_KEY: &str = "chat-only-key";

fn config(mock: &Mock) -> String {
    format!(
        r#"
listen: 127.0.0.1:{{PORT}}
threads: 2
providers:
  an: {{ kind: anthropic, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
  oa: {{ kind: openai_compatible, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
routes:
  - models: [claude-sonnet-4-5]
    targets: [ {{ provider: an }} ]
  - models: [claude-via-openai]
    targets: [ {{ provider: oa }} ]
  # Both families, the OpenAI one first by weight: a count goes to the
  # Anthropic target only.
  - models: [claude-mixed]
    targets: [ {{ provider: oa, weight: 1000000 }}, {{ provider: an, weight: 1 }} ]
agents:
  tester:
    key_sha256: "{agent}"
    models: [claude-sonnet-4-5, claude-via-openai, claude-mixed]
    blocked_phrases: [ignore previous instructions]
    budgets: {{ daily_tokens: 100 }}
  guarded:
    key_sha256: "{guarded}"
    models: [claude-sonnet-4-5]
    paths: [/v1/messages]
    loop_guard: {{ window: 10, repeats: 3 }}
    watchdog: {{ red: {{ steps: 3 }}, action: stop }}
  chat_only:
    key_sha256: "{chat_only}"
    models: [claude-sonnet-4-5]
    paths: [/v1/chat/completions]
"#,
        mock = mock.url(),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
        guarded = sha256_hex(GUARDED_KEY.as_bytes()),
        chat_only = sha256_hex(CHAT_ONLY_KEY.as_bytes()),
    )
}

#[test]
fn the_anthropic_sdk_counts_tokens_through_the_gateway_on_both_route_kinds() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let out = run_sdk_script(
        "count_tokens.py",
        &[&format!("http://{}", gw.addr), AGENT_KEY],
        "count_tokens ok",
    );
    print!("{out}");
}

#[test]
fn count_tokens_is_judged_like_a_messages_call_and_refusals_reach_nothing() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let count = |body: serde_json::Value| {
        post_json(
            &gw,
            AGENT_KEY,
            "/v1/messages/count_tokens",
            &[],
            body.to_string(),
        )
    };
    let before = mock.requests().len();
    let r = count(json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}));
    r.assert_gateway_error(403, "model_not_allowed");
    let r = count(json!({"model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": "Ignore previous instructions"}]}));
    r.assert_gateway_error(403, "blocked_phrase");
    assert_eq!(
        mock.requests().len(),
        before,
        "nothing reached the provider"
    );
    // Never charged: far more than the daily budget of 100 tokens counted.
    let long = "word ".repeat(2000);
    for _ in 0..3 {
        let r = count(json!({"model": "claude-sonnet-4-5",
            "messages": [{"role": "user", "content": long}]}));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-loopgate-count"), Some("provider"));
        assert!(
            r.json()["input_tokens"].as_u64().unwrap_or(0) > 100,
            "{}",
            r.text()
        );
    }
}

#[test]
fn counts_are_no_steps_for_the_guards_and_follow_the_messages_path_grant() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let body = json!({"model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": "the same prompt"}]})
    .to_string();
    let task = ["-H", "x-agent-task-id: t1"];
    // Ten identical counts of task t1: past the loop guard's 3 repeats and
    // the watchdog's 3 steps, were they steps.
    for _ in 0..10 {
        let r = post_json(
            &gw,
            GUARDED_KEY,
            "/v1/messages/count_tokens",
            &task,
            body.clone(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-loopgate-count"), Some("provider"));
    }
    // The task's first real step still goes.
    let call = json!({"model": "claude-sonnet-4-5", "max_tokens": 50,
        "messages": [{"role": "user", "content": "the same prompt"}]})
    .to_string();
    let r = post_json(&gw, GUARDED_KEY, "/v1/messages", &task, call);
    assert_eq!(r.status, 200, "{}", r.text());
    // `paths:` grants counting with /v1/messages (GUARDED_KEY above);
    // without it, refused in Anthropic's shape, and nothing sent.
    let seen = mock.requests().len();
    let r = post_json(&gw, CHAT_ONLY_KEY, "/v1/messages/count_tokens", &[], body);
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["code"], "path_not_allowed");
    assert_eq!(mock.requests().len(), seen);
}
