//! The second hardening pass (issue 33) over real sockets: what still got
//! through at 5c29c38. Each case checks the status, the error's shape,
//! that nothing reached the upstream, and that the gateway still serves.

use loopgate_tests::*;
use serde_json::{json, Value};

const SEARCH_KEY: &str = "hardening-search-key-0007";

fn config(mock: &Mock) -> String {
    format!(
        r#"
{head}
mcp_servers:
  files:
    url: "{mock}/mcp"
agents:
  tester:
    key_sha256: "{agent}"
    models: [gpt-4o-mini, gpt-4o-search-preview]
    tools: [lookup_invoice]
    required_headers: [x-agent-task-id]
    loop_guard: {{ window: 10, repeats: 3 }}
    mcp_access:
      files: {{ tools: [read_file], resources: ["file:///public/*"] }}
  searcher:
    key_sha256: "{search}"
    models: [gpt-4o-search-preview]
    tools: [web_search]
"#,
        mock = mock.url(),
        head = config_head(mock, "gpt-4o-mini, gpt-4o-search-preview", ""),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
        search = sha256_hex(SEARCH_KEY.as_bytes()),
    )
}

fn chat(gw: &Gateway, key: &str, headers: &[&str], body: &Value) -> Resp {
    let args: Vec<&str> = headers.iter().flat_map(|h| ["-H", h]).collect();
    post_json(gw, key, "/v1/chat/completions", &args, body.to_string())
}

fn hi(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
}

/// `web_search_options` runs a web search at OpenAI's search models: it is
/// a tool, granted as `web_search` or refused.
#[test]
fn web_search_options_is_judged_as_the_web_search_tool() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let mut body = hi("gpt-4o-search-preview");
    for opts in [json!({}), json!({"search_context_size": "high"})] {
        body["web_search_options"] = opts;
        let r = chat(&gw, AGENT_KEY, &["x-agent-task-id: s1"], &body);
        r.assert_gateway_error(403, "tool_not_allowed");
        assert!(r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("web_search"));
    }
    body["web_search_options"] = json!("on");
    chat(&gw, AGENT_KEY, &["x-agent-task-id: s2"], &body)
        .assert_gateway_error(400, "invalid_request");
    assert_eq!(mock.requests().len(), 0, "nothing reached the provider");

    // Granted: it goes upstream as sent.
    body["web_search_options"] = json!({});
    let r = chat(&gw, SEARCH_KEY, &[], &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(mock.requests().len(), 1);
    // Off (`null`) is no tool.
    body["web_search_options"] = Value::Null;
    let r = chat(&gw, AGENT_KEY, &["x-agent-task-id: s3"], &body);
    assert_eq!(r.status, 200, "{}", r.text());
}

/// One reader of the task id: what passes the required-header rule is
/// what the loop guard and the watchdog key on, or the request is 400.
#[test]
fn a_task_id_is_valid_or_refused_never_ignored() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let long = format!("x-agent-task-id: {}", "t".repeat(129));
    for header in [
        "x-agent-task-id: task 2",
        "x-agent-task-id: task/2",
        "x-agent-task-id: t\u{e2}che",
        long.as_str(),
        "x-agent-task-id: a\"b",
    ] {
        let r = chat(&gw, AGENT_KEY, &[header], &hi("gpt-4o-mini"));
        r.assert_gateway_error(400, "invalid_header");
        assert_eq!(r.json()["error"]["retryable"], false);
    }
    // Two of them: which one would the guards read?
    let r = chat(
        &gw,
        AGENT_KEY,
        &["x-agent-task-id: t1", "x-agent-task-id: t2"],
        &hi("gpt-4o-mini"),
    );
    r.assert_gateway_error(400, "invalid_header");
    assert_eq!(mock.requests().len(), 0, "nothing reached the provider");

    // A valid one is the guards' key: the third identical call is a loop.
    let statuses: Vec<u16> = (0..4)
        .map(|_| {
            chat(
                &gw,
                AGENT_KEY,
                &["x-agent-task-id: task-2"],
                &hi("gpt-4o-mini"),
            )
            .status
        })
        .collect();
    assert_eq!(statuses, [200, 200, 409, 409]);
    assert_eq!(mock.requests().len(), 2);
}

/// A query or fragment with dot segments would leave the granted prefix
/// at a server that normalises the whole string.
#[test]
fn mcp_resource_uris_with_dot_segments_after_a_query_or_fragment_are_refused() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let read = |id: u64, uri: &str| {
        let body =
            json!({"jsonrpc": "2.0", "id": id, "method": "resources/read", "params": {"uri": uri}});
        let task = ["-H", "x-agent-task-id: mcp-1"];
        post_mcp(&gw, AGENT_KEY, "files", &task, body.to_string())
    };
    for (i, uri) in [
        "file:///public/a?/../../secret/k",
        "file:///public/a#/../../secret/k",
        "file:///public/a?x=/../../../etc/passwd",
        "file:///public/a?x=%2e%2e%2f%2e%2e%2fsecret",
        "file:///public/a#..",
    ]
    .into_iter()
    .enumerate()
    {
        let r = read(i as u64 + 1, uri);
        assert_eq!(r.status, 200, "{uri}: {}", r.text());
        let v = r.json();
        assert_eq!(v["id"], i as u64 + 1, "{uri}: {v}");
        assert_eq!(
            v["error"]["data"]["loopgate_code"], "invalid_path",
            "{uri}: {v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("query or fragment"),
            "{uri}: {v}"
        );
    }
    assert_eq!(mock.requests().len(), 0, "nothing reached the server");
}

const FLOOD_KEY: &str = "hardening-flood-key-0008";

/// One agent's fresh task ids, refused calls included, never push out
/// another agent's guard state or MCP sessions.
#[test]
fn one_agent_cannot_switch_off_another_agents_guards() {
    let mock = Mock::start();
    let gw = Gateway::start(&format!(
        r#"
{head}
state: {{ backend: memory, tasks_per_agent: 20, sessions_per_agent: 2 }}
mcp_servers:
  files:
    url: "{mock}/mcp"
agents:
  victim:
    key_sha256: "{victim}"
    models: [gpt-4o-mini]
    loop_guard: {{ window: 10, repeats: 3 }}
    watchdog: {{ red: {{ steps: 5 }}, action: stop }}
    mcp_access:
      files: {{ tools: [read_file] }}
  flooder:
    key_sha256: "{flood}"
    models: [gpt-4o-mini]
    loop_guard: {{ window: 10, repeats: 3 }}
    watchdog: {{ red: {{ steps: 5 }}, action: stop }}
    mcp_access:
      files: {{ tools: [read_file] }}
"#,
        mock = mock.url(),
        head = config_head(
            &mock,
            "gpt-4o-mini",
            "breaker: { consecutive_failures: 2, open_ms: 1500, isolate_by: agent }"
        ),
        victim = sha256_hex(AGENT_KEY.as_bytes()),
        flood = sha256_hex(FLOOD_KEY.as_bytes()),
    ));
    let task = |t: &str| format!("x-agent-task-id: {t}");
    let initialize = |key: &str| {
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
        post_mcp(&gw, key, "files", &[], init.to_string())
    };
    // The victim's state: a loop two calls in, a watchdog four steps in,
    // an MCP session.
    let mut differing = hi("gpt-4o-mini");
    for _ in 0..2 {
        assert_eq!(
            chat(&gw, AGENT_KEY, &[&task("loop-1")], &hi("gpt-4o-mini")).status,
            200
        );
    }
    for i in 0..4 {
        differing["messages"][0]["content"] = json!(format!("step {i}"));
        assert_eq!(
            chat(&gw, AGENT_KEY, &[&task("steps-1")], &differing).status,
            200
        );
    }
    let r = initialize(AGENT_KEY);
    assert_eq!(r.status, 200, "{}", r.text());
    let sid = r.header("mcp-session-id").unwrap().to_string();

    // The flood: fresh task ids, five times the per-agent bound, half of
    // them refused by the flooder's own open breaker; sessions past its
    // bound.
    for i in 0..100 {
        let status = if i % 2 == 0 { "500" } else { "200" };
        chat(
            &gw,
            FLOOD_KEY,
            &[
                &task(&format!("f-{i}")),
                &format!("x-mock-status: {status}"),
            ],
            &hi("gpt-4o-mini"),
        );
    }
    for _ in 0..2 {
        assert_eq!(initialize(FLOOD_KEY).status, 200);
    }
    // Past its session bound: refused in-band (JSON-RPC answers a judged
    // message with HTTP 200), the session id withheld.
    let r = initialize(FLOOD_KEY);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], 1);
    assert_eq!(
        r.json()["error"]["data"]["loopgate_code"],
        "too_many_in_flight"
    );
    assert!(r.header("mcp-session-id").is_none(), "{r:?}");

    // The victim's guards still hold.
    chat(&gw, AGENT_KEY, &[&task("loop-1")], &hi("gpt-4o-mini"))
        .assert_gateway_error(409, "loop_detected");
    differing["messages"][0]["content"] = json!("step 4");
    chat(&gw, AGENT_KEY, &[&task("steps-1")], &differing).assert_gateway_error(429, "task_stopped");
    let r = post_mcp(
        &gw,
        AGENT_KEY,
        "files",
        &["-H", &format!("mcp-session-id: {sid}")],
        r#"{"jsonrpc":"2.0","id":2,"method":"ping","params":{}}"#,
    );
    assert_eq!(r.status, 200, "the victim's session lives: {}", r.text());
}

/// A call refused because every target's circuit is open makes no task
/// state: once the circuit closes, the same call is not a repeat.
#[test]
fn calls_refused_by_an_open_circuit_leave_no_task_state() {
    let mock = Mock::start();
    let gw = Gateway::start(&format!(
        r#"
{head}
agents:
  tester:
    key_sha256: "{agent}"
    models: [gpt-4o-mini]
    loop_guard: {{ window: 10, repeats: 3 }}
"#,
        head = config_head(
            &mock,
            "gpt-4o-mini",
            "breaker: { consecutive_failures: 1, open_ms: 1000 }"
        ),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
    ));
    let r = chat(&gw, AGENT_KEY, &["x-mock-status: 500"], &hi("gpt-4o-mini"));
    assert_eq!(r.status, 500);
    let before = mock.requests().len();
    for _ in 0..3 {
        chat(
            &gw,
            AGENT_KEY,
            &["x-agent-task-id: t-1"],
            &hi("gpt-4o-mini"),
        )
        .assert_gateway_error(503, "circuit_open");
    }
    assert_eq!(mock.requests().len(), before);
    std::thread::sleep(std::time::Duration::from_millis(1200));
    // Three refused identical calls counted nothing: these two pass.
    for _ in 0..2 {
        let r = chat(
            &gw,
            AGENT_KEY,
            &["x-agent-task-id: t-1"],
            &hi("gpt-4o-mini"),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    chat(
        &gw,
        AGENT_KEY,
        &["x-agent-task-id: t-1"],
        &hi("gpt-4o-mini"),
    )
    .assert_gateway_error(409, "loop_detected");
}
