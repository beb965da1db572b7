//! The MCP gateway end to end: agents -> Loopgate -> an MCP server (the
//! mock's, over real sockets) with curl; the official `mcp` Python SDK
//! (client and server) in tests/mcp/, at its current 2.x release and, in
//! tests/mcp/v1/, at 1.x; README's MCP example.

use loopgate_tests::*;
use serde_json::{json, Value};

const OTHER_KEY: &str = "mcp-other-agent-key-9";
const TRIAL_KEY: &str = "mcp-trial-agent-key-3";

fn config(mock: &Mock, extra_server: &str) -> String {
    format!(
        r#"
{head}
admin: {{ listen: "127.0.0.1:{{ADMIN_PORT}}" }}
mcp_servers:
  files:
    url: "{mock}/mcp"
    auth: {{ bearer_env: LOOPGATE_TEST_TOOL_KEY }}
    writes: ["delete_*", "write_*"]
    noise_fields: [request_id]
    breaker: {{ consecutive_failures: 2, open_ms: 60000 }}
{extra_server}
agents:
  tester:
    key_sha256: "{agent}"
    models: [gpt-4o-mini]
    loop_guard: {{ window: 10, repeats: 3 }}
    mcp_access:
      files: {{ tools: [read_file, "search*", write_note], write_calls_per_minute: 2 }}
  other:
    key_sha256: "{other}"
    models: [gpt-4o-mini]
    mcp_access:
      files: {{ tools: [read_file] }}
  narrow:
    key_sha256: "{narrow}"
    models: [gpt-4o-mini]
  trial:
    key_sha256: "{trial}"
    models: [gpt-4o-mini]
    dry_run: [tool_not_allowed]
    mcp_access:
      files: {{ tools: [read_file] }}
"#,
        mock = mock.url(),
        head = config_head(mock, "gpt-4o-mini", ""),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
        other = sha256_hex(OTHER_KEY.as_bytes()),
        narrow = sha256_hex(NARROW_KEY.as_bytes()),
        trial = sha256_hex(TRIAL_KEY.as_bytes()),
    )
}

fn rpc(gw: &Gateway, key: &str, body: &Value, extra: &[&str]) -> Resp {
    post_mcp(gw, key, "files", extra, body.to_string())
}

fn msg(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

fn tool_call(id: u64, params: Value) -> Value {
    msg(id, "tools/call", params)
}

fn initialize(gw: &Gateway, key: &str) -> String {
    let r = rpc(
        gw,
        key,
        &msg(
            1,
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
        ),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("mcp-session-id")
        .expect("a session id")
        .to_string()
}

/// Opens a session as `key`: its `mcp-session-id` header line.
fn session(gw: &Gateway, key: &str) -> String {
    format!("mcp-session-id: {}", initialize(gw, key))
}

/// The JSON-RPC messages of an SSE body.
fn sse_messages(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|ev| {
            let data: Vec<&str> = ev
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect();
            (!data.is_empty()).then(|| serde_json::from_str(&data.join("\n")).unwrap())
        })
        .collect()
}

fn names(result: &Value) -> Vec<String> {
    result["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn listing_shows_only_granted_tools_in_json_and_sse() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock, ""));
    let sid = initialize(&gw, AGENT_KEY);
    let s = format!("mcp-session-id: {sid}");
    let r = rpc(
        &gw,
        AGENT_KEY,
        &msg(2, "tools/list", json!({})),
        &["-H", &s],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        names(&r.json()["result"]),
        ["read_file", "search_docs", "write_note"]
    );
    // The server saw the gateway's credential, never the agent's key.
    let seen = mock.last_request();
    assert_eq!(
        recorded_header(&seen, "authorization"),
        Some(format!("Bearer {TOOL_KEY}").as_str())
    );
    assert_eq!(recorded_header(&seen, "mcp-session-id"), Some(sid.as_str()));

    // SSE: the progress event passes as is, the list result is filtered.
    let r = rpc(
        &gw,
        AGENT_KEY,
        &msg(3, "tools/list", json!({})),
        &["-H", &s, "-H", "x-mock-mcp-sse: 1"],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let msgs = sse_messages(&r.text());
    assert_eq!(msgs[0]["method"], "notifications/message");
    assert_eq!(
        names(&msgs[1]["result"]),
        ["read_file", "search_docs", "write_note"]
    );

    // Another agent's grant gives another list.
    let s2 = session(&gw, OTHER_KEY);
    let r = rpc(
        &gw,
        OTHER_KEY,
        &msg(2, "tools/list", json!({})),
        &["-H", &s2],
    );
    assert_eq!(names(&r.json()["result"]), ["read_file"]);
}

#[test]
fn calls_outside_the_grant_are_answered_by_the_gateway_and_never_sent() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock, ""));
    let s = session(&gw, AGENT_KEY);
    let r = rpc(
        &gw,
        AGENT_KEY,
        &tool_call(5, json!({"name": "read_file", "arguments": {"path": "/a"}})),
        &["-H", &s],
    );
    assert_eq!(
        r.json()["result"]["content"][0]["text"],
        "read_file called with {\"path\":\"/a\"}"
    );
    let before = mock.requests().len();
    for (body, code) in [
        (
            tool_call(
                6,
                json!({"name": "delete_file", "arguments": {"path": "/"}}),
            ),
            "tool_not_allowed",
        ),
        (
            msg(7, "sampling/createMessage", json!({})),
            "method_not_allowed",
        ),
        (
            json!([
                tool_call(8, json!({"name": "read_file"})),
                tool_call(9, json!({"name": "delete_file"}))
            ]),
            "tool_not_allowed",
        ),
    ] {
        let r = rpc(&gw, AGENT_KEY, &body, &["-H", &s]);
        assert_eq!(r.status, 200, "a JSON-RPC error, in a 200");
        assert_eq!(r.header("x-loopgate-error"), Some(code));
        let v = r.json();
        let e = if v.is_array() { &v[0] } else { &v };
        assert_eq!(e["error"]["data"]["loopgate_code"], code);
        assert_eq!(e["error"]["data"]["retryable"], false);
        assert_eq!(e["id"], body.get("id").cloned().unwrap_or(json!(9)));
    }
    assert_eq!(mock.requests().len(), before, "the server saw nothing");

    // No grant for the server at all: 403, with a JSON-RPC error body.
    let r = rpc(&gw, NARROW_KEY, &msg(1, "tools/list", json!({})), &[]);
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json()["error"]["data"]["loopgate_code"],
        "tool_not_allowed"
    );
    assert_eq!(mock.requests().len(), before);
    // The audit line and metrics.
    assert_eq!(
        gw.metric("loopgate_mcp_requests_total{decision=\"deny\",server=\"files\",tool=\"other\"}"),
        2.0
    );
    assert_eq!(
        gw.metric(
            "loopgate_mcp_requests_total{decision=\"allow\",server=\"files\",tool=\"read_file\"}"
        ),
        1.0
    );
}

#[test]
fn a_session_belongs_to_the_agent_that_opened_it() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock, ""));
    let sid = initialize(&gw, AGENT_KEY);
    let before = mock.requests().len();
    let r = rpc(
        &gw,
        OTHER_KEY,
        &tool_call(2, json!({"name": "read_file"})),
        &["-H", &format!("mcp-session-id: {sid}")],
    );
    // Bound under its owner's name: to anyone else it does not exist (404,
    // as an unknown one; no sign that another agent holds it).
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["data"]["loopgate_code"], "not_found");
    let r = rpc(
        &gw,
        AGENT_KEY,
        &msg(2, "ping", json!({})),
        &["-H", "mcp-session-id: made-up"],
    );
    assert_eq!(r.status, 404, "an unknown session: initialize again");
    assert_eq!(mock.requests().len(), before);
}

#[test]
fn looping_calls_and_write_rates_are_stopped_as_json_rpc_errors() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock, ""));
    let s = session(&gw, AGENT_KEY);
    let task = "x-agent-task-id: mcp-task-1";
    // request_id is noise: the three calls are the same call.
    for i in 0..2 {
        let call = tool_call(
            10 + i,
            json!({"name": "search_docs", "arguments": {"q": "refund", "request_id": i}}),
        );
        assert!(rpc(&gw, AGENT_KEY, &call, &["-H", &s, "-H", task])
            .json()
            .get("result")
            .is_some());
    }
    let before = mock.requests().len();
    let call = tool_call(
        12,
        json!({"name": "search_docs", "arguments": {"q": "refund", "request_id": 99}}),
    );
    let r = rpc(&gw, AGENT_KEY, &call, &["-H", &s, "-H", task]);
    assert_eq!(r.json()["id"], 12);
    assert_eq!(r.json()["error"]["data"]["loopgate_code"], "loop_detected");
    assert_eq!(mock.requests().len(), before);

    // write_note is a write tool: 2 per minute for this agent.
    for i in 0..2 {
        let call = tool_call(20 + i, json!({"name": "write_note", "arguments": {"n": i}}));
        assert!(rpc(&gw, AGENT_KEY, &call, &["-H", &s])
            .json()
            .get("result")
            .is_some());
    }
    let r = rpc(
        &gw,
        AGENT_KEY,
        &tool_call(22, json!({"name": "write_note", "arguments": {"n": 3}})),
        &["-H", &s],
    );
    assert_eq!(r.json()["error"]["data"]["loopgate_code"], "rate_limited");
    assert_eq!(r.json()["error"]["data"]["retryable"], true);
    assert!(r.header("retry-after").is_some());
}

#[test]
fn a_server_answering_500_trips_its_breaker() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock, ""));
    let s = session(&gw, AGENT_KEY);
    for _ in 0..2 {
        let r = rpc(
            &gw,
            AGENT_KEY,
            &msg(2, "ping", json!({})),
            &["-H", &s, "-H", "x-mock-status: 500"],
        );
        assert_eq!(r.status, 500);
    }
    let before = mock.requests().len();
    let r = rpc(&gw, AGENT_KEY, &msg(3, "ping", json!({})), &["-H", &s]);
    // Refused in JSON-RPC, answering the message's id, with the HTTP status.
    assert_eq!(r.status, 503);
    let v = r.json();
    assert_eq!(v["jsonrpc"], "2.0", "{v}");
    assert_eq!(v["id"], 3, "{v}");
    assert_eq!(v["error"]["code"], -32001, "{v}");
    assert_eq!(v["error"]["data"]["loopgate_code"], "circuit_open", "{v}");
    assert_eq!(v["error"]["data"]["retryable"], true, "{v}");
    assert_eq!(
        v["error"]["data"]["request_id"].as_str(),
        r.header("x-request-id"),
        "{v}"
    );
    assert!(r.header("retry-after").is_some());
    assert_eq!(mock.requests().len(), before);
    // A JSON-RPC error result does not count: only transport and 5xx do.
}

/// The official `mcp` Python SDK at its current release (2.x, pinned in
/// tests/requirements.txt), client and server, through Loopgate. The
/// client's default `auto` mode probes `server/discover`, which the
/// gateway refuses, and falls back to the initialize handshake: the
/// session runs the 2025-11-25 protocol (README, "MCP servers").
#[test]
fn the_official_mcp_sdk_works_through_the_gateway() {
    for mode in ["sse", "json"] {
        let v = official_sdk_session(&python(), "mcp", mode);
        assert!(
            v["mcp_version"]
                .as_str()
                .is_some_and(|s| s.starts_with("2.")),
            "{mode}: the 2.x SDK (run tests/setup-python.sh): {v}"
        );
        assert_eq!(v["protocol_version"], "2025-11-25", "{mode}: {v}");
    }
}

/// README's MCP example as a new user pastes it, against the demo's
/// config (the mock's MCP server `files`, the demo agent's grant) with the
/// current SDK. Issue 42: on mcp 2.x it failed at its first line
/// (`cannot import name 'streamablehttp_client'`). It lists the granted
/// tools only and prints the protocol the `auto` mode fell back to.
#[test]
fn readmes_mcp_example_runs_on_the_current_sdk() {
    let mock = Mock::start();
    let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../conf/demo.yaml"))
        .expect("conf/demo.yaml")
        .replace("127.0.0.1:8080", "127.0.0.1:{PORT}")
        .replace("127.0.0.1:9091", "127.0.0.1:{ADMIN_PORT}")
        .replace("http://127.0.0.1:18081", &mock.url());
    let gw = Gateway::start_with_env(
        &yaml,
        &[
            ("LOOPGATE_DEMO_UPSTREAM_KEY", "demo-upstream-key"),
            ("LOOPGATE_ADMIN_TOKEN", "demo-admin-token"),
        ],
    );
    let example = documented_python("/mcp/files");
    assert!(
        example.contains("http://127.0.0.1:8080/mcp/files"),
        "{example}"
    );
    let example = example.replace("http://127.0.0.1:8080", &gw.url(""));
    let python = python();
    let out = std::process::Command::new(&python)
        .args(["-c", &example])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "README's MCP example failed ({}):\n{}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        ["['read_file', 'search_docs']", "2025-11-25"],
        "{example}"
    );
    // The SDK's one `server/discover` probe, refused by the gateway
    // (method_not_allowed), is the connection's only denial.
    assert_eq!(
        gw.metric(r#"loopgate_mcp_requests_total{decision="deny",server="files",tool="-"}"#),
        1.0
    );
}

/// The first ```python block of README.md (or of a page under docs/, where
/// the reference may move) that contains `needle`.
fn documented_python(needle: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut pages = vec![root.join("README.md")];
    if let Ok(docs) = std::fs::read_dir(root.join("docs")) {
        let mut docs: Vec<_> = docs.filter_map(|e| e.ok().map(|e| e.path())).collect();
        docs.sort();
        pages.extend(
            docs.into_iter()
                .filter(|p| p.extension().is_some_and(|e| e == "md")),
        );
    }
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap_or_default();
        for block in text.split("```python\n").skip(1) {
            let code = block.split("\n```").next().unwrap_or_default();
            if code.contains(needle) {
                return format!("{code}\n");
            }
        }
    }
    panic!("no python example with {needle} in README.md or docs/");
}

/// The 1.x SDK (`mcp==1.26.0`, tests/requirements-mcp1.txt), client and
/// FastMCP server (tests/mcp/v1/), still works through the gateway.
#[test]
fn the_mcp_sdk_1x_still_works_through_the_gateway() {
    let v = official_sdk_session(&python_mcp1(), "mcp/v1", "sse");
    assert_eq!(
        v["mcp_version"], "1.26.0",
        "the 1.x SDK (run tests/setup-python.sh): {v}"
    );
    assert_eq!(v["protocol_version"], "2025-11-25", "{v}");
}

/// Runs the official SDK's server (`{scripts}/server.py`, answering in
/// `mode`) behind the gateway and its client (`{scripts}/client.py`)
/// through it with `python`; checks what both ends saw and returns the
/// client's report.
fn official_sdk_session(python: &std::path::Path, scripts: &str, mode: &str) -> Value {
    let scripts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(scripts);
    let dir = scratch_dir("mcp-sdk");
    let log = dir.join("calls.jsonl");
    std::fs::write(&log, "").unwrap();
    let (_server, port) = serve_on_a_free_port("the MCP SDK server", |port| {
        std::process::Command::new(python)
            .arg(scripts.join("server.py"))
            .args([port.to_string(), mode.to_string()])
            .env("MCP_TEST_LOG", &log)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python with the mcp SDK (tests/setup-python.sh)")
    });
    let server = format!(
        "  sdk:\n    url: \"http://127.0.0.1:{port}/mcp\"\n    writes: [\"delete_*\", \"write_*\"]\n"
    );
    let yaml = config(&Mock::start(), &server)
        .replace(
            "      files: { tools: [read_file, \"search*\", write_note], write_calls_per_minute: 2 }",
            "      files: { tools: [read_file, \"search*\", write_note], write_calls_per_minute: 2 }\n      sdk: { tools: [read_file, \"search*\"] }",
        )
        .replace(
            "      files: { tools: [read_file] }",
            "      files: { tools: [read_file] }\n      sdk: { tools: [read_file] }",
        );
    let gw = Gateway::start(&yaml);
    let out = std::process::Command::new(python)
        .arg(scripts.join("client.py"))
        .args([&gw.url("/mcp/sdk"), AGENT_KEY, OTHER_KEY])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{mode}: client failed ({}): {}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["server_name"], "loopgate-test", "{mode}");
    assert_eq!(
        v["tools"],
        json!(["read_file", "search_docs"]),
        "{mode}: only granted tools"
    );
    assert_eq!(v["read_file"], "contents of /etc/motd");
    assert_eq!(v["delete_file"]["loopgate_code"], "tool_not_allowed");
    assert_eq!(v["delete_file"]["retryable"], false);
    assert_eq!(v["loop"][0], "3 results for refund policy");
    assert_eq!(
        v["loop"][2]["loopgate_code"], "loop_detected",
        "{mode}: {v}"
    );
    assert_eq!(v["hijack"]["status"], 404);
    assert_eq!(
        v["hijack"]["body"]["error"]["data"]["loopgate_code"],
        "not_found"
    );
    // What reached the server: the allowed calls only.
    let calls: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let tools: Vec<&str> = calls.iter().map(|c| c["tool"].as_str().unwrap()).collect();
    assert_eq!(tools, ["read_file", "search_docs", "search_docs"], "{mode}");
    v
}

#[test]
fn dry_run_lets_the_call_through_and_records_the_would_deny() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock, ""));
    let s = session(&gw, TRIAL_KEY);
    let r = rpc(
        &gw,
        TRIAL_KEY,
        &tool_call(
            4,
            json!({"name": "delete_file", "arguments": {"path": "/tmp/x"}}),
        ),
        &["-H", &s],
    );
    assert_eq!(r.status, 200);
    assert!(r.json().get("result").is_some(), "{}", r.text());
    assert_eq!(r.header("x-loopgate-would-deny"), Some("tool_not_allowed"));
    assert_eq!(
        gw.metric("loopgate_would_deny_total{code=\"tool_not_allowed\"}"),
        1.0
    );
    // Listing is not filtered either: dry-run shows what enforcement would hide.
    let r = rpc(
        &gw,
        TRIAL_KEY,
        &msg(5, "tools/list", json!({})),
        &["-H", &s],
    );
    assert_eq!(names(&r.json()["result"]).len(), 4);
}

/// MCP servers whose own streams (`GET /mcp/{server}`) idle out after
/// 400 ms (`quiet`: as its read timeout, which the stream's limit
/// replaces), or only after a minute (`patient`), each with a breaker that
/// opens after two failures (issue 41 item 13).
fn stream_config(mock: &Mock) -> String {
    format!(
        r#"
{head}
mcp_servers:
  quiet:
    url: "{mock}/mcp"
    timeouts: {{ read_ms: 400 }}
    stream_idle_ms: 400
    breaker: {{ consecutive_failures: 2, open_ms: 60000 }}
  patient:
    url: "{mock}/mcp"
    stream_idle_ms: 60000
    breaker: {{ consecutive_failures: 1, open_ms: 60000 }}
agents:
  tester:
    key_sha256: "{agent}"
    models: [gpt-4o-mini]
    mcp_access:
      quiet: {{ tools: [read_file] }}
      patient: {{ tools: [read_file] }}
"#,
        head = config_head(mock, "gpt-4o-mini", ""),
        mock = mock.url(),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
    )
}

/// Opens a session on `server`: its `mcp-session-id` header line.
fn session_on(gw: &Gateway, server: &str) -> String {
    let init = msg(
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    let r = post_mcp(gw, AGENT_KEY, server, &[], init.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    format!(
        "mcp-session-id: {}",
        r.header("mcp-session-id").expect("a session id")
    )
}

/// The server's own stream, as an SDK client opens it, read to its end.
fn server_stream(gw: &Gateway, server: &str, sid: &str, extra: &[&str]) -> Resp {
    let url = gw.url(&format!("/mcp/{server}"));
    let auth = auth(AGENT_KEY);
    let mut args = vec![
        url.as_str(),
        "-H",
        &auth,
        "-H",
        "accept: text/event-stream",
        "-H",
        sid,
    ];
    args.extend_from_slice(extra);
    curl(&args)
}

#[test]
fn idle_server_streams_end_cleanly_and_never_open_the_breaker() {
    let mock = Mock::start();
    let gw = Gateway::start(&stream_config(&mock));
    let sid = session_on(&gw, "quiet");
    // Six silent streams in a row, each past the idle limit (and past
    // the server's read timeout): three times what opens its breaker.
    for i in 0..6 {
        let r = server_stream(&gw, "quiet", &sid, &[]);
        assert_eq!(r.status, 200, "stream {i}: {}", r.text());
        assert_eq!(
            r.header("content-type"),
            Some("text/event-stream"),
            "stream {i}"
        );
        // Ended cleanly, as the server would end it: no error event.
        assert_eq!(r.text(), "", "stream {i} ended with an error event");
    }
    // The gateway let every upstream stream go.
    assert!(
        eventually(10, || mock.mcp_streams() == (0, 6)),
        "{:?}",
        mock.mcp_streams()
    );
    // Closed: the gauge is set at a breaker's first change of state.
    let state = gw.metric_or_absent(r#"loopgate_breaker_state{key="quiet"}"#);
    assert_eq!(state.unwrap_or(0.0), 0.0);
    // The server still takes calls from every agent.
    let r = post_mcp(
        &gw,
        AGENT_KEY,
        "quiet",
        &["-H", &sid],
        tool_call(2, json!({"name": "read_file", "arguments": {"path": "/a"}})).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"]["isError"], false, "{}", r.text());
    // Logged as what they were: allowed exchanges, not upstream timeouts.
    assert_eq!(
        gw.metric_or_absent(r#"loopgate_denials_total{code="upstream_timeout"}"#),
        None
    );
}

#[test]
fn a_server_stream_stays_open_while_the_server_speaks() {
    let mock = Mock::start();
    let gw = Gateway::start(&stream_config(&mock));
    let sid = session_on(&gw, "quiet");
    // A comment every 100 ms: the 400 ms idle limit never passes. The
    // agent's client ends the stream after 3 s.
    let r = server_stream(
        &gw,
        "quiet",
        &sid,
        &["-H", "x-mock-mcp-ping-ms: 100", "-m", "3"],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let pings = r.text().matches(": ping\n\n").count();
    // More pings than fit in one idle period: the stream outlived it.
    assert!(pings >= 8, "{pings} pings: {:?}", r.text());
    assert!(!r.text().contains("error"), "{}", r.text());
    assert!(
        eventually(10, || mock.mcp_streams() == (0, 1)),
        "{:?}",
        mock.mcp_streams()
    );
    // Closed: the gauge is set at a breaker's first change of state.
    let state = gw.metric_or_absent(r#"loopgate_breaker_state{key="quiet"}"#);
    assert_eq!(state.unwrap_or(0.0), 0.0);
}

#[test]
fn a_server_stream_whose_client_left_is_closed_upstream_at_once() {
    use std::io::{Read, Write};
    let mock = Mock::start();
    let gw = Gateway::start(&stream_config(&mock));
    let sid = session_on(&gw, "patient");
    for i in 0..2 {
        let mut s = std::net::TcpStream::connect(gw.addr).unwrap();
        write!(
            s,
            "GET /mcp/patient HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {AGENT_KEY}\r\n\
             Accept: text/event-stream\r\n{sid}\r\n\r\n"
        )
        .unwrap();
        let mut head = [0u8; 12];
        s.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 200", "stream {i}");
        assert!(
            eventually(10, || mock.mcp_streams() == (1, i + 1)),
            "{:?}",
            mock.mcp_streams()
        );
        // The agent leaves a minute before the stream's idle limit: the
        // gateway drops the upstream stream now, not then.
        drop(s);
        assert!(
            eventually(10, || mock.mcp_streams() == (0, i + 1)),
            "{:?}",
            mock.mcp_streams()
        );
    }
    // Neither end counted: one failure would have opened this breaker.
    // Closed: the gauge is set at a breaker's first change of state.
    let state = gw.metric_or_absent(r#"loopgate_breaker_state{key="patient"}"#);
    assert_eq!(state.unwrap_or(0.0), 0.0);
    let r = post_mcp(
        &gw,
        AGENT_KEY,
        "patient",
        &["-H", &sid],
        msg(3, "ping", json!({})).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

/// The official SDK client's long session through the gateway: the server
/// stream it opens after `initialize` stays silent for 4 s, eight of the
/// server's 500 ms idle limits (and read timeouts); its breaker, which
/// opens after two failures, stays closed and the calls after the wait
/// reach the SDK's server (issue 41 item 13). On the 2.x SDK, which opens
/// that stream after its fallback `initialize` too.
#[test]
fn the_official_sdk_keeps_a_long_idle_session() {
    let dir = scratch_dir("mcp-sdk-long");
    let log = dir.join("calls.jsonl");
    std::fs::write(&log, "").unwrap();
    let (_server, port) = serve_on_a_free_port("the MCP SDK server", |port| {
        std::process::Command::new(python())
            .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/server.py"))
            .args([port.to_string(), "sse".to_string()])
            .env("MCP_TEST_LOG", &log)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python with the mcp SDK (tests/setup-python.sh)")
    });
    let server = format!(
        "  sdk:\n    url: \"http://127.0.0.1:{port}/mcp\"\n    timeouts: {{ read_ms: 500 }}\n    stream_idle_ms: 500\n    breaker: {{ consecutive_failures: 2, open_ms: 60000 }}\n"
    );
    let yaml = config(&Mock::start(), &server).replace(
        "      files: { tools: [read_file, \"search*\", write_note], write_calls_per_minute: 2 }",
        "      files: { tools: [read_file, \"search*\", write_note], write_calls_per_minute: 2 }\n      sdk: { tools: [read_file] }",
    );
    let gw = Gateway::start(&yaml);
    let out = std::process::Command::new(python())
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/long_session.py"))
        .args([&gw.url("/mcp/sdk"), AGENT_KEY, "4"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["mcp_version"]
            .as_str()
            .is_some_and(|s| s.starts_with("2.")),
        "the 2.x SDK (run tests/setup-python.sh): {v}"
    );
    assert_eq!(v["protocol_version"], "2025-11-25", "{v}");
    assert_eq!(
        v["calls"],
        json!([
            "contents of /after-idle-0",
            "contents of /after-idle-1",
            "contents of /after-idle-2"
        ]),
        "{v}"
    );
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(calls.lines().count(), 3, "{calls}");
    let state = gw.metric_or_absent(r#"loopgate_breaker_state{key="sdk"}"#);
    assert_eq!(state.unwrap_or(0.0), 0.0);
}
