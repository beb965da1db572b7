//! The output limit as each target accepts it, against the mock in strict
//! mode (which refuses what OpenAI and Anthropic refuse): the field a
//! reasoning model reads, a value capped at the model's maximum, and both
//! again after a fallback and a watchdog degrade to another model.

use loopgate_tests::*;
use serde_json::{json, Value};

const DEGRADER_KEY: &str = "degrader-key";

fn config(mock: &Mock) -> String {
    let dead = free_port();
    format!(
        r#"
listen: 127.0.0.1:{{PORT}}
threads: 2
providers:
  openai: {{ kind: openai, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
  dead: {{ kind: openai, base_url: "http://127.0.0.1:{dead}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
  compat: {{ kind: openai_compatible, base_url: "{mock}" }}
  an: {{ kind: anthropic, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
models:
  o3-mini: {{ max_output_tokens: 100000 }}
  o4-mini: {{ max_output_tokens: 100000 }}
  "gpt-5*": {{ max_output_tokens: 128000 }}
  gpt-4o-mini: {{ max_output_tokens: 16384 }}
  gpt-4o: {{ max_output_tokens: 16384, clamp_requested: true }}
  "claude-3-5-haiku*": {{ max_output_tokens: 8192 }}
routes:
  - models: [o3-mini, o4-mini, gpt-5-mini, gpt-4o-mini, gpt-4o]
    targets: [ {{ provider: openai }} ]
  - models: [local-reasoner]
    targets: [ {{ provider: compat, model: o3-mini }} ]
    max_tokens_field: max_completion_tokens
  - models: [local-plain]
    targets: [ {{ provider: compat, model: llama3.1 }} ]
  - models: [gpt-4o-fallback]
    targets: [ {{ provider: dead, weight: 1000000 }}, {{ provider: openai, model: o4-mini, weight: 1 }} ]
  - models: ["claude-3-5-haiku*"]
    targets: [ {{ provider: an }} ]
agents:
  tester:
    key_sha256: "{agent}"
    models: ["*"]
  degrader:
    key_sha256: "{degrader}"
    models: ["*"]
    loop_guard: {{ enabled: false }}
    watchdog: {{ yellow: {{ steps: 1 }}, red: {{ steps: 2 }}, action: degrade, degrade_to: gpt-4o-mini }}
policy:
  max_tokens: 150000
"#,
        mock = mock.url(),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
        degrader = sha256_hex(DEGRADER_KEY.as_bytes()),
    )
}

fn start() -> (Mock, Gateway) {
    let mock = Mock::start_with(&["--strict"]);
    let gw = Gateway::start(&config(&mock));
    (mock, gw)
}

fn post(gw: &Gateway, key: &str, path: &str, body: &Value, extra: &[&str]) -> Resp {
    post_json(gw, key, path, extra, body.to_string())
}

fn chat(model: &str, extra: Value) -> Value {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

/// The body of the last request the mock received.
fn forwarded(mock: &Mock) -> Value {
    let seen = mock.last_request();
    let text = seen["body"].as_str().expect("the mock recorded the body");
    serde_json::from_str(text).expect("the forwarded body is JSON")
}

/// Sends chat `body` as the agent, requires a 200, and returns the answer
/// and the body the provider received.
fn accepted(gw: &Gateway, mock: &Mock, body: &Value) -> (Resp, Value) {
    let r = post(gw, AGENT_KEY, "/v1/chat/completions", body, &[]);
    assert_eq!(r.status, 200, "{}: {}", body["model"], r.text());
    (r, forwarded(mock))
}

/// Sends `body` to `path` as the agent, requires a 200, and returns the
/// output-limit fields the provider received.
fn limits_sent(
    gw: &Gateway,
    mock: &Mock,
    path: &str,
    body: &Value,
    extra: &[&str],
) -> Vec<(&'static str, Value)> {
    let r = post(gw, AGENT_KEY, path, body, extra);
    assert_eq!(r.status, 200, "{}", r.text());
    limits(&forwarded(mock))
}

/// The output-limit fields of a forwarded body, as (field, value) pairs.
fn limits(body: &Value) -> Vec<(&'static str, Value)> {
    ["max_tokens", "max_completion_tokens", "max_output_tokens"]
        .into_iter()
        .filter_map(|f| Some((f, body.get(f)?.clone())))
        .collect()
}

#[test]
fn a_reasoning_model_gets_its_field_and_a_limit_capped_at_its_maximum() {
    let (mock, gw) = start();
    for (model, max) in [
        ("o3-mini", 100_000),
        ("o4-mini", 100_000),
        ("gpt-5-mini", 128_000),
    ] {
        let (_, sent) = accepted(&gw, &mock, &chat(model, json!({})));
        assert_eq!(sent["model"], model);
        assert_eq!(
            limits(&sent),
            [("max_completion_tokens", json!(max))],
            "{model}"
        );
    }
    // A model that reads max_tokens gets max_tokens, capped too.
    assert_eq!(
        limits_sent(
            &gw,
            &mock,
            "/v1/chat/completions",
            &chat("gpt-4o-mini", json!({})),
            &[]
        ),
        [("max_tokens", json!(16_384))]
    );
    // Responses and Messages: their own fields, capped.
    assert_eq!(
        limits_sent(
            &gw,
            &mock,
            "/v1/responses",
            &json!({"model": "o4-mini", "input": "hi"}),
            &[]
        ),
        [("max_output_tokens", json!(100_000))]
    );
    assert_eq!(
        limits_sent(
            &gw,
            &mock,
            "/v1/messages",
            &json!({"model": "claude-3-5-haiku-latest", "messages": [{"role": "user", "content": "hi"}]}),
            &[]
        ),
        [("max_tokens", json!(8_192))]
    );
    // A large body (past Pingora's 64 KiB replay buffer) gets the same.
    let big = chat(
        "o3-mini",
        json!({"metadata": {"pad": "z".repeat(70 * 1024)}}),
    );
    let (_, sent) = accepted(&gw, &mock, &big);
    assert_eq!(sent["metadata"], big["metadata"]);
    assert_eq!(limits(&sent), [("max_completion_tokens", json!(100_000))]);
}

#[test]
fn the_agents_own_limit_is_renamed_for_the_target_and_kept_for_the_model_it_named() {
    let (mock, gw) = start();
    // max_tokens to a reasoning model: sent as max_completion_tokens.
    assert_eq!(
        limits_sent(
            &gw,
            &mock,
            "/v1/chat/completions",
            &chat("o4-mini", json!({"max_tokens": 500})),
            &[]
        ),
        [("max_completion_tokens", json!(500))]
    );
    // A null in the wrong spelling goes too.
    assert_eq!(
        limits_sent(
            &gw,
            &mock,
            "/v1/chat/completions",
            &chat("o3-mini", json!({"max_tokens": null})),
            &[]
        ),
        [("max_completion_tokens", json!(100_000))]
    );
    // Above the maximum of the model the agent named: forwarded as sent,
    // and the provider's own 400 answers (passed through unchanged).
    let r = post(
        &gw,
        AGENT_KEY,
        "/v1/chat/completions",
        &chat("gpt-4o-mini", json!({"max_tokens": 20_000})),
        &[],
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.header("x-loopgate-error"), None, "the provider's answer");
    assert_eq!(r.json()["error"]["code"], "invalid_value");
    assert_eq!(limits(&forwarded(&mock)), [("max_tokens", json!(20_000))]);
    // ... unless the model's settings say to clamp (gpt-4o: clamp_requested).
    assert_eq!(
        limits_sent(
            &gw,
            &mock,
            "/v1/chat/completions",
            &chat("gpt-4o", json!({"max_completion_tokens": 20_000})),
            &[]
        ),
        [("max_tokens", json!(16_384))]
    );
}

#[test]
fn two_output_limits_are_refused_before_anything_goes_upstream() {
    let (mock, gw) = start();
    let before = mock.requests().len();
    for extra in [
        json!({"max_tokens": 100, "max_completion_tokens": 200}),
        json!({"max_tokens": 100, "max_completion_tokens": 100}),
    ] {
        let r = post(
            &gw,
            AGENT_KEY,
            "/v1/chat/completions",
            &chat("o4-mini", extra),
            &[],
        );
        r.assert_gateway_error(400, "invalid_request");
        let msg = r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(
            msg.contains("`max_tokens`") && msg.contains("`max_completion_tokens`"),
            "{msg}"
        );
    }
    assert_eq!(
        mock.requests().len(),
        before,
        "nothing reached the provider"
    );
}

#[test]
fn openai_compatible_servers_get_max_tokens_unless_the_route_says_otherwise() {
    let (mock, gw) = start();
    let (_, sent) = accepted(&gw, &mock, &chat("local-plain", json!({})));
    assert_eq!(sent["model"], "llama3.1");
    assert_eq!(limits(&sent), [("max_tokens", json!(150_000))]);
    let (_, sent) = accepted(
        &gw,
        &mock,
        &chat("local-reasoner", json!({"max_tokens": 300})),
    );
    assert_eq!(sent["model"], "o3-mini");
    assert_eq!(limits(&sent), [("max_completion_tokens", json!(300))]);
}

#[test]
fn a_fallback_to_another_model_gets_that_models_field_and_maximum() {
    let (mock, gw) = start();
    // Inserted: the agent's 150000, capped at o4-mini's 100000.
    let (r, sent) = accepted(&gw, &mock, &chat("gpt-4o-fallback", json!({})));
    assert_eq!(r.header("x-loopgate-fallback"), Some("dead"));
    assert_eq!(sent["model"], "o4-mini");
    assert_eq!(limits(&sent), [("max_completion_tokens", json!(100_000))]);
    // The agent's own max_tokens, for a model the gateway chose: renamed and capped.
    let body = chat("gpt-4o-fallback", json!({"max_tokens": 120_000}));
    let (r, sent) = accepted(&gw, &mock, &body);
    assert_eq!(r.header("x-loopgate-fallback"), Some("dead"));
    assert_eq!(limits(&sent), [("max_completion_tokens", json!(100_000))]);
}

#[test]
fn a_watchdog_degrade_to_another_model_gets_that_models_field_and_maximum() {
    let (mock, gw) = start();
    let body = chat("gpt-5-mini", json!({"max_completion_tokens": 50_000}));
    // The same step of task t1, twice: the second is past the red line.
    let step = || {
        let task = ["-H", "x-agent-task-id: t1"];
        let r = post(&gw, DEGRADER_KEY, "/v1/chat/completions", &body, &task);
        assert_eq!(r.status, 200, "{}", r.text());
        r
    };
    step();
    assert_eq!(
        limits(&forwarded(&mock)),
        [("max_completion_tokens", json!(50_000))]
    );
    let r = step();
    assert_eq!(
        r.header("x-loopgate-degraded"),
        Some("gpt-5-mini->gpt-4o-mini")
    );
    let sent = forwarded(&mock);
    assert_eq!(sent["model"], "gpt-4o-mini");
    assert_eq!(limits(&sent), [("max_tokens", json!(16_384))]);
}

#[test]
fn the_strict_mock_refuses_what_the_providers_refuse() {
    // The reproduction of the issue, straight at the mock: what the gateway
    // used to forward is refused.
    let mock = Mock::start_with(&["--strict"]);
    let url = format!("{}/v1/chat/completions", mock.url());
    let body = chat("o3-mini", json!({"max_tokens": 8192})).to_string();
    let r = curl(&[&url, "-H", "content-type: application/json", "-d", &body]);
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json(),
        json!({"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
                         "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}})
    );
    // Per request, on a mock that is not strict.
    let lax = Mock::start();
    let url = format!("{}/v1/chat/completions", lax.url());
    let body = chat("gpt-4o-mini", json!({"max_tokens": 100})).to_string();
    let r = curl(&[&url, "-d", &body]);
    assert_eq!(r.status, 200);
    let r = curl(&[
        &url,
        "-H",
        "x-mock-strict: 1",
        "-H",
        "x-mock-max-output: 50",
        "-d",
        &body,
    ]);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "max_tokens");
}

const CLAMPED_KEY: &str = "clamped-key";
const BUDGETED_KEY: &str = "budgeted-key";

/// Agents of issue 42 item 5: LangChain's `ChatAnthropic` sends its
/// model's whole output maximum (64000) unasked.
fn over_limit_config(mock: &Mock) -> String {
    format!(
        r#"
listen: 127.0.0.1:{{PORT}}
threads: 2
providers:
  an: {{ kind: anthropic, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
routes:
  - models: [claude-sonnet-4-5]
    targets: [ {{ provider: an }} ]
agents:
  refuser:
    key_sha256: "{refuser}"
    models: [claude-sonnet-4-5]
    max_tokens: 4096
  clamped:
    key_sha256: "{clamped}"
    models: [claude-sonnet-4-5]
    max_tokens: 4096
    max_tokens_over_limit: clamp
  budgeted:
    key_sha256: "{budgeted}"
    models: [claude-sonnet-4-5]
    budgets: {{ daily_usd: 0.01, default_max_tokens: 4096 }}
"#,
        mock = mock.url(),
        refuser = sha256_hex(AGENT_KEY.as_bytes()),
        clamped = sha256_hex(CLAMPED_KEY.as_bytes()),
        budgeted = sha256_hex(BUDGETED_KEY.as_bytes()),
    )
}

fn messages(extra: Value) -> Value {
    let mut body =
        json!({"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

#[test]
fn a_larger_limit_is_refused_naming_the_setting_or_lowered_when_the_agent_clamps() {
    let mock = Mock::start_with(&["--strict"]);
    let gw = Gateway::start(&over_limit_config(&mock));
    let langchain = messages(json!({"max_tokens": 64000}));
    // Off (the default): refused before anything is sent, and the message
    // names the setting that would lower it instead.
    let before = mock.requests().len();
    let r = post(&gw, AGENT_KEY, "/v1/messages", &langchain, &[]);
    r.assert_gateway_error(400, "max_tokens_exceeded");
    assert_eq!(
        r.json()["error"]["message"],
        "max_tokens 64000 exceeds this agent's limit of 4096 (set \
         `max_tokens_over_limit: clamp` for this agent to lower it to the limit instead)"
    );
    assert_eq!(
        mock.requests().len(),
        before,
        "nothing reached the provider"
    );
    // On: answered, and the provider received the agent's maximum.
    let r = post(&gw, CLAMPED_KEY, "/v1/messages", &langchain, &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(limits(&forwarded(&mock)), [("max_tokens", json!(4096))]);
    // A limit within the agent's goes as sent.
    let r = post(
        &gw,
        CLAMPED_KEY,
        "/v1/messages",
        &messages(json!({"max_tokens": 300})),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(limits(&forwarded(&mock)), [("max_tokens", json!(300))]);
}

#[test]
fn a_small_call_refused_for_the_default_output_reservation_is_told_to_set_max_tokens() {
    let mock = Mock::start_with(&["--strict"]);
    // The budgets alone (no agent clamps here).
    let yaml = over_limit_config(&mock).replace("    max_tokens_over_limit: clamp\n", "");
    let gw = Gateway::start(&yaml);
    let before = mock.requests().len();
    // No output limit: 4096 tokens of claude-sonnet-4-5's output ($15 per
    // million) are reserved, $0.061, past the $0.01 daily budget.
    let r = post(&gw, BUDGETED_KEY, "/v1/messages", &messages(json!({})), &[]);
    r.assert_gateway_error(402, "budget_exceeded");
    let msg = r.json()["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        msg.ends_with(
            "(the request set no output limit, so `budgets.default_max_tokens` (4096 output \
             tokens per completion) was reserved for its answer: set `max_tokens` to what the \
             call needs)"
        ),
        "{msg}"
    );
    assert_eq!(
        mock.requests().len(),
        before,
        "nothing reached the provider"
    );
    // Doing as it says: a call that names its limit fits.
    let r = post(
        &gw,
        BUDGETED_KEY,
        "/v1/messages",
        &messages(json!({"max_tokens": 100})),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(limits(&forwarded(&mock)), [("max_tokens", json!(100))]);
}
