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
    models: [priced, embed-priced, claude-translated, flaky]
    loop_guard: {{ enabled: false }}
    budgets: {{ {agent} }}
"#,
        key = sha256_hex(AGENT_KEY.as_bytes()),
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
