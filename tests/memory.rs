//! What judging allocates is charged against the gateway's body memory
//! (#35 item 2), over real sockets: with a small total
//! (`listen.connections.body_memory_bytes`), a large call in flight (held
//! at the mock by `x-mock-latency-ms`) and a second body whose raw bytes
//! fit beside it but whose judging does not, the second is refused with
//! 503 `gateway_overloaded` (JSON-RPC on `/mcp`), nothing of it reaches
//! the upstream, the first is answered whole, and once the first is done
//! the same second body passes. Without the charge the second passes at
//! once (these tests fail).

use loopgate_tests::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};

const MIB: usize = 1024 * 1024;
/// How long the mock holds the first call: it must still be in flight
/// while the second is judged (a loopback POST of a few MiB), and the
/// test waits for it once.
const HOLD_MS: &str = "x-mock-latency-ms: 5000";

/// A gateway whose bodies may hold `total` bytes, serving `gpt-4o-mini`
/// and the MCP server `files` to the test agent.
fn config(mock: &Mock, total: usize) -> String {
    format!(
        r#"
listen: {{ address: "127.0.0.1:{{PORT}}", connections: {{ body_memory_bytes: {total} }} }}
threads: 2
{providers}
models:
  gpt-4o-mini: {{ context_window: 1000000000 }}
mcp_servers:
  files:
    url: "{mock}/mcp"
    auth: {{ bearer_env: LOOPGATE_TEST_TOOL_KEY }}
policy:
  max_body_bytes: {max_body}
agents:
  tester:
    key_sha256: "{agent}"
    models: [gpt-4o-mini]
    mcp_access:
      files: {{ tools: [read_file] }}
"#,
        providers = oa_provider(mock, "gpt-4o-mini", ""),
        mock = mock.url(),
        max_body = 8 * MIB,
        agent = sha256_hex(AGENT_KEY.as_bytes()),
    )
}

/// A chat completion of about `size` bytes of plain text.
fn chat(size: usize) -> Vec<u8> {
    let text = "a".repeat(size - 100);
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]})
        .to_string()
        .into_bytes()
}

/// A `tools/call` of `read_file` with these arguments.
fn call(id: u64, arguments: Value) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "read_file", "arguments": arguments}})
    .to_string()
    .into_bytes()
}

/// `first` is sent and held at the mock; meanwhile `second` (whose raw
/// bytes fit beside it, but not with its judging) gets `refused`'s
/// checks. Then the first is answered whole, nothing of the second went
/// upstream, and the second passes once the first is done. `send` posts
/// a body, with extra curl arguments.
fn second_waits_for_the_first(
    mock: &Mock,
    first: &[u8],
    second: &[u8],
    send: &(dyn Fn(&[&str], &[u8]) -> Resp + Sync),
    refused: &dyn Fn(&Resp),
) {
    let first_done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let holder = s.spawn(|| {
            let r = send(&["-H", HOLD_MS], first);
            first_done.store(true, Ordering::SeqCst);
            r
        });
        assert!(
            eventually(20, || mock.received() == 1),
            "the first call reached the mock"
        );
        let r = send(&[], second);
        assert!(
            !first_done.load(Ordering::SeqCst),
            "the first call was answered before the second was judged: this run proves nothing"
        );
        refused(&r);
        let held = holder.join().expect("holder");
        assert_eq!(held.status, 200, "{}", held.text());
    });
    // Nothing of the refused body went upstream; the first went whole.
    let seen = mock.requests();
    assert_eq!(seen.len(), 1, "only the first call reached the mock");
    assert_eq!(seen[0]["body_sha256"], sha256_hex(first));
    // Its charges given back, the same second body passes.
    let r = send(&[], second);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(mock.requests()[1]["body_sha256"], sha256_hex(second));
}

#[test]
fn a_model_body_whose_judging_does_not_fit_is_refused_then_passes() {
    let mock = Mock::start();
    // 6 MiB in all. The first body, 2.75 MiB, holds its bytes while the
    // mock holds its call (its judging, as much again, fit on its own).
    // The second, 2.5 MiB: 5.25 MiB of bodies fit, 7.75 MiB with its
    // judging do not.
    let gw = Gateway::start(&config(&mock, 6 * MIB));
    let (first, second) = (chat(11 * MIB / 4), chat(5 * MIB / 2));
    let send = |extra: &[&str], body: &[u8]| {
        post_json(&gw, AGENT_KEY, "/v1/chat/completions", extra, body)
    };
    second_waits_for_the_first(&mock, &first, &second, &send, &|r| {
        r.assert_gateway_error(503, "gateway_overloaded");
        assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
    });
}

#[test]
fn an_mcp_body_whose_tree_does_not_fit_is_refused_then_passes() {
    let mock = Mock::start();
    // 8 MiB in all. The first body is 3.5 MiB of text (its tree costs
    // about its size). The second is 96 KiB of small numbers, whose
    // `serde_json::Value` tree costs ~48 bytes a number of 2 bytes
    // (4.5 MiB charged): the bodies fit (3.6 MiB), the tree beside them
    // does not (8.1 MiB).
    let gw = Gateway::start(&config(&mock, 8 * MIB));
    let first = call(1, json!({"path": "a".repeat(7 * MIB / 2)}));
    let second = call(2, json!({"path": "/a", "v": vec![0; 48 * 1024]}));
    let send = |extra: &[&str], body: &[u8]| post_mcp(&gw, AGENT_KEY, "files", extra, body);
    second_waits_for_the_first(&mock, &first, &second, &send, &|r| {
        r.assert_rpc_error(503, Value::Null, "gateway_overloaded");
    });
    // A tree that could never fit the total is refused for good, not as
    // an overload to retry: 512 KiB of small numbers (~24 MiB of tree).
    let r = post_mcp(
        &gw,
        AGENT_KEY,
        "files",
        &[],
        call(3, json!({"v": vec![0; 256 * 1024]})),
    );
    r.assert_rpc_error(413, Value::Null, "body_too_large");
    assert_eq!(mock.received(), 2, "nothing more reached the mock");
}

/// A gateway with `total` bytes of body memory, routing `gpt-4o-mini` to
/// an OpenAI-compatible provider and `claude-3-5-haiku*` to Anthropic,
/// for an agent that may call any model.
fn both_families(mock: &Mock, total: usize) -> Gateway {
    Gateway::start(&format!(
        r#"
listen: {{ address: "127.0.0.1:{{PORT}}", connections: {{ body_memory_bytes: {total} }} }}
threads: 2
{providers}
agents:
  tester:
    key_sha256: "{agent}"
    models: ["*"]
"#,
        providers = oa_an_providers(mock, ""),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
    ))
}

/// A call whose route translates it to the other API family is charged
/// for the trees translation builds (twice `parse_cost`'s bound): a
/// Messages body of many tiny schema objects, 128 KiB raw, would hold
/// ~12 MiB translated and is refused (413 `body_too_large`) under a 4 MiB
/// total, before anything is sent; the same body to an Anthropic route
/// (no translation) passes.
#[test]
fn a_translated_body_is_charged_for_its_trees() {
    let mock = Mock::start();
    let gw = both_families(&mock, 4 * MIB);
    let properties: serde_json::Map<String, Value> = (0..9000)
        .map(|i| (format!("p{i}"), json!({"t": 1})))
        .collect();
    let body = |model: &str| {
        json!({
            "model": model, "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": {"type": "object", "properties": properties}}],
        })
        .to_string()
    };
    let key = format!("x-api-key: {AGENT_KEY}");
    let messages = gw.url("/v1/messages");
    // gpt-4o-mini is served by the OpenAI-compatible provider: translated.
    let translated = body("gpt-4o-mini");
    assert!(translated.len() > 100 * 1024, "{}", translated.len());
    let r = curl_body(&[&messages, "-H", &key], translated.as_bytes());
    r.assert_gateway_error(413, "body_too_large");
    assert!(mock.requests().is_empty(), "nothing was sent");
    // The same body to an Anthropic model: no translation, no trees.
    let r = curl_body(
        &[&messages, "-H", &key],
        body("claude-3-5-haiku-latest").as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A JSON answer translated back into the agent's family is gathered
/// whole, and charged against the body memory as it grows: under a
/// 256 KiB total, an OpenAI answer of ~480 KiB for an Anthropic agent
/// (`x-mock-chunks: 100000`) is refused before its header goes on, 503
/// `gateway_overloaded` in the agent's family; a small one passes, and
/// passes again after the refusal (what it held was given back). With
/// the charge taken out the big answer gets 200 (this test fails).
#[test]
fn a_translated_answer_is_charged_as_it_is_gathered() {
    let mock = Mock::start();
    let gw = both_families(&mock, 256 * 1024);
    let key = format!("x-api-key: {AGENT_KEY}");
    let messages = gw.url("/v1/messages");
    // gpt-4o-mini is served by the OpenAI-compatible provider: translated.
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 10,
                      "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let send = |chunks: usize| {
        let c = format!("x-mock-chunks: {chunks}");
        curl_body(&[&messages, "-H", &key, "-H", &c], body.as_bytes())
    };
    let small = send(20);
    assert_eq!(small.status, 200, "{}", small.text());
    assert_eq!(small.json()["type"], "message");

    let r = send(100_000);
    assert_eq!(r.status, 503, "{}", &r.text()[..r.text().len().min(300)]);
    assert_eq!(r.header("x-loopgate-error"), Some("gateway_overloaded"));
    let e = r.json();
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["error"]["type"], "overloaded_error", "{e}");
    let message = e["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("provider's answer"), "{message}");
    assert_eq!(mock.received(), 2, "the big answer's call went upstream");

    // Its charge given back, a small answer passes again.
    let again = send(20);
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.json()["type"], "message");
}

/// The gateway's resident memory (`VmRSS`) or its peak (`VmHWM`), KiB.
fn vm_kib(gw: &Gateway, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", gw.pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/<pid>/status"))
}

const BULK_KEY: &str = "memory-bulk-agent-key-07";

/// Issue 41 item 14: forty connections of one agent (`max_in_flight: 2`,
/// `max_body_bytes: 8 MiB`: a share of 16 MiB and the read buffers of
/// two bodies), each sending all but the last byte of an 8 MiB body as
/// fast as the gateway takes it. The bodies past the share are refused
/// before anything of them is read, so the gateway's peak memory grows
/// by the share plus a small constant per connection; other agents are
/// served meanwhile. It grew by 52-68 MiB (up to 4x the share) when
/// bodies were charged as they were read.
#[test]
fn one_agents_slow_bodies_hold_no_more_than_its_share() {
    use std::io::Write;
    let mock = Mock::start();
    let yaml = format!(
        r#"{}
  bulk:
    key_sha256: "{}"
    models: [gpt-4o-mini]
    max_in_flight: 2
    max_body_bytes: {}
"#,
        config(&mock, 512 * MIB),
        sha256_hex(BULK_KEY.as_bytes()),
        8 * MIB
    );
    let gw = Gateway::start(&yaml);
    // Warm: the first calls' lazily built state is not the bodies'.
    for key in [AGENT_KEY, BULK_KEY] {
        let r = post_json(&gw, key, "/v1/chat/completions", &[], chat(1000));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let base = vm_kib(&gw, "VmRSS");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {BULK_KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        8 * MIB
    );
    let senders: Vec<_> = (0..40)
        .map(|_| {
            let head = head.clone();
            let addr = gw.addr;
            std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                let piece = vec![b' '; 64 * 1024];
                let mut left = 8 * MIB - 1;
                let mut sent = s.write_all(head.as_bytes());
                while sent.is_ok() && left > 0 {
                    let n = left.min(piece.len());
                    sent = s.write_all(&piece[..n]);
                    left -= n;
                }
                // Kept open (the refused ones the gateway closed).
                s
            })
        })
        .collect();
    let held: Vec<_> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    // Two bodies are taken (all but their last byte in memory); the
    // rest are refused.
    let refused = || gw.metric_or_absent(r#"loopgate_denials_total{code="too_many_in_flight"}"#);
    assert!(
        eventually(20, || refused() >= Some(38.0)),
        "{:?}",
        refused()
    );
    assert!(
        eventually(20, || vm_kib(&gw, "VmRSS") >= base + 15 * 1024),
        "the bodies taken are not in memory: {} KiB over {base}",
        vm_kib(&gw, "VmRSS").saturating_sub(base)
    );
    let grew = vm_kib(&gw, "VmHWM").saturating_sub(base);
    // The share (two 8 MiB bodies and their read buffers), 256 KiB for
    // each of the forty connections, 2 MiB for the rest of the process.
    let bound = (2 * (8 * MIB + 128 * 1024) + 40 * 256 * 1024 + 2 * MIB) / 1024;
    assert!(
        grew <= bound as u64,
        "the gateway grew by {grew} KiB holding one agent's bodies (bound {bound} KiB)"
    );
    // Exactly the bodies past the share were refused, 429
    // too_many_in_flight: none taken could crowd out another.
    assert_eq!(refused(), Some(38.0));
    // Other agents are served meanwhile.
    let r = post_json(&gw, AGENT_KEY, "/v1/chat/completions", &[], chat(1000));
    assert_eq!(r.status, 200, "{}", r.text());
    drop(held);
    // The share comes back once the connections close.
    assert!(eventually(10, || {
        post_json(&gw, BULK_KEY, "/v1/chat/completions", &[], chat(1000)).status == 200
    }));
}
