//! Money budgets settled on what the gateway saw (issue 41, items 2, 4
//! and 7), over the mock: what a budget reserves is what is sent as the
//! output limit (so concurrent calls cannot spend past the budget, and a
//! translated call carries the reserved size); a call that never reached
//! a provider is charged nothing; an answer whose usage cannot be read
//! settles on no less than the prompt estimate and the output the gateway
//! relayed, and OpenAI-family streams are asked for their usage.

use loopgate_tests::*;
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::thread;

/// Prices written so a micro-dollar is easy to count: 1 micro-dollar a
/// prompt token, 10 an output token.
fn config(mock: &str, extra_providers: &str, extra_routes: &str, agent: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:{{PORT}}
admin: {{ listen: "127.0.0.1:{{ADMIN_PORT}}", token_env: LOOPGATE_TEST_ADMIN_TOKEN }}
threads: 2
access_log: {{ path: "off" }}
providers:
  oa: {{ kind: openai_compatible, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
  an: {{ kind: anthropic, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY }}
{extra_providers}
routes:
  - models: [priced, embed-priced]
    targets: [ {{ provider: oa }} ]
  - models: [claude-translated]
    targets: [ {{ provider: an }} ]
{extra_routes}
models:
  priced: {{ price: {{ input: 1, output: 10 }} }}
  embed-priced: {{ price: {{ input: 1, output: 0 }} }}
  claude-translated: {{ price: {{ input: 1, output: 10 }}, max_output_tokens: 64000 }}
  flaky: {{ price: {{ input: 1, output: 10 }} }}
agents:
  tester:
    key_sha256: "{key}"
    models: [priced, embed-priced, claude-translated{flaky}]
    loop_guard: {{ enabled: false }}
    budgets: {{ {agent} }}
"#,
        key = sha256_hex(AGENT_KEY.as_bytes()),
        // Only a config that routes it may grant it (`loopgate check`
        // refuses an agent model no route serves).
        flaky = if extra_routes.contains("flaky") {
            ", flaky"
        } else {
            ""
        },
    )
}

fn start(yaml: &str) -> Gateway {
    Gateway::start_with_env(yaml, &[("LOOPGATE_TEST_ADMIN_TOKEN", ADMIN_TOKEN)])
}

/// What `/admin/spend` says the agent spent today, in micro-dollars.
fn spent_today(gw: &Gateway) -> u64 {
    let auth = format!("Authorization: Bearer {ADMIN_TOKEN}");
    let r = curl(&[&gw.admin_url("/admin/spend"), "-H", &auth]);
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json();
    let tester = v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["agent"] == "tester")
        .unwrap_or_else(|| panic!("no tester in {v}"))
        .clone();
    let usd = tester["day"]["spent_usd"].as_f64().unwrap();
    (usd * 1e6).round() as u64
}

/// `user` + `hi`: 6 bytes of text, an estimate of 2 prompt tokens.
const BARE: &str = r#"{"model":"priced","messages":[{"role":"user","content":"hi"}]}"#;

/// Item 4: with a money budget and no `max_tokens`, the call reserves
/// `default_max_tokens` (100: 2 + 100 x 10 = 1002 micro-dollars) and that
/// limit is sent. The mock obeys the limit it is sent (as providers do)
/// and would otherwise write 2,000 tokens (20,002 micro-dollars a call):
/// twelve concurrent calls under a $0.01 day must spend at most $0.01.
#[test]
fn concurrent_calls_without_max_tokens_spend_no_more_than_the_budget() {
    let mock = Mock::start();
    let gw = start(&config(
        &mock.url(),
        "",
        "",
        "daily_usd: 0.01, default_max_tokens: 100",
    ));
    let resps: Vec<Resp> = thread::scope(|s| {
        let hs: Vec<_> = (0..12)
            .map(|_| {
                let gw = &gw;
                s.spawn(move || {
                    let args = [
                        "-H",
                        "x-mock-obey-limit: 1",
                        "-H",
                        "x-mock-chunks: 2000",
                        "-H",
                        "x-mock-prompt-tokens: 2",
                    ];
                    post_json(gw, AGENT_KEY, "/v1/chat/completions", &args, BARE)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = resps.iter().filter(|r| r.status == 200).count();
    for r in resps.iter().filter(|r| r.status != 200) {
        r.assert_gateway_error(402, "budget_exceeded");
    }
    let spent = spent_today(&gw);
    println!("{ok} of 12 admitted; spent {spent} micro-dollars of 10,000");
    assert!(spent <= 10_000, "spent {spent} of a 10,000 budget");
    // Each call cost exactly what it reserved: 9 fit.
    assert_eq!((ok, spent), (9, 9 * 1002));
    for req in mock.requests() {
        let body: Value = serde_json::from_str(req["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["max_tokens"], 100, "{body}");
    }
}

/// Item 4: an OpenAI agent's call on a route to Anthropic reserves 100
/// output tokens, and the translated body carries `max_tokens: 100`, not
/// the model's maximum.
#[test]
fn a_translated_call_sends_the_output_size_it_reserved() {
    let mock = Mock::start();
    let gw = start(&config(
        &mock.url(),
        "",
        "",
        "daily_usd: 0.01, default_max_tokens: 100",
    ));
    let body = BARE.replace("priced", "claude-translated");
    let r = post_json(&gw, AGENT_KEY, "/v1/chat/completions", &[], &body);
    assert_eq!(r.status, 200, "{r:?}");
    let sent = mock.last_request();
    assert_eq!(sent["path"], "/v1/messages");
    let sent: Value = serde_json::from_str(sent["body"].as_str().unwrap()).unwrap();
    println!("translated body's max_tokens: {}", sent["max_tokens"]);
    assert_eq!(sent["max_tokens"], 100, "{sent}");
    // The agent's own limit goes as it asked.
    let asked = BARE
        .replace("priced", "claude-translated")
        .replace("\"messages\"", "\"max_tokens\":42,\"messages\"");
    let r = post_json(&gw, AGENT_KEY, "/v1/chat/completions", &[], &asked);
    assert_eq!(r.status, 200, "{r:?}");
    let sent: Value = serde_json::from_str(mock.last_request()["body"].as_str().unwrap()).unwrap();
    assert_eq!(sent["max_tokens"], 42, "{sent}");
}

/// A mock on a port of our choosing (the provider coming back).
struct Revived(Child);

impl Drop for Revived {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Item 7: calls to a provider nobody listens for (502
/// `upstream_unreachable`) never reached it, and cost nothing: six of
/// them leave the day's spend at 0 (each reserved 1002 of a $0.005 day,
/// which fits four), and once the provider is back the agent is admitted.
#[test]
fn calls_that_never_reached_a_provider_cost_nothing() {
    let mock = Mock::start();
    let port = free_port();
    let gw = start(&config(
        &mock.url(),
        &format!(
            "  dead: {{ kind: openai_compatible, base_url: \"http://127.0.0.1:{port}\", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY, breaker: {{ consecutive_failures: 100, min_requests: 1000 }} }}"
        ),
        "  - models: [flaky]\n    targets: [ { provider: dead } ]",
        "daily_usd: 0.005, default_max_tokens: 100",
    ));
    let flaky = BARE.replace("priced", "flaky");
    for i in 0..6 {
        let r = post_json(&gw, AGENT_KEY, "/v1/chat/completions", &[], &flaky);
        println!("call {i}: {} {}", r.status, r.json()["error"]["code"]);
        r.assert_gateway_error(502, "upstream_unreachable");
    }
    assert_eq!(spent_today(&gw), 0, "nothing was sent, nothing spent");
    // The provider comes back on its port.
    let mut child = Command::new(bin())
        .args(["mock", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the revived mock");
    assert!(
        eventually(10, || std::net::TcpStream::connect(("127.0.0.1", port))
            .is_ok()),
        "the revived mock listens"
    );
    assert!(child.try_wait().unwrap().is_none(), "it holds the port");
    let _revived = Revived(child);
    let args = ["-H", "x-mock-prompt-tokens: 2", "-H", "x-mock-chunks: 10"];
    let r = post_json(&gw, AGENT_KEY, "/v1/chat/completions", &args, &flaky);
    assert_eq!(r.status, 200, "{r:?}");
    // Settled on its usage: 2 + 10 x 10.
    assert_eq!(spent_today(&gw), 102);
}

/// Item 2: the official openai SDK at its defaults streams without
/// `stream_options`, and the provider (like OpenAI) then reports no usage:
/// the gateway asks for it on a priced route, settles on it (2 prompt
/// tokens + 300 output x 10 = 3,002 micro-dollars, where the reservation
/// alone was 1,002), and drops the usage chunk the SDK did not ask for
/// (`sdk/settle.py` checks every chunk it sees). An agent that asked
/// keeps its usage chunk.
#[test]
fn an_sdk_stream_without_stream_options_settles_on_the_providers_usage() {
    let mock = Mock::start();
    let gw = start(&config(
        &mock.url(),
        "",
        "",
        "daily_usd: 0.01, default_max_tokens: 100",
    ));
    let url = format!("http://{}", gw.addr);
    let out = run_sdk_script("settle.py", &[&url, AGENT_KEY, "300"], "sdk settle ok");
    print!("{out}");
    let spent = spent_today(&gw);
    println!("spent {spent} micro-dollars");
    assert_eq!(spent, 3002);
    let sent: Value = serde_json::from_str(mock.last_request()["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        sent["stream_options"],
        serde_json::json!({"include_usage": true})
    );
    // Asked for by the agent: passed on, and its usage chunk reaches it.
    let asked = r#"{"model":"priced","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    let args = [
        "-N",
        "-H",
        "x-mock-usage-if-asked: 1",
        "-H",
        "x-mock-prompt-tokens: 2",
        "-H",
        "x-mock-chunks: 10",
    ];
    let r = post_json(&gw, AGENT_KEY, "/v1/chat/completions", &args, asked);
    assert_eq!(r.status, 200, "{r:?}");
    let usage: Vec<Value> = r
        .text()
        .split("\n\n")
        .filter_map(|e| serde_json::from_str::<Value>(e.strip_prefix("data: ")?).ok())
        .filter(|c| c["choices"] == serde_json::json!([]))
        .map(|c| c["usage"].clone())
        .collect();
    assert_eq!(usage.len(), 1, "{}", r.text());
    assert_eq!(
        (&usage[0]["prompt_tokens"], &usage[0]["completion_tokens"]),
        (&serde_json::json!(2), &serde_json::json!(10))
    );
    assert_eq!(spent_today(&gw), 3002 + 102);
}

/// Item 2: an agent that leaves a stream early: its usage never comes,
/// and the call settles on what the gateway relayed (pieces of 40 bytes,
/// 10 tokens each at the prompt estimate's 4 bytes a token, 100
/// micro-dollars each), not on the 1,002 reserved.
#[test]
fn a_stream_the_agent_leaves_settles_on_what_was_relayed() {
    use std::io::{Read, Write};
    let mock = Mock::start();
    let gw = start(&config(
        &mock.url(),
        "",
        "",
        "daily_usd: 1, default_max_tokens: 100",
    ));
    let body = r#"{"model":"priced","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut s = std::net::TcpStream::connect(gw.addr).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {AGENT_KEY}\r\n\
         content-type: application/json\r\nx-mock-usage-if-asked: 1\r\nx-mock-prompt-tokens: 2\r\n\
         x-mock-chunks: 2000\r\nx-mock-piece-bytes: 40\r\nx-mock-chunk-delay-ms: 5\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let piece = format!("\"content\":\"{}\"", "x".repeat(40));
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while String::from_utf8_lossy(&got).matches(&piece).count() < 50 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early");
        got.extend_from_slice(&buf[..n]);
    }
    let read = String::from_utf8_lossy(&got).matches(&piece).count() as u64;
    drop(s);
    // In flight, the reservation counts; then the call settles.
    let mut spent = 0;
    let settled = eventually(10, || {
        spent = spent_today(&gw);
        spent != 1002
    });
    println!("read {read} pieces, then left; spent {spent} micro-dollars");
    assert!(settled, "still the reservation: {spent}");
    assert!(spent >= 2 + read * 100, "{spent} for {read} pieces read");
    assert_eq!((spent - 2) % 100, 0, "whole pieces: {spent}");
    assert!(
        spent < 2 + 2000 * 100,
        "the stream ended when the agent left"
    );
}

/// Item 2: a JSON answer past the usage reader's 4 MiB cap (1,100 pieces
/// of 4 KiB): its usage cannot be read, and it settles on the prompt
/// estimate and every byte relayed (4 bytes a token, 10 micro-dollars a
/// token), not on the 1,002 reserved.
#[test]
fn a_json_answer_past_the_usage_readers_cap_settles_on_its_bytes() {
    let mock = Mock::start();
    let gw = start(&config(
        &mock.url(),
        "",
        "",
        "daily_usd: 100, default_max_tokens: 100",
    ));
    let args = [
        "-H",
        "x-mock-prompt-tokens: 2",
        "-H",
        "x-mock-chunks: 1100",
        "-H",
        "x-mock-piece-bytes: 4096",
    ];
    let r = post_json(&gw, AGENT_KEY, "/v1/chat/completions", &args, BARE);
    assert_eq!(r.status, 200, "{}", r.status);
    let len = r.body.len() as u64;
    assert!(len > 4 * 1024 * 1024, "{len}");
    let spent = spent_today(&gw);
    println!("{len} bytes relayed; spent {spent} micro-dollars");
    assert_eq!(spent, 2 + len.div_ceil(4) * 10);
}
