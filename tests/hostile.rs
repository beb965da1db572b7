//! The hostile-client suite: raw bytes over real sockets against the real
//! binary, for every hole the hostile-input review of c553773 found (issue
//! 21). Each case checks the status and the error's shape, that nothing
//! reached the upstream, and that the gateway still serves others.

use loopgate_tests::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

fn config(mock: &Mock) -> String {
    format!(
        r#"
{head}
admin: {{ listen: "127.0.0.1:{{ADMIN_PORT}}", token_env: LOOPGATE_TEST_ADMIN_TOKEN }}
# Filler bodies past gpt-4o-mini's real context window (prices.rs tests
# the window guard).
models:
  gpt-4o-mini: {{ context_window: 1000000000 }}
tools:
  weather:
    base_url: "{mock}/echo/weather"
    breaker: {{ consecutive_failures: 3, open_ms: 60000 }}
  orders:
    base_url: "{mock}/echo/orders"
    idempotency: {{ mode: required }}
mcp_servers:
  files:
    url: "{mock}/mcp"
agents:
  tester:
    key_sha256: "{agent}"
    models: [gpt-4o-mini, "claude-3-5-haiku*"]
    tools: [lookup_invoice, "search_*"]
    max_tokens: 256
    blocked_phrases: ["ignore previous instructions"]
    tool_access:
      weather: {{ methods: [GET], paths: ["/v1/forecast", "/v1/city/*"], max_body_bytes: 65536 }}
      orders: {{ methods: [GET, POST], paths: ["/orders*"], max_body_bytes: 65536 }}
    mcp_access:
      files: {{ tools: [read_file], resources: ["file:///public/*"] }}
  bulk:
    key_sha256: "{bulk}"
    models: [gpt-4o-mini]
    max_in_flight: 2
    max_body_bytes: 1048576
  limited:
    key_sha256: "{limited}"
    models: [gpt-4o-mini]
    requests_per_minute: 2
    tool_access:
      weather: {{ methods: [GET], paths: ["/v1/forecast"] }}
    mcp_access:
      files: {{ tools: [read_file] }}
  scoped:
    key_sha256: "{narrow}"
    models: [gpt-4o-mini, "claude-3-5-haiku*"]
    forward_headers: [anthropic-beta]
"#,
        mock = mock.url(),
        head = config_head_with_anthropic(
            mock,
            "breaker: { consecutive_failures: 3, open_ms: 60000 }"
        ),
        agent = sha256_hex(AGENT_KEY.as_bytes()),
        narrow = sha256_hex(NARROW_KEY.as_bytes()),
        bulk = sha256_hex(BULK_KEY.as_bytes()),
        limited = sha256_hex(LIMITED_KEY.as_bytes()),
    )
}

const BULK_KEY: &str = "hostile-bulk-key-0005";
const LIMITED_KEY: &str = "hostile-limited-key-0006";

/// Sends `req` as it is and reads one response (by Content-Length or
/// chunked framing, else to the close).
fn raw(addr: SocketAddr, req: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req).expect("send");
    read_response(&mut s).expect("a response")
}

fn read_response(s: &mut TcpStream) -> Option<Resp> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut rest = buf[head_end + 4..].to_vec();
    let get = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    if let Some(len) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        while rest.len() < len {
            let n = s.read(&mut chunk).ok()?;
            if n == 0 {
                break;
            }
            rest.extend_from_slice(&chunk[..n]);
        }
        rest.truncate(len);
    } else if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        while !rest.windows(5).any(|w| w == b"0\r\n\r\n") {
            let n = s.read(&mut chunk).ok()?;
            if n == 0 {
                break;
            }
            rest.extend_from_slice(&chunk[..n]);
        }
        rest = dechunk(&rest);
    } else {
        let _ = s.read_to_end(&mut rest);
    }
    Some(Resp {
        status,
        headers,
        body: rest,
    })
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(p) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..p]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = p + 2;
        out.extend_from_slice(&b[start..(start + size).min(b.len())]);
        b = &b[(start + size + 2).min(b.len())..];
    }
    out
}

fn key() -> String {
    format!("Authorization: Bearer {AGENT_KEY}")
}

fn get_req(path: &str, extra: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nHost: gw\r\n{}\r\n{extra}Connection: close\r\n\r\n",
        key()
    )
    .into_bytes()
}

fn post_req(path: &str, extra: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: gw\r\n{}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        key(),
        body.len()
    )
    .into_bytes()
}

/// The gateway still answers an ordinary call.
fn still_serves(gw: &Gateway) {
    let r = raw(gw.addr, &post_req("/v1/chat/completions", "", CHAT));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

fn received(mock: &Mock) -> usize {
    mock.requests().len()
}

#[test]
fn tool_paths_with_path_parameters_or_segment_tricks_are_refused() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    for path in [
        "/tools/weather/v1/city/..;/..;/admin",
        "/tools/weather/v1/city/%2e%2e%3b/admin",
        "/tools/weather/v1/city/..;jsessionid=1/admin",
        "/tools/weather/v1/city/.;/x",
        "/tools/weather/v1/city/;/x",
        "/tools/weather/v1/city/a%2fb",
        "/tools/weather/v1/city/%252e%252e/admin",
        "/tools/weather/v1/city/a%5cb",
    ] {
        raw(gw.addr, &get_req(path, "")).assert_gateway_error(400, "invalid_path");
    }
    // A prefix grant is a prefix of whole segments.
    raw(gw.addr, &get_req("/tools/orders/orders-admin/purge", ""))
        .assert_gateway_error(403, "path_not_allowed");
    raw(gw.addr, &get_req("/tools/weather/v1/cityx", ""))
        .assert_gateway_error(403, "path_not_allowed");
    assert_eq!(received(&mock), 0, "nothing reached the tool");
    // What the grant means still passes.
    let ok = raw(gw.addr, &get_req("/tools/weather/v1/city/Paris", ""));
    assert_eq!(ok.status, 200);
    let ok = raw(gw.addr, &get_req("/tools/orders/orders/7", ""));
    assert_eq!(ok.status, 200);
    still_serves(&gw);
}

/// How a refusal is expected to look.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// The gateway's own error, with this status and code, in the wire
    /// format of the path (JSON-RPC with a `null` id on `/mcp`, the body
    /// unjudged).
    Loopgate(u16, &'static str),
    /// Pingora's bare 400: it refuses some header bytes and framings while
    /// reading the header, before any of the gateway's hooks runs.
    Pingora400,
}

impl Refusal {
    fn check(self, r: &Resp, path: &str, what: &str) {
        match self {
            Refusal::Loopgate(status, code) => {
                let wire = if path.starts_with("/mcp") {
                    Wire::Rpc(Value::Null)
                } else {
                    Wire::Json
                };
                r.assert_error(status, code, &wire);
            }
            Refusal::Pingora400 => {
                assert_eq!(r.status, 400, "{what} {path}: {r:?}");
                assert_eq!(r.header("x-loopgate-error"), None, "{what} {path}: {r:?}");
                assert_eq!(
                    r.header("content-length"),
                    Some("0"),
                    "{what} {path}: {r:?}"
                );
                assert!(r.body.is_empty(), "{what} {path}: {r:?}");
            }
        }
    }
}

/// Reads the one answer `s` must get: none (a close, a stall past the
/// read timeout) fails.
fn answer(s: &mut TcpStream, what: &str) -> Resp {
    read_response(s).unwrap_or_else(|| panic!("{what}: no answer (closed or stalled)"))
}

#[test]
fn a_content_length_the_gateway_cannot_read_as_one_number_is_refused() {
    use Refusal::{Loopgate, Pingora400};
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let big = "x".repeat(70_000);
    const PATHS: [&str; 3] = ["/tools/orders/orders", "/v1/chat/completions", "/mcp/files"];
    let not_one_number = Loopgate(400, "invalid_request");
    let cases: [(&str, [Refusal; 3]); 5] = [
        ("Content-Length: 70000, 70000\r\n", [not_one_number; 3]),
        (
            "Content-Length: 70000\r\nContent-Length: 70000\r\n",
            [not_one_number; 3],
        ),
        // Pingora reads these as no number at all.
        ("Content-Length: +70000\r\n", [Pingora400; 3]),
        ("Content-Length: 0x10\r\n", [Pingora400; 3]),
        // With Transfer-Encoding Pingora drops Content-Length and frames
        // by chunks: a tool under a size limit wants a length (411); the
        // others read the body and find no chunk size in it.
        (
            "Content-Length: 70000\r\nTransfer-Encoding: chunked\r\n",
            [
                Loopgate(411, "length_required"),
                Loopgate(400, "bad_request"),
                Loopgate(400, "bad_request"),
            ],
        ),
    ];
    for (framing, expected) in cases {
        for (path, refusal) in PATHS.into_iter().zip(expected) {
            let req = format!(
                "POST {path} HTTP/1.1\r\nHost: gw\r\n{}\r\nIdempotency-Key: k1\r\n{framing}Connection: close\r\n\r\n{big}",
                key()
            );
            let mut s = TcpStream::connect(gw.addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = s.write_all(req.as_bytes());
            let what = format!("{framing:?} {path}");
            refusal.check(&answer(&mut s, &what), path, &what);
        }
    }
    // Nothing reached an upstream, not even a request the mock could not
    // parse: the gateway opened no connection to it.
    assert_eq!(mock.connections(), 0, "a connection reached an upstream");
    assert_eq!(received(&mock), 0, "nothing reached an upstream");
    still_serves(&gw);
}

#[test]
fn mcp_session_ids_must_be_exactly_one_visible_id() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    let ours = Refusal::Loopgate(400, "invalid_request");
    for (ids, refusal) in [
        ("Mcp-Session-Id: a\r\nMcp-Session-Id: b\r\n", ours),
        ("Mcp-Session-Id: a b\r\n", ours),
        // Pingora refuses a DEL in a header value itself, before any hook.
        ("Mcp-Session-Id: \x7f\x7f\r\n", Refusal::Pingora400),
        ("Mcp-Session-Id: caf\u{e9}\r\n", ours),
    ] {
        let r = raw(gw.addr, &post_req("/mcp/files", ids, &body));
        refusal.check(&r, "/mcp/files", &format!("{ids:?}"));
    }
    assert_eq!(received(&mock), 0);
    still_serves(&gw);
}

#[test]
fn get_and_delete_on_mcp_take_no_body() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "delete_file"}}).to_string();
    for method in ["GET", "DELETE"] {
        let req = format!(
            "{method} /mcp/files HTTP/1.1\r\nHost: gw\r\n{}\r\nMcp-Session-Id: s1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{call}",
            key(),
            call.len()
        );
        let r = raw(gw.addr, req.as_bytes());
        // Refused on its header: the body was never judged, so no id.
        r.assert_rpc_error(400, Value::Null, "invalid_request");
    }
    assert_eq!(received(&mock), 0);
    still_serves(&gw);
}

#[test]
fn answers_the_gateway_cannot_read_never_pass_as_judged() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    // Asked for identity, whatever the agent accepts.
    let r = raw(
        gw.addr,
        &post_req(
            "/v1/chat/completions",
            "Accept-Encoding: gzip, br\r\n",
            CHAT,
        ),
    );
    assert_eq!(r.status, 200);
    let seen = mock.last_request();
    assert_eq!(recorded_header(&seen, "accept-encoding"), Some("identity"));
    // A provider compressing anyway: its usage could not be counted.
    raw(
        gw.addr,
        &post_req("/v1/chat/completions", "x-mock-gzip: 1\r\n", CHAT),
    )
    .assert_gateway_error(502, "upstream_error");
    // An MCP server compressing its list: it could not be filtered.
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    let r = raw(
        gw.addr,
        &post_req("/mcp/files", "x-mock-gzip: 1\r\n", &list),
    );
    assert_eq!(r.status, 502, "{r:?}");
    assert!(!String::from_utf8_lossy(&r.body).contains("delete_file"));
    // A plain tool call passes unread (nothing judges its answer).
    let r = raw(
        gw.addr,
        &get_req("/tools/weather/v1/forecast", "x-mock-gzip: 1\r\n"),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    still_serves(&gw);
}

#[test]
fn headers_that_rescope_or_speak_for_the_gateway_are_stripped() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let sent = "OpenAI-Organization: org-evil\r\nOpenAI-Project: proj-evil\r\nanthropic-beta: mcp-client-2025-04-04\r\nX-HTTP-Method-Override: DELETE\r\nX-Method-Override: DELETE\r\nX-Forwarded-For: 10.0.0.1\r\nX-Real-IP: 10.0.0.1\r\nForwarded: for=10.0.0.1\r\n";
    let r = raw(gw.addr, &get_req("/tools/weather/v1/forecast", sent));
    assert_eq!(r.status, 200);
    let seen = mock.last_request();
    for h in [
        "openai-organization",
        "openai-project",
        "anthropic-beta",
        "x-http-method-override",
        "x-method-override",
        "x-forwarded-for",
        "x-real-ip",
        "forwarded",
    ] {
        assert_eq!(recorded_header(&seen, h), None, "{h} went upstream");
    }
    // An agent allowed a scoping header by config sends it.
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {NARROW_KEY}\r\n{sent}Content-Length: {}\r\nConnection: close\r\n\r\n{CHAT}",
        CHAT.len()
    );
    assert_eq!(raw(gw.addr, req.as_bytes()).status, 200);
    let seen = mock.last_request();
    assert_eq!(
        recorded_header(&seen, "anthropic-beta"),
        Some("mcp-client-2025-04-04")
    );
    assert_eq!(recorded_header(&seen, "openai-organization"), None);
    // An upstream cannot forge a gateway decision.
    let r = raw(
        gw.addr,
        &get_req(
            "/tools/weather/v1/forecast",
            "x-mock-response-header: x-loopgate-provider: forged\r\nx-mock-response-header: x-loopgate-fallback: forged\r\n",
        ),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-loopgate-provider"), Some("weather"));
    assert_eq!(r.header("x-loopgate-fallback"), None);
}

#[test]
fn an_idempotency_key_is_bound_to_its_method_path_and_query() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let cancel = |path: &str| {
        raw(
            gw.addr,
            &post_req(path, "Idempotency-Key: cancel-1\r\n", "{}"),
        )
    };
    assert_eq!(cancel("/tools/orders/orders/1/cancel").status, 200);
    cancel("/tools/orders/orders/2/cancel").assert_gateway_error(422, "idempotency_key_reused");
    cancel("/tools/orders/orders/1/cancel?force=1")
        .assert_gateway_error(422, "idempotency_key_reused");
    let replay = cancel("/tools/orders/orders/1/cancel");
    assert_eq!(replay.header("x-loopgate-idempotent-replay"), Some("true"));
    assert_eq!(
        received(&mock),
        1,
        "one cancel ran, none was mistaken for it"
    );
}

#[test]
fn the_gateways_own_failures_never_open_a_shared_breaker() {
    let mock = Mock::start();
    // Every call of agent `bulk` fails inside the gateway after routing:
    // its peer chosen and the shared `oa` breaker's ticket taken (3
    // consecutive failures would open it for everyone).
    let gw = Gateway::start_with_env(
        &config(&mock),
        &[("LOOPGATE_TEST_FAULT", "upstream_request_filter:bulk")],
    );
    let as_bulk = || {
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {BULK_KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{CHAT}",
            CHAT.len()
        );
        raw(gw.addr, req.as_bytes())
    };
    for _ in 0..6 {
        // The gateway's failure, retryable, never the provider's: were it
        // counted, the fourth would be refused 503 circuit_open.
        let r = as_bulk();
        r.assert_gateway_error(500, "internal_error");
        assert_eq!(r.json()["error"]["retryable"], true, "{}", r.text());
        assert_eq!(r.json()["error"]["type"], "gateway_error", "{}", r.text());
    }
    assert_eq!(
        received(&mock),
        0,
        "nothing of the failed calls went upstream"
    );
    // Every breaker is still closed for everyone: no transition at all.
    still_serves(&gw);
    assert_eq!(received(&mock), 1);
    let metrics = curl(&[
        &gw.admin_url("/metrics"),
        "-H",
        &format!("Authorization: Bearer {ADMIN_TOKEN}"),
    ]);
    assert_eq!(metrics.status, 200);
    assert!(
        !metrics
            .text()
            .contains("loopgate_breaker_transitions_total{"),
        "{}",
        metrics.text()
    );
    // Requests refused before routing take no ticket at all: a target too
    // long to rebuild under the tool's base path, a model name no header
    // can carry.
    let long = format!("/tools/weather/v1/forecast?q={}", "a".repeat(65_400));
    for _ in 0..5 {
        raw(gw.addr, &get_req(&long, "")).assert_gateway_error(400, "invalid_request");
    }
    let bad_model = r#"{"model":"gpt-4o-mini\u0001","messages":[{"role":"user","content":"hi"}]}"#;
    for _ in 0..5 {
        raw(gw.addr, &post_req("/v1/chat/completions", "", bad_model))
            .assert_gateway_error(400, "invalid_request");
    }
    let ok = raw(gw.addr, &get_req("/tools/weather/v1/forecast", ""));
    assert_eq!(ok.status, 200);
    still_serves(&gw);
}

#[test]
fn protocol_upgrades_are_refused_and_an_unasked_101_is_a_failure() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    for up in [
        "Upgrade: websocket\r\nConnection: Upgrade\r\n",
        "Upgrade: h2c\r\n",
        "Connection: keep-alive, upgrade\r\n",
    ] {
        raw(gw.addr, &post_req("/v1/chat/completions", up, CHAT))
            .assert_gateway_error(400, "invalid_request");
        raw(gw.addr, &get_req("/tools/weather/v1/forecast", up))
            .assert_gateway_error(400, "invalid_request");
    }
    assert_eq!(received(&mock), 0);
    // A provider answering 101 to a large body: an error for that request,
    // and the next one on the same connection gets its own answer.
    let filler = "y".repeat(70_000);
    let big =
        format!(r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"{filler}"}}]}}"#);
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let first = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n{}\r\nx-mock-upgrade: 1\r\nContent-Length: {}\r\n\r\n{big}",
        key(),
        big.len()
    );
    s.write_all(first.as_bytes()).unwrap();
    let r = read_response(&mut s).expect("an answer to the upgraded request");
    // 502 from the large-body subrequest, or 500 when the main request saw
    // its pipe end before the subrequest's answer: an error either way.
    assert!(r.status == 502 || r.status == 500, "{r:?}");
    let second = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{CHAT}",
        key(),
        CHAT.len()
    );
    if s.write_all(second.as_bytes()).is_ok() {
        if let Some(r) = read_response(&mut s) {
            // Either the connection was closed, or this is the second answer.
            assert_eq!(r.status, 200, "{r:?}");
            assert!(r.json()["choices"].is_array());
        }
    }
    still_serves(&gw);
}

#[test]
fn agent_chosen_names_never_become_metric_labels() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    for i in 0..20 {
        let r = raw(gw.addr, &post_req(&format!("/mcp/rnd{i}"), "", &list));
        assert_eq!(r.status, 404);
    }
    let metrics = curl(&[
        &gw.admin_url("/metrics"),
        "-H",
        &format!("Authorization: Bearer {ADMIN_TOKEN}"),
    ])
    .text();
    assert!(!metrics.contains("rnd"), "agent text in a label");
    assert_eq!(
        metrics
            .lines()
            .filter(|l| l.starts_with("loopgate_mcp_requests_total{"))
            .count(),
        1,
        "one series for every unknown server"
    );
    assert!(
        metrics.contains(
            r#"loopgate_mcp_requests_total{decision="deny",server="unknown",tool="-"} 20"#
        ),
        "{metrics}"
    );
}

#[test]
fn resetting_no_breaker_does_not_crash_the_admin_listener() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let token = format!("Authorization: Bearer {ADMIN_TOKEN}");
    for path in ["/admin/breakers/reset", "/admin/breakers//reset"] {
        let r = curl(&["-X", "POST", &gw.admin_url(path), "-H", &token]);
        assert_eq!(r.status, 404, "{path}: {}", r.text());
    }
    let r = curl(&[&gw.admin_url("/health")]);
    assert_eq!(r.status, 200);
    still_serves(&gw);
}

#[test]
fn the_loop_guard_is_on_by_default_for_tasks() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let statuses: Vec<u16> = (0..3)
        .map(|_| {
            raw(
                gw.addr,
                &post_req("/v1/chat/completions", "x-agent-task-id: t1\r\n", CHAT),
            )
            .status
        })
        .collect();
    assert_eq!(statuses, [200, 200, 409]);
    let r = raw(
        gw.addr,
        &post_req("/v1/chat/completions", "x-agent-task-id: t1\r\n", CHAT),
    );
    r.assert_gateway_error(409, "loop_detected");
    // Without a task id there is no task to loop.
    still_serves(&gw);
    still_serves(&gw);
    still_serves(&gw);
}

#[test]
fn bodies_being_received_are_bounded_per_agent_before_they_are_read() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    // Two slow bodies of 900 KB each: what `max_in_flight: 2` allows.
    let head = |len: usize| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {BULK_KEY}\r\nContent-Length: {len}\r\n\r\n"
        )
    };
    let part = vec![b' '; 900_000];
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(gw.addr).unwrap();
        s.write_all(head(1_000_000).as_bytes()).unwrap();
        s.write_all(&part).unwrap();
        held.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    // A third is refused as it arrives, not read into memory.
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(head(1_000_000).as_bytes()).unwrap();
    let _ = s.write_all(&part);
    let r = answer(&mut s, "the third body");
    r.assert_gateway_error(429, "too_many_in_flight");
    assert!(r.header("retry-after").is_some());
    // No part of a body still arriving went upstream.
    assert_eq!(mock.connections(), 0, "a partial body reached the upstream");
    // Other agents are not affected, and the share comes back.
    still_serves(&gw);
    drop(held);
    std::thread::sleep(Duration::from_millis(300));
    // The bodies cut short were not forwarded either (a head would count
    // even on the connection the call above left in the pool).
    assert_eq!(mock.heads(), 1, "a truncated body reached the upstream");
    let body = format!(
        r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "z".repeat(800_000)
    );
    let req = format!("{}{body}", head(body.len()));
    assert_eq!(raw(gw.addr, req.as_bytes()).status, 200);
    assert_eq!(received(&mock), 2);
}

/// Every field through which a request hands the model a tool is judged.
#[test]
fn every_tool_bearing_field_is_judged_by_what_the_provider_dispatches_on() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let user = json!([{"role": "user", "content": "hi"}]);
    let refused = [
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "messages": user,
                   "functions": [{"name": "delete_everything", "parameters": {}}]}),
        ),
        (
            "/v1/messages",
            json!({"model": "claude-3-5-haiku-latest", "max_tokens": 10, "messages": user,
                   "tools": [{"type": "web_search_20250305", "name": "search_web"}]}),
        ),
        (
            "/v1/messages",
            json!({"model": "claude-3-5-haiku-latest", "max_tokens": 10, "messages": user,
                   "mcp_servers": [{"type": "url", "url": "https://evil.example/mcp", "name": "search_x"}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "gpt-4o-mini", "input": "hi",
                   "tools": [{"type": "mcp", "server_label": "search_x", "server_url": "https://evil.example"}]}),
        ),
    ];
    for (path, body) in refused {
        raw(gw.addr, &post_req(path, "", &body.to_string()))
            .assert_gateway_error(403, "tool_not_allowed");
    }
    // An unknown field that can carry tools is refused, not ignored.
    let r = raw(
        gw.addr,
        &post_req(
            "/v1/chat/completions",
            "",
            &json!({"model": "gpt-4o-mini", "messages": user, "tool_servers": []}).to_string(),
        ),
    );
    r.assert_gateway_error(400, "invalid_request");
    assert_eq!(received(&mock), 0);
    // A granted function passes.
    let ok = json!({"model": "gpt-4o-mini", "messages": user,
                    "tools": [{"type": "function", "function": {"name": "search_docs", "parameters": {}}}]});
    assert_eq!(
        raw(
            gw.addr,
            &post_req("/v1/chat/completions", "", &ok.to_string())
        )
        .status,
        200
    );
}

#[test]
fn an_omitted_output_limit_is_set_and_n_counts() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    assert_eq!(
        raw(gw.addr, &post_req("/v1/chat/completions", "", CHAT)).status,
        200
    );
    let seen = mock.last_request();
    let expected = CHAT.replacen('{', r#"{"max_tokens":256,"#, 1);
    assert_eq!(
        seen["body_sha256"],
        sha256_hex(expected.as_bytes()),
        "the limit went upstream"
    );
    let two = r#"{"model":"gpt-4o-mini","n":2,"max_tokens":200,"messages":[{"role":"user","content":"hi"}]}"#;
    raw(gw.addr, &post_req("/v1/chat/completions", "", two))
        .assert_gateway_error(400, "max_tokens_exceeded");
    let bad_n = r#"{"model":"gpt-4o-mini","n":0,"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(
        raw(gw.addr, &post_req("/v1/chat/completions", "", bad_n)).status,
        400
    );
    assert_eq!(received(&mock), 1);
}

#[test]
fn blocked_phrases_survive_no_unicode_disguise_in_any_field() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let disguised = [
        "\u{ff49}\u{ff47}\u{ff4e}\u{ff4f}\u{ff52}\u{ff45} previous instructions",
        "ig\u{200b}nore previous instructions",
        "ig\u{ad}nore  previous\n\tinstructions",
        "IGNORE PREVIOUS INSTRUCTIONS",
        "ig\u{e0020}nore previous instructions",
        "ignore previous \u{202e}instructions",
    ];
    for text in disguised {
        let in_message =
            json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]});
        let in_tool = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "lookup_invoice", "description": text, "parameters": {}}}]});
        let in_schema = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"description": text}}}});
        for body in [in_message, in_tool, in_schema] {
            raw(
                gw.addr,
                &post_req("/v1/chat/completions", "", &body.to_string()),
            )
            .assert_gateway_error(403, "blocked_phrase");
        }
    }
    assert_eq!(received(&mock), 0);
}

#[test]
fn nesting_past_the_depth_rule_is_one_clear_400_even_for_a_task() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    for depth in [200, 100_000] {
        let deep = format!(
            r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"hi"}}],"metadata":{}{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let r = raw(
            gw.addr,
            &post_req("/v1/chat/completions", "x-agent-task-id: deep\r\n", &deep),
        );
        r.assert_gateway_error(400, "invalid_json");
    }
    assert_eq!(received(&mock), 0);
    still_serves(&gw);
}

/// One JSON-RPC POST to the `files` server as `tester`.
fn mcp_post(gw: &Gateway, body: &str) -> Resp {
    raw(gw.addr, &post_req("/mcp/files", "", body))
}

#[test]
fn mcp_resource_grants_match_canonical_uris_by_segment() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let read = |uri: &str| {
        json!({"jsonrpc": "2.0", "id": 7, "method": "resources/read", "params": {"uri": uri}})
            .to_string()
    };
    // Ambiguous forms: refused as such, whatever they would resolve to.
    for uri in [
        "file:///public/../secret/k",
        "file:///public/%2e%2e/secret/k",
        "file:///public/%2E%2E/secret/k",
        "file:///public/..%2fsecret/k",
        "file:///public/./../../etc/passwd",
        "file:///public\\..\\secret\\k",
        "file:///public/%5c../secret",
        "file:///public/%252e%252e/secret/k",
        "file:///public/..;/secret/k",
        "file:///public//secret",
        "file:///public/a%00b",
        "public/k",
    ] {
        // Judged in-band: the refused message's id, on a 200.
        mcp_post(&gw, &read(uri)).assert_rpc_error(200, json!(7), "invalid_path");
    }
    // Unambiguous but outside the grant: a string prefix is not a segment.
    for uri in [
        "file:///public-x/a",
        "file:///publicity",
        "file:///secret/k",
        "file:///public",
    ] {
        mcp_post(&gw, &read(uri)).assert_rpc_error(200, json!(7), "path_not_allowed");
    }
    // Subscribing and completing are judged by the same rule.
    let sub = json!({"jsonrpc": "2.0", "id": 8, "method": "resources/subscribe", "params": {"uri": "file:///public/../k"}});
    mcp_post(&gw, &sub.to_string()).assert_rpc_error(200, json!(8), "invalid_path");
    let complete = json!({"jsonrpc": "2.0", "id": 9, "method": "completion/complete",
        "params": {"ref": {"type": "ref/resource", "uri": "file:///secret/{name}"}, "argument": {"name": "name", "value": "k"}}});
    mcp_post(&gw, &complete.to_string()).assert_rpc_error(200, json!(9), "path_not_allowed");
    assert_eq!(received(&mock), 0, "nothing reached the MCP server");
    // A URI under the grant, in any spelling that reads one way, goes (the
    // mock server answers it itself: no Loopgate code in its answer).
    for uri in ["file:///public/a/b.txt", "FILE:///public/%61"] {
        let r = mcp_post(&gw, &read(uri));
        assert_eq!(r.status, 200, "{uri}: {r:?}");
        assert!(
            r.header("x-loopgate-error").is_none(),
            "{uri}: {}",
            r.text()
        );
        assert!(
            r.json()["error"]["data"]["loopgate_code"].is_null(),
            "{uri}: {}",
            r.text()
        );
    }
    assert_eq!(received(&mock), 2);
    still_serves(&gw);
}

#[test]
fn duplicated_json_rpc_keys_are_refused_wherever_they_are() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    for body in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"delete_file","name":"read_file"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"tools/list","params":{"name":"read_file"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file"},"params":{"name":"delete_file"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"a","path":"b"}}}"#,
        r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"read_file","name":"delete_file"}}]"#,
    ] {
        let r = mcp_post(&gw, body);
        // Refusals of judged JSON-RPC are JSON-RPC errors on a 200; a body
        // that does not parse has no id to answer.
        let wire = if body.starts_with('[') {
            Wire::RpcBatch(Value::Null)
        } else {
            Wire::Rpc(Value::Null)
        };
        r.assert_error(200, "invalid_json", &wire);
        assert!(r.text().contains("duplicate key"), "{body}: {}", r.text());
    }
    assert_eq!(received(&mock), 0);
    still_serves(&gw);
}

#[test]
fn mcp_batches_are_capped_and_ids_within_one_are_unique() {
    let mock = Mock::start();
    // A body limit that admits the largest batch below: the cap on the
    // count must refuse it, not the size.
    let gw = Gateway::start(&format!(
        "{}policy: {{ max_body_bytes: 16777216 }}\n",
        config(&mock)
    ));
    let batch = |n: usize| {
        Value::Array(
            (0..n)
                .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "tools/list"}))
                .collect(),
        )
        .to_string()
    };
    // 140,000 lists in one body (~7 MB, the review's case): refused by
    // count, whole, with one error.
    for n in [101, 140_000] {
        let r = mcp_post(&gw, &batch(n));
        r.assert_error(200, "invalid_request", &Wire::RpcBatch(Value::Null));
        let why = format!("batch of {n} messages exceeds the limit of 100");
        assert_eq!(r.json()[0]["error"]["message"], why.as_str(), "{n}");
    }
    let dup = r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file"}}]"#;
    let r = mcp_post(&gw, dup);
    r.assert_error(200, "invalid_request", &Wire::RpcBatch(json!(1)));
    assert!(r.text().contains("duplicate id"), "{}", r.text());
    assert_eq!(mock.connections(), 0, "a refused batch reached the server");
    assert_eq!(received(&mock), 0);
    // The same bytes as one message fit the body limit and go.
    let padded = json!({"jsonrpc": "2.0", "id": "big", "method": "tools/list",
        "params": {"_meta": {"pad": "p".repeat(batch(140_000).len())}}});
    let r = mcp_post(&gw, &padded.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], "big", "{}", r.text());
    assert_eq!(received(&mock), 1);
    // At the cap, one batch goes, and every answer comes back filtered to
    // exactly what the grant names (the server lists four tools).
    let r = mcp_post(&gw, &batch(100));
    assert_eq!(r.status, 200, "{}", r.text());
    let read_file = json!({
        "name": "read_file",
        "description": "mock tool read_file",
        "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
    });
    let expected: Vec<Value> = (0..100)
        .map(|i| json!({"jsonrpc": "2.0", "id": i, "result": {"tools": [read_file]}}))
        .collect();
    assert_eq!(r.json(), Value::Array(expected));
    assert_eq!(received(&mock), 2);
    still_serves(&gw);
}

#[test]
fn calls_over_the_limits_are_refused_before_any_guard_keeps_state() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let as_limited = |path: &str, method: &str, task: &str, body: &str| {
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {LIMITED_KEY}\r\nContent-Type: application/json\r\nx-agent-task-id: {task}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        raw(gw.addr, req.as_bytes())
    };
    // The two calls a minute the agent has, then the same calls of the
    // same task again and again: the limits refuse them (429). Were the
    // loop guard first, it would count them and answer 409 from the third
    // repeat on; a refused call must leave no task state behind.
    assert_eq!(
        as_limited("/v1/chat/completions", "POST", "a", CHAT).status,
        200
    );
    assert_eq!(
        as_limited("/tools/weather/v1/forecast", "GET", "a", "").status,
        200
    );
    for _ in 0..30 {
        let task = "a";
        as_limited("/v1/chat/completions", "POST", task, CHAT)
            .assert_gateway_error(429, "rate_limited");
        as_limited("/tools/weather/v1/forecast", "GET", task, "")
            .assert_gateway_error(429, "rate_limited");
        let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "read_file"}}).to_string();
        let r = as_limited("/mcp/files", "POST", task, &list);
        r.assert_rpc_error(200, json!(1), "rate_limited");
    }
    assert_eq!(received(&mock), 2);
    still_serves(&gw);
}

/// Issue 41 item 9: a model endpoint, a tool or an MCP server answering
/// with a redirect is a failed upstream (502 `upstream_error`), never a
/// `Location` the agent's SDK would follow and re-POST the prompt to.
#[test]
fn upstream_redirects_are_failures_never_relayed() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let redirect =
        "x-mock-status: 307\r\nx-mock-response-header: location: http://elsewhere.invalid/v1\r\n";
    let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}).to_string();
    for (what, req) in [
        ("model", post_req("/v1/chat/completions", redirect, CHAT)),
        ("tool", get_req("/tools/weather/v1/forecast", redirect)),
        ("mcp", post_req("/mcp/files", redirect, &list)),
    ] {
        let r = raw(gw.addr, &req);
        match what {
            "mcp" => {
                r.assert_rpc_error(502, json!(3), "upstream_error");
            }
            _ => {
                r.assert_gateway_error(502, "upstream_error");
            }
        }
        assert_eq!(r.header("location"), None, "{what}: {r:?}");
        assert!(!r.text().contains("elsewhere"), "{what}: {}", r.text());
    }
    // Each reached its upstream once (the redirect was not followed).
    assert_eq!(received(&mock), 3);
    // Counted as the tool's failures: its breaker (3 in a row) opens.
    for _ in 0..2 {
        raw(gw.addr, &get_req("/tools/weather/v1/forecast", redirect))
            .assert_gateway_error(502, "upstream_error");
    }
    raw(gw.addr, &get_req("/tools/weather/v1/forecast", ""))
        .assert_gateway_error(503, "circuit_open");
    assert_eq!(received(&mock), 5);
    still_serves(&gw);
}

/// Issue 41 item 10: dots and slashes of other scripts or compatibility
/// forms (`．．`, `‥`, `／`), raw or percent-encoded, read `..` or `/` to a
/// server that applies NFKC or a best-fit conversion: refused as
/// ambiguous, never forwarded past a `file:///public/*` grant.
#[test]
fn mcp_resource_uris_with_unicode_dots_and_slashes_are_refused() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let read = |uri: &str| {
        json!({"jsonrpc": "2.0", "id": 7, "method": "resources/read", "params": {"uri": uri}})
            .to_string()
    };
    for uri in [
        "file:///public/\u{FF0E}\u{FF0E}/secret",
        "file:///public/%EF%BC%8E%EF%BC%8E/secret",
        "file:///public/\u{2025}/secret",
        "file:///public/\u{2024}\u{2024}/secret",
        "file:///public/.\u{FE52}/secret",
        "file:///public/..\u{FF0F}secret",
        "file:///public/a%EF%BC%8Fb",
        "file:///public/..\u{FF3C}secret",
        "file:///public/..\u{2215}secret",
        "file:///public/a?x=\u{FF0E}\u{FF0E}\u{FF0F}secret",
    ] {
        mcp_post(&gw, &read(uri)).assert_rpc_error(200, json!(7), "invalid_path");
    }
    assert_eq!(received(&mock), 0, "nothing reached the MCP server");
    // Other scripts' text in a name is not a dot or a slash: it goes.
    let r = mcp_post(&gw, &read("file:///public/\u{6587}\u{66F8}.txt"));
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.header("x-loopgate-error").is_none(), "{}", r.text());
    assert_eq!(received(&mock), 1);
}

/// Issue 41 item 12: readers that fold `_` into `-` (CGI, WSGI) take
/// `x_agent_task_id` for `x-agent-task-id`: an agent header whose folded
/// name is one the gateway reads or strips is refused, and an upstream's
/// `x-loopgate_cost_usd` is removed before the agent sees it.
#[test]
fn underscore_spellings_of_gateway_headers_are_refused_or_stripped() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    for h in [
        "x_agent_task_id: t-1\r\n",
        "X_Agent_Task_Id: t-1\r\n",
        "x-agent_task-id: t-1\r\n",
        "x_api_key: sk-other\r\n",
        "idempotency_key: k-1\r\n",
        "x_forwarded_for: 10.0.0.1\r\n",
        "x_loopgate_cost_usd: 0\r\n",
    ] {
        raw(gw.addr, &post_req("/v1/chat/completions", h, CHAT))
            .assert_gateway_error(400, "invalid_header");
        raw(gw.addr, &get_req("/tools/weather/v1/forecast", h))
            .assert_gateway_error(400, "invalid_header");
    }
    assert_eq!(received(&mock), 0, "nothing reached an upstream");
    // An underscore in a name the gateway does not read passes.
    let r = raw(
        gw.addr,
        &post_req("/v1/chat/completions", "x_trace_tag: a\r\n", CHAT),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        recorded_header(&mock.last_request(), "x_trace_tag"),
        Some("a")
    );
    // The upstream's spellings of the gateway's own headers are removed.
    let forged = "x-mock-response-header: x-loopgate_cost_usd: 0.000000\r\n\
                  x-mock-response-header: x_loopgate_provider: elsewhere\r\n\
                  x-mock-response-header: x_request_id: forged\r\n\
                  x-mock-response-header: x-upstream_note: kept\r\n";
    for req in [
        post_req("/v1/chat/completions", forged, CHAT),
        get_req("/tools/weather/v1/forecast", forged),
    ] {
        let r = raw(gw.addr, &req);
        assert_eq!(r.status, 200, "{r:?}");
        for (k, _) in &r.headers {
            let folded = k.to_ascii_lowercase().replace('_', "-");
            assert!(
                !(k.contains('_')
                    && (folded.starts_with("x-loopgate-") || folded == "x-request-id")),
                "{k} reached the agent: {r:?}"
            );
        }
        assert_eq!(r.header("x-upstream_note"), Some("kept"), "{r:?}");
    }
    still_serves(&gw);
}
