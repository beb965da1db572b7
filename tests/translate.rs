//! Provider families (issue 24) end to end: the real binary translating
//! between an agent's API family and a provider of the other one (the
//! mock serves both shapes), refusing what cannot be translated before
//! anything is sent, rendering errors and broken streams in the agent's
//! family, and falling back across families. The official SDKs check what
//! they receive in `sdk/families.py`.

use loopgate_tests::*;
use serde_json::{json, Value};

fn config(mock: &Mock, down: &Mock, log: &std::path::Path) -> String {
    format!(
        r#"
listen: 127.0.0.1:{{PORT}}
threads: 2
access_log: {{ path: "{log}" }}
providers:
  # The SDK script (sdk/families.py) fails these on purpose, many times
  # in a row: their breakers must stay closed for the rest of it.
  oa: {{ kind: openai_compatible, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY, breaker: {{ consecutive_failures: 100, min_requests: 1000 }} }}
  an: {{ kind: anthropic, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY, breaker: {{ consecutive_failures: 100, min_requests: 1000 }} }}
  an_down: {{ kind: anthropic, base_url: "{down}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
  oa_down: {{ kind: openai, base_url: "{down}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
  local: {{ kind: openai_compatible, base_url: "{mock}" }}
routes:
  - models: [claude-via-openai]
    targets: [ {{ provider: oa }} ]
  - models: [gpt-via-anthropic]
    targets: [ {{ provider: an }} ]
  - models: [claude-fallback]
    # The first attempt goes by weight: Anthropic first, as in the outage story.
    targets: [ {{ provider: an_down, weight: 1000000 }}, {{ provider: oa_down }}, {{ provider: local }} ]
  - models: [gpt-4o-mini]
    targets: [ {{ provider: oa }} ]
  - models: [claude-mixed]
    targets: [ {{ provider: an }}, {{ provider: oa }} ]
  - models: [claude-mixed-down]
    targets: [ {{ provider: an_down, weight: 1000000 }}, {{ provider: oa }} ]
agents:
  tester:
    key_sha256: "{agent}"
    models: ["*"]
  judged:
    key_sha256: "{judged}"
    models: ["*"]
    blocked_phrases: ["ignore previous instructions"]
policy:
  max_body_bytes: 4194304
"#,
        mock = mock.url(),
        down = down.url(),
        log = log.display(),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
        judged = sha256_hex(NARROW_KEY.as_bytes()),
    )
}

struct Setup {
    mock: Mock,
    down: Mock,
    gw: Gateway,
    log: std::path::PathBuf,
}

fn setup() -> Setup {
    let mock = Mock::start();
    let down = Mock::start_with(&["--status", "503"]);
    let log = scratch_dir("families").join("access.log");
    let gw = Gateway::start(&config(&mock, &down, &log));
    Setup {
        mock,
        down,
        gw,
        log,
    }
}

/// The access-log lines written so far.
fn log_lines(s: &Setup) -> Vec<Value> {
    std::fs::read_to_string(&s.log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// SSE events: (event name, data as JSON, or `[DONE]` as a string).
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = Value::Null;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap_or_else(|_| json!(d));
                }
            }
            (name, data)
        })
        .collect()
}

const ANTHROPIC_BODY: &str = r#"{"model":"claude-via-openai","max_tokens":64,"system":"Be brief.","messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn an_anthropic_agent_is_served_by_an_openai_provider() {
    let s = setup();
    let r = post_json(&s.gw, AGENT_KEY, "/v1/messages", &[], ANTHROPIC_BODY);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-loopgate-provider"), Some("oa"));
    let m = r.json();
    assert_eq!(m["type"], "message");
    assert_eq!(m["role"], "assistant");
    assert_eq!(m["model"], "claude-via-openai");
    assert_eq!(
        m["content"][0]["text"],
        "Hello from the Loopgate mock provider. "
    );
    assert_eq!(m["stop_reason"], "end_turn");
    assert_eq!(m["usage"]["output_tokens"], 8);
    // The provider got an OpenAI request, on its path, with its key.
    let req = s.mock.last_request();
    assert_eq!(req["path"], "/v1/chat/completions", "{req}");
    let sent: Value = serde_json::from_str(req["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        sent["messages"],
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    );
    assert_eq!(sent["max_tokens"], 64);
    assert_eq!(
        recorded_header(&req, "authorization"),
        Some(format!("Bearer {UPSTREAM_KEY}").as_str())
    );
    assert_eq!(recorded_header(&req, "anthropic-version"), None);
    assert!(!req.to_string().contains(AGENT_KEY));

    // Streamed: Anthropic's events, well formed, with the usage.
    let body = ANTHROPIC_BODY.replace("\"max_tokens\":64", "\"max_tokens\":64,\"stream\":true");
    let r = post_json(&s.gw, AGENT_KEY, "/v1/messages", &[], &body);
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let evs = events(&r.text());
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    let text: String = evs
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "Hello from the Loopgate mock provider. ");
    let delta = evs.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta.1["usage"]["output_tokens"], 8);
    let sent: Value =
        serde_json::from_str(s.mock.last_request()["body"].as_str().unwrap()).unwrap();
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));

    // The access log says which family answered, and usage as reported.
    let same = post_chat(&s.gw, AGENT_KEY, &[]);
    assert_eq!(same.status, 200);
    assert!(eventually(5, || log_lines(&s).len() >= 3));
    let lines = log_lines(&s);
    let translated: Vec<&Value> = lines
        .iter()
        .filter(|l| l["path"] == "/v1/messages")
        .collect();
    assert_eq!(translated.len(), 2, "{lines:?}");
    for l in translated {
        assert_eq!(l["translated_from"], "openai", "{l}");
        assert_eq!(l["completion_tokens"], 8, "{l}");
    }
    let plain = lines
        .iter()
        .find(|l| l["path"] == "/v1/chat/completions")
        .unwrap();
    assert!(plain.get("translated_from").is_none(), "{plain}");
}

#[test]
fn an_openai_agent_is_served_by_an_anthropic_provider() {
    let s = setup();
    let body = r#"{"model":"gpt-via-anthropic","messages":[{"role":"system","content":"S"},{"role":"user","content":"hi"}]}"#;
    let r = post_json(&s.gw, AGENT_KEY, "/v1/chat/completions", &[], body);
    assert_eq!(r.status, 200, "{}", r.text());
    let c = r.json();
    assert_eq!(c["object"], "chat.completion");
    assert_eq!(
        c["choices"][0]["message"]["content"],
        "Hello from the Loopgate mock provider. "
    );
    assert_eq!(c["choices"][0]["finish_reason"], "stop");
    assert_eq!(c["usage"]["completion_tokens"], 8);
    let req = s.mock.last_request();
    assert_eq!(req["path"], "/v1/messages");
    let sent: Value = serde_json::from_str(req["body"].as_str().unwrap()).unwrap();
    assert_eq!(sent["system"], "S");
    assert_eq!(
        sent["max_tokens"], 4096,
        "the default when the agent sets none"
    );
    assert_eq!(recorded_header(&req, "x-api-key"), Some(UPSTREAM_KEY));
    assert!(recorded_header(&req, "anthropic-version").is_some());

    let body = body.replace(
        "\"messages\"",
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"messages\"",
    );
    let r = post_json(&s.gw, AGENT_KEY, "/v1/chat/completions", &[], &body);
    let evs = events(&r.text());
    assert_eq!(evs.last().unwrap().1, json!("[DONE]"));
    let text: String = evs
        .iter()
        .filter_map(|(_, d)| d["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hello from the Loopgate mock provider. ");
    let usage = evs.iter().find(|(_, d)| !d["usage"].is_null()).unwrap();
    assert_eq!(usage.1["usage"]["completion_tokens"], 8);
    assert_eq!(usage.1["choices"], json!([]));
}

#[test]
fn what_cannot_be_translated_is_refused_before_anything_is_sent() {
    let s = setup();
    let cases = [
        (
            "/v1/chat/completions",
            r#"{"model":"gpt-via-anthropic","n":2,"messages":[{"role":"user","content":"hi"}]}"#,
            "`n`",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"gpt-via-anthropic","logprobs":true,"messages":[{"role":"user","content":"secret words"}]}"#,
            "`logprobs`",
        ),
        (
            "/v1/messages",
            r#"{"model":"claude-via-openai","max_tokens":9,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"hi"}]}"#,
            "`thinking`",
        ),
        (
            "/v1/messages",
            r#"{"model":"claude-via-openai","max_tokens":9,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"secret words"}}]}]}"#,
            "`messages[0].content[0].type`",
        ),
    ];
    for (path, body, field) in cases {
        let r = post_json(&s.gw, AGENT_KEY, path, &[], body);
        r.assert_gateway_error(400, "untranslatable_request");
        let message = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(message.contains(field), "{message}");
        assert!(!message.contains("secret"), "{message}");
    }
    assert!(s.mock.requests().is_empty(), "{:?}", s.mock.requests());
    // The same fields on a same-family route pass through untouched.
    let r = post_json(
        &s.gw,
        AGENT_KEY,
        "/v1/chat/completions",
        &[],
        r#"{"model":"gpt-4o-mini","n":2,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

/// On a route of both families, a body the other family cannot read goes
/// only to the targets of the agent's own family: served as written while
/// one answers, never translated with a field dropped, and the fallback
/// across families is given up for that call rather than refused for all.
#[test]
fn an_untranslatable_body_on_a_mixed_route_stays_with_its_own_family() {
    let s = setup();
    let untranslatable = r#"{"model":"claude-mixed","max_tokens":9,"top_k":5,"messages":[{"role":"user","content":"hi"}]}"#;
    // Equal weights: without the rule, about half would go to OpenAI.
    for _ in 0..12 {
        let r = post_json(&s.gw, AGENT_KEY, "/v1/messages", &[], untranslatable);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-loopgate-provider"), Some("an"));
        assert_eq!(r.json()["type"], "message", "{}", r.text());
    }
    let reqs = s.mock.requests();
    assert_eq!(reqs.len(), 12);
    for req in &reqs {
        assert_eq!(req["path"], "/v1/messages", "{req}");
        let sent: Value = serde_json::from_str(req["body"].as_str().unwrap()).unwrap();
        assert_eq!(sent["top_k"], 5, "sent as written: {sent}");
    }

    // Its own family's only target is down: the agent gets that failure,
    // in its family; nothing goes to the OpenAI target.
    let down = untranslatable.replace("claude-mixed", "claude-mixed-down");
    let r = post_json(&s.gw, AGENT_KEY, "/v1/messages", &[], &down);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["type"], "error", "{}", r.text());
    assert_eq!(r.header("x-loopgate-fallback"), None);
    assert_eq!(
        s.mock.requests().len(),
        12,
        "nothing reached the OpenAI target"
    );
    assert_eq!(s.down.requests().len(), 1);

    // A body both families read falls back across them as before.
    let fine = down.replace(",\"top_k\":5", "");
    let r = post_json(&s.gw, AGENT_KEY, "/v1/messages", &[], &fine);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-loopgate-provider"), Some("oa"));
    assert_eq!(r.header("x-loopgate-fallback"), Some("an_down"));
}

#[test]
fn provider_errors_reach_the_agent_in_its_family_with_their_status() {
    let s = setup();
    let r = post_json(
        &s.gw,
        AGENT_KEY,
        "/v1/messages",
        &["-H", "x-mock-status: 429"],
        ANTHROPIC_BODY,
    );
    assert_eq!(r.status, 429, "{}", r.text());
    let e = r.json();
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["type"], "rate_limit_error");
    assert!(e["error"]["message"].is_string());

    let body = r#"{"model":"gpt-via-anthropic","messages":[{"role":"user","content":"hi"}]}"#;
    let r = post_json(
        &s.gw,
        AGENT_KEY,
        "/v1/chat/completions",
        &["-H", "x-mock-status: 400"],
        body,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let e = r.json();
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert_eq!(e["error"]["code"], "invalid_request_error");
}

#[test]
fn a_stream_cut_mid_way_ends_with_an_error_event_in_the_agents_family() {
    let s = setup();
    let body = ANTHROPIC_BODY.replace("\"max_tokens\":64", "\"max_tokens\":64,\"stream\":true");
    let r = post_json(
        &s.gw,
        AGENT_KEY,
        "/v1/messages",
        &["-H", "x-mock-reset-after: 4"],
        &body,
    );
    let evs = events(&r.text());
    assert_eq!(evs.first().unwrap().0, "message_start", "{}", r.text());
    let (name, data) = evs.last().unwrap();
    assert_eq!(name, "error", "{}", r.text());
    assert_eq!(data["type"], "error");
    assert!(!evs.iter().any(|(n, _)| n == "message_stop"));

    let body = r#"{"model":"gpt-via-anthropic","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = post_json(
        &s.gw,
        AGENT_KEY,
        "/v1/chat/completions",
        &["-H", "x-mock-reset-after: 4"],
        body,
    );
    let evs = events(&r.text());
    let (_, last) = evs.last().unwrap();
    assert!(last["error"].is_object(), "{}", r.text());
    assert!(!evs.iter().any(|(_, d)| d == &json!("[DONE]")));
}

/// A provider event that cannot be translated breaks the stream, but the
/// events read with it, before it, still reach the agent, then the error
/// event: the agent loses none of the answer it could read.
#[test]
fn events_before_an_untranslatable_one_reach_the_agent_before_the_error() {
    let s = setup();
    // The mock sends its first 4 events (the role, then "Hello", " from",
    // " the") 50 ms apart, so the answer has begun, the fourth in one
    // write with a broken one.
    let bad = [
        "-H",
        "x-mock-bad-event-after: 4",
        "-H",
        "x-mock-chunk-delay-ms: 50",
    ];
    let body = ANTHROPIC_BODY.replace("\"max_tokens\":64", "\"max_tokens\":64,\"stream\":true");
    let r = post_json(&s.gw, AGENT_KEY, "/v1/messages", &bad, &body);
    let evs = events(&r.text());
    let text: String = evs
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "Hello from the", "{}", r.text());
    assert_eq!(evs.last().unwrap().0, "error", "{}", r.text());
    assert!(!evs.iter().any(|(n, _)| n == "message_stop"));

    // From Anthropic, the same: message_start, content_block_start, a
    // ping, "Hello" (the last with the broken event).
    let body = r#"{"model":"gpt-via-anthropic","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = post_json(&s.gw, AGENT_KEY, "/v1/chat/completions", &bad, body);
    let evs = events(&r.text());
    let text: String = evs
        .iter()
        .filter_map(|(_, d)| d["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hello", "{}", r.text());
    let (_, last) = evs.last().unwrap();
    assert!(last["error"].is_object(), "{}", r.text());
    assert!(!evs.iter().any(|(_, d)| d == &json!("[DONE]")));
}

#[test]
fn an_anthropic_agent_falls_back_to_a_local_openai_compatible_server() {
    let s = setup();
    let body = ANTHROPIC_BODY.replace("claude-via-openai", "claude-fallback");
    let r = post_json(&s.gw, AGENT_KEY, "/v1/messages", &[], &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-loopgate-provider"), Some("local"));
    assert_eq!(r.header("x-loopgate-fallback"), Some("an_down"));
    let m = r.json();
    assert_eq!(m["type"], "message");
    assert_eq!(
        m["content"][0]["text"],
        "Hello from the Loopgate mock provider. "
    );
    // The Anthropic target got Anthropic, the OpenAI one OpenAI.
    let down: Vec<String> = s
        .down
        .requests()
        .iter()
        .map(|r| r["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(down, ["/v1/messages", "/v1/chat/completions"]);
    // Both OpenAI targets got the one translation made at admission.
    let sent = |r: &Value| r["body_sha256"].as_str().unwrap_or_default().to_string();
    assert_eq!(sent(&s.down.requests()[1]), sent(&s.mock.last_request()));

    let body = body.replace("\"max_tokens\":64", "\"max_tokens\":64,\"stream\":true");
    let r = post_json(&s.gw, AGENT_KEY, "/v1/messages", &[], &body);
    assert_eq!(r.header("x-loopgate-fallback"), Some("an_down"));
    let evs = events(&r.text());
    assert_eq!(evs.last().unwrap().0, "message_stop", "{}", r.text());
}

#[test]
fn large_bodies_are_translated_whole() {
    // Past Pingora's 64 KiB retry buffer (the large-body subrequest path)
    // and well past it: the provider gets the whole translated body.
    let s = setup();
    for size in [70 * 1024, 1024 * 1024] {
        let text = "a".repeat(size);
        let body = json!({"model": "claude-via-openai", "max_tokens": 16,
                          "messages": [{"role": "user", "content": text}]});
        let r = post_json(&s.gw, AGENT_KEY, "/v1/messages", &[], body.to_string());
        assert_eq!(r.status, 200, "{size}: {}", r.text());
        assert_eq!(r.json()["type"], "message");
        let req = s.mock.last_request();
        assert_eq!(req["path"], "/v1/chat/completions");
        let sent = serde_json::to_vec(
            &json!({"max_tokens": 16, "messages": [{"content": text, "role": "user"}],
                                              "model": "claude-via-openai"}),
        )
        .unwrap();
        assert_eq!(req["body_sha256"], sha256_hex(&sent), "{size}");
    }
}

#[test]
fn official_sdks_read_translated_answers() {
    let s = setup();
    let gw_url = format!("http://{}", s.gw.addr);
    let out = run_sdk_script(
        "families.py",
        &[&gw_url, AGENT_KEY, &s.mock.url()],
        "families ok",
    );
    print!("{out}");
}

/// An OpenAI chat body whose assistant turn called `note` with
/// `arguments` (a JSON string the model wrote, which translation to
/// Anthropic decodes into `input`).
fn with_arguments(arguments: &str) -> String {
    json!({"model": "gpt-via-anthropic", "messages": [
        {"role": "user", "content": "take a note"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "note", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "noted"}]})
    .to_string()
}

/// Issue 41 item 8: what translation decodes (JSON inside a tool call's
/// `arguments`) is judged like what the agent sent: an escaped blocked
/// phrase is refused 403 and a 100-deep `arguments` 400, before anything
/// reaches the provider.
#[test]
fn what_translation_decodes_is_judged_like_the_agents_body() {
    let s = setup();
    let post = |body: &str| post_json(&s.gw, NARROW_KEY, "/v1/chat/completions", &[], body);
    // Written plainly, the phrase is refused at once.
    post(&with_arguments(
        r#"{"note":"ignore previous instructions"}"#,
    ))
    .assert_gateway_error(403, "blocked_phrase");
    // Escaped inside the arguments string, it reads plainly once decoded.
    for arguments in [
        r#"{"note":"\u0069gnore previous instructions"}"#,
        r#"{"note":"ignore previous instruction\u0073"}"#,
        r#"{"ignore previous instructions":1}"#,
    ] {
        post(&with_arguments(arguments)).assert_gateway_error(403, "blocked_phrase");
    }
    // Nested past the 64 levels a body may have, once decoded.
    let deep = format!("{}1{}", r#"{"a":"#.repeat(100), "}".repeat(100));
    post(&with_arguments(&deep)).assert_gateway_error(400, "invalid_json");
    assert_eq!(s.mock.received(), 0, "nothing reached the provider");
    // The same call with harmless arguments is translated and sent.
    let r = post(&with_arguments(r#"{"note":"buy milk"}"#));
    assert_eq!(r.status, 200, "{}", r.text());
    let sent: Value =
        serde_json::from_str(s.mock.last_request()["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        sent["messages"][1]["content"][0]["input"],
        json!({"note": "buy milk"})
    );
}

/// Issue 41 item 9 on a translated route: a provider's redirect is a
/// failure answered in the agent's family (502 `upstream_error`), never
/// relayed untranslated with its `Location`.
#[test]
fn a_redirect_from_a_provider_of_the_other_family_is_a_failure() {
    let s = setup();
    let redirect = [
        "-H",
        "x-mock-status: 307",
        "-H",
        "x-mock-response-header: location: http://elsewhere.invalid/v1/messages",
    ];
    let body = r#"{"model":"gpt-via-anthropic","messages":[{"role":"user","content":"hi"}]}"#;
    let r = post_json(&s.gw, AGENT_KEY, "/v1/chat/completions", &redirect, body);
    r.assert_gateway_error(502, "upstream_error");
    assert_eq!(r.header("location"), None, "{r:?}");
    let r = post_json(&s.gw, AGENT_KEY, "/v1/messages", &redirect, ANTHROPIC_BODY);
    assert_eq!(r.status, 502, "{r:?}");
    assert_eq!(r.header("x-loopgate-error"), Some("upstream_error"));
    assert_eq!(r.json()["type"], "error", "Anthropic's shape: {}", r.text());
    assert_eq!(r.header("location"), None, "{r:?}");
    assert_eq!(s.mock.received(), 2, "each reached the provider once");
}
