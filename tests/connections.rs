//! The agent listener's connection limits (`listen.connections`) against
//! the real binary over real sockets: load from one address is served,
//! slowness is what gets refused, every header (first or kept-alive) has a
//! deadline, a full listener reclaims waiting connections before it
//! refuses, and every refusal is counted by reason.

use loopgate_tests::*;
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A chat completion as raw bytes, `connection` being `close` or `keep-alive`.
fn chat_request(connection: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {AGENT_KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: {connection}\r\n\r\n{CHAT}",
        CHAT.len()
    )
}

/// The default test config with `listen` as a mapping carrying `connections`.
fn config_with(mock: &Mock, connections: &str) -> String {
    default_config(mock).replace(
        "listen: 127.0.0.1:{PORT}",
        &format!("listen: {{ address: \"127.0.0.1:{{PORT}}\", connections: {connections} }}"),
    )
}

/// Runs a Python client script; it prints one line when its connections
/// are in place and keeps them until its stdin closes.
fn python(script: &str) -> (Child, String) {
    let mut child = Command::new(loopgate_tests::python())
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python (tests/setup-python.sh)");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line.trim().to_string())
}

fn done(mut child: Child) {
    drop(child.stdin.take());
    let _ = child.wait();
}

/// The status of one complete request on a fresh connection.
fn status(gw: &Gateway, bind: Option<&str>) -> u16 {
    let script = format!(
        r#"
import socket
s = socket.socket()
{bind}
s.settimeout(10)
s.connect(("127.0.0.1", {port}))
s.sendall({req:?}.encode())
print(s.recv(64).split(b" ")[1].decode(), flush=True)
"#,
        bind = bind.map_or(String::new(), |ip| format!("s.bind(({ip:?}, 0))")),
        port = gw.addr.port(),
        req = chat_request("close"),
    );
    let (child, line) = python(&script);
    done(child);
    line.parse()
        .unwrap_or_else(|_| panic!("no status: {line:?}"))
}

/// What load tests and agents behind a NAT send: many connections, each
/// with its request promptly. None is refused for sharing an address.
#[test]
fn a_thousand_concurrent_requests_from_one_address_are_all_served() {
    let mock = Mock::start();
    let gw = Gateway::start_default(&mock);
    let script = format!(
        r#"
import resource, socket
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
req = {req:?}.encode()
conns = []
for i in range(1000):
    s = socket.create_connection(("127.0.0.1", {port}))
    s.sendall(req)
    conns.append(s)
codes = {{}}
first = {{}}
for s in conns:
    s.settimeout(30)
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    code = data.split(b" ")[1].decode() if data.startswith(b"HTTP/1.1 ") else "none"
    codes[code] = codes.get(code, 0) + 1
    if code != "200" and code not in first:
        first[code] = data[:400]
print(sorted(codes.items()), flush=True)
for code, data in first.items():
    print(code, data, flush=True)
"#,
        req = chat_request("close"),
        port = gw.addr.port(),
    );
    let (mut child, line) = python(&script);
    // What the script printed after the counts: the first answer of each
    // other status, so a failure says what was answered.
    let mut rest = String::new();
    if let Some(out) = child.stdout.as_mut() {
        let _ = out.read_to_string(&mut rest);
    }
    done(child);
    assert_eq!(
        line, "[('200', 1000)]",
        "every request answered 200; first of each other status: {rest}"
    );
    for reason in ["capacity", "client_share", "header_timeout", "malformed"] {
        assert_eq!(
            gw.metric(&format!(
                "loopgate_connections_refused_total{{reason=\"{reason}\"}}"
            )),
            0.0
        );
    }
}

/// Opens `n` connections from `ip` that send half a request header and
/// hold it, waits `secs`, and counts those answered 503 meanwhile. The
/// connections stay open until the returned child's stdin closes.
fn hold_half_headers(gw: &Gateway, ip: &str, n: usize, secs: f64) -> (Child, usize) {
    let script = format!(
        r#"
import socket, sys, time
held, refused = [], 0
for i in range({n}):
    s = socket.socket()
    s.bind(("{ip}", 0))
    s.connect(("127.0.0.1", {port}))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    held.append(s)
time.sleep({secs})
for s in held:
    s.setblocking(False)
    try:
        if s.recv(4096).startswith(b"HTTP/1.1 503"):
            refused += 1
    except BlockingIOError:
        pass
print(refused, flush=True)
sys.stdin.read()
"#,
        port = gw.addr.port()
    );
    let (child, line) = python(&script);
    let refused = line
        .parse()
        .unwrap_or_else(|_| panic!("no count: {line:?}"));
    (child, refused)
}

/// Slowloris: connections that never finish their headers, from one
/// address, take at most that address's share once they are slow; the
/// rest are answered 503 and counted; everyone else is served.
#[test]
fn connections_that_never_finish_their_headers_take_only_their_clients_share() {
    let mock = Mock::start();
    let gw = Gateway::start(&config_with(&mock, "{ slow_per_client: 100 }"));
    let (child, refused) = hold_half_headers(&gw, "127.0.0.2", 150, 3.0);
    assert_eq!(refused, 50, "150 slow, 100 kept: the rest answered 503");
    assert_eq!(
        gw.metric("loopgate_connections_refused_total{reason=\"client_share\"}"),
        50.0
    );
    // Meanwhile another address, and this one with prompt requests, are served.
    assert_eq!(status(&gw, Some("127.0.0.3")), 200);
    assert_eq!(status(&gw, Some("127.0.0.2")), 200);
    assert_eq!(curl(&[&gw.admin_url("/health")]).status, 200);
    done(child);
    assert_eq!(status(&gw, None), 200);
}

/// A trusted front proxy's address is exempt from the slow share.
#[test]
fn a_trusted_address_is_exempt_from_the_slow_share() {
    let mock = Mock::start();
    let gw = Gateway::start(&config_with(
        &mock,
        "{ slow_per_client: 3, trusted: [127.0.0.2/32] }",
    ));
    let (trusted, refused) = hold_half_headers(&gw, "127.0.0.2", 6, 2.5);
    assert_eq!(refused, 0, "the trusted proxy keeps all six");
    let (other, refused) = hold_half_headers(&gw, "127.0.0.4", 6, 2.5);
    assert_eq!(refused, 3, "another address keeps three");
    done(trusted);
    done(other);
}

/// A full listener closes the connection that has waited longest for a
/// header (a second or more) to make room, so slow connections cannot lock
/// others out.
#[test]
fn a_full_listener_reclaims_waiting_connections_before_it_refuses() {
    let mock = Mock::start();
    let gw = Gateway::start(&config_with(&mock, "{ max: 40, slow_per_client: 1000 }"));
    // 60 half-sent headers from one address at once: the listener holds
    // 40; the other 20 find nothing waiting long enough to reclaim yet.
    let (child, refused) = hold_half_headers(&gw, "127.0.0.2", 60, 1.5);
    assert_eq!(refused, 20);
    assert_eq!(
        gw.metric("loopgate_connections_refused_total{reason=\"capacity\"}"),
        20.0
    );
    assert_eq!(gw.metric("loopgate_connections_reclaimed_total"), 0.0);
    // Now they have waited: another client is served. Its first connection
    // takes the oldest slow one's place; that place stays free for the
    // next ones.
    for _ in 0..5 {
        assert_eq!(status(&gw, Some("127.0.0.3")), 200);
    }
    assert_eq!(gw.metric("loopgate_connections_reclaimed_total"), 1.0);
    assert_eq!(
        gw.metric("loopgate_connections_refused_total{reason=\"capacity\"}"),
        20.0
    );
    assert!(gw.metric("loopgate_connections_open") <= 41.0);
    done(child);
}

/// A header trickled a byte at a time never finishes: the deadline ends it.
#[test]
fn a_request_header_must_arrive_whole_within_the_deadline() {
    let mock = Mock::start();
    let gw = Gateway::start(&config_with(&mock, "{ header_timeout_ms: 3000 }"));
    let answer = trickle(&mut TcpStream::connect(gw.addr).unwrap());
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(
        answer.contains("\"code\":\"request_timeout\""),
        "{answer:?}"
    );
    assert_eq!(
        gw.metric("loopgate_connections_refused_total{reason=\"header_timeout\"}"),
        1.0
    );
    assert_eq!(status(&gw, None), 200);
}

/// Sends a header a byte every 400 ms until the gateway answers; returns
/// what it answered.
fn trickle(s: &mut TcpStream) -> String {
    trickle_after(
        s,
        b"",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    )
}

/// Sends `prompt` at once, then `drip` (over and over) a byte every 400 ms
/// until the gateway answers; returns what it answered.
fn trickle_after(s: &mut TcpStream, prompt: &[u8], drip: &[u8]) -> String {
    s.write_all(prompt).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    for b in drip.iter().cycle() {
        if s.write_all(&[*b]).is_err() || started.elapsed() > Duration::from_secs(30) {
            break;
        }
        let mut buf = [0u8; 1024];
        if let Ok(n) = s.read(&mut buf) {
            answer.extend_from_slice(&buf[..n]);
            if n == 0 || !answer.is_empty() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    // The rest of the answer, if it came in pieces.
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    answer.extend_from_slice(&rest);
    String::from_utf8_lossy(&answer).into_owned()
}

/// Reads one response with `content-length` off a kept-alive connection.
fn read_one(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                return String::from_utf8_lossy(&buf[..end + 4 + len]).into_owned();
            }
        }
        let n = s.read(&mut chunk).expect("read a response");
        assert!(
            n > 0,
            "closed mid-response: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The deadline holds for every request on a connection, not only the
/// first; an idle kept-alive connection is closed quietly.
#[test]
fn kept_alive_connections_have_a_header_deadline_and_an_idle_timeout() {
    let mock = Mock::start();
    let gw = Gateway::start(&config_with(
        &mock,
        "{ header_timeout_ms: 3000, idle_timeout_ms: 2000 }",
    ));
    // One prompt request, then the next header trickled.
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.write_all(chat_request("keep-alive").as_bytes()).unwrap();
    assert!(read_one(&mut s).starts_with("HTTP/1.1 200"));
    let answer = trickle(&mut s);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");

    // Prompt requests on one connection, then silence: closed, no answer.
    let mut s = TcpStream::connect(gw.addr).unwrap();
    for _ in 0..3 {
        s.write_all(chat_request("keep-alive").as_bytes()).unwrap();
        assert!(read_one(&mut s).starts_with("HTTP/1.1 200"));
    }
    let idle = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    assert!(
        idle.elapsed() < Duration::from_secs(9),
        "closed at its idle timeout"
    );
    assert_eq!(
        gw.metric("loopgate_connections_refused_total{reason=\"header_timeout\"}"),
        1.0,
        "the idle close is no refusal"
    );
}

#[test]
fn bad_connection_limits_name_the_field() {
    let dir = scratch_dir("conn-config");
    let bad = [
        (
            "listen: { address: \"127.0.0.1:1\", connections: { slow_per_clients: 1 } }",
            "slow_per_clients",
        ),
        (
            "listen: { address: \"127.0.0.1:1\", connections: { trusted: [10.0.0.0/33] } }",
            "listen.connections.trusted[0]",
        ),
        (
            "listen: { address: \"127.0.0.1:1\", connections: { header_timeout_ms: 0 } }",
            "listen.connections.header_timeout_ms",
        ),
        (
            "listen: { address: \"127.0.0.1:1\", connections: { body_timeout_ms: 0 } }",
            "listen.connections.body_timeout_ms",
        ),
        (
            "listen: { address: \"127.0.0.1:1\", connections: { body_min_bytes_per_sec: -1 } }",
            "body_min_bytes_per_sec",
        ),
        ("listen: { address: nope }", "listen.address"),
    ];
    for (listen, named) in bad {
        let path = dir.join("bad.yaml");
        std::fs::write(
            &path,
            format!("{listen}\nproviders: {{ p: {{ kind: openai_compatible, base_url: \"http://127.0.0.1:1\" }} }}\n"),
        )
        .unwrap();
        let out = Command::new(bin())
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{listen}: {text}");
        assert!(text.contains("bad.yaml"), "{listen}: {text}");
        assert!(text.contains(named), "{listen}: {text}");
    }
}

/// The default gateway writing its access log to a fresh file: the
/// gateway and the log's path.
fn logging_gateway(mock: &Mock, tag: &str) -> (Gateway, std::path::PathBuf) {
    let log = scratch_dir(tag).join("access.log");
    let gw = Gateway::start(&format!(
        "{}\naccess_log: {{ path: \"{}\" }}\n",
        default_config(mock),
        log.display()
    ));
    (gw, log)
}

/// A client may half-close after its whole request (`nc -N`, HTTP/1.0
/// style): it is answered, and the access log says what happened upstream.
#[test]
fn a_half_closed_client_is_answered_and_logged_truly() {
    let mock = Mock::start();
    let (gw, log) = logging_gateway(&mock, "half-close");
    for i in 0..5 {
        let mut s = TcpStream::connect(gw.addr).unwrap();
        let req = chat_request("close").replace(
            "Connection: close\r\n",
            // Slow enough that the FIN arrives while the upstream works.
            "Connection: close\r\nx-mock-latency-ms: 200\r\n",
        );
        s.write_all(req.as_bytes()).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = Vec::new();
        s.read_to_end(&mut answer)
            .expect("an answer, then the close");
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 200"), "{i}: {text:?}");
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .expect("content-length");
        assert_eq!(body.len(), len, "{i}: the whole body");
        assert!(body.contains("chat.completion"), "{i}: {body}");
    }
    assert_eq!(mock.requests().len(), 5);
    assert!(eventually(5, || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() >= 5)
    }));
    for line in std::fs::read_to_string(&log).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["status"], 200, "{v}");
        assert_eq!(v["provider"], "oa", "{v}");
        assert_eq!(v["decision"], "allow", "{v}");
        assert_eq!(v["upstream_status"], 200, "{v}");
    }
}

/// An agent that leaves mid-stream: the log names the provider the request
/// went to and `client_closed`, not a bad request.
#[test]
fn an_agent_that_leaves_mid_stream_is_logged_as_such() {
    let mock = Mock::start();
    let (gw, log) = logging_gateway(&mock, "client-left");
    let body =
        r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {AGENT_KEY}\r\nContent-Type: application/json\r\nx-mock-chunks: 50\r\nx-mock-chunk-delay-ms: 50\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut first = [0u8; 64];
    let n = s.read(&mut first).unwrap();
    assert!(first[..n].starts_with(b"HTTP/1.1 200"));
    drop(s);
    assert!(eventually(10, || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() == 1)
    }));
    let line = std::fs::read_to_string(&log).unwrap();
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(v["code"], "client_closed", "{v}");
    assert_eq!(v["provider"], "oa", "{v}");
    assert_eq!(v["upstream_status"], 200, "{v}");
    assert_eq!(mock.requests().len(), 1);
}

/// Sends `first` on a fresh connection and reads its answer; then holds
/// the gateway to what the answer said: `connection: close` and the
/// connection closes with nothing more, else (keep-alive) a second request
/// on it is served. Returns the first answer's status line and whether it
/// was kept alive.
fn keeps_its_word(gw: &Gateway, first: &[u8]) -> (String, bool) {
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.write_all(first).unwrap();
    let answer = read_one(&mut s);
    let status = answer.lines().next().unwrap_or_default().to_string();
    let head = answer
        .split("\r\n\r\n")
        .next()
        .unwrap()
        .to_ascii_lowercase();
    let close = head.lines().any(|l| l == "connection: close");
    if close {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(
            rest.is_empty(),
            "{status}: said close, then sent {:?}",
            String::from_utf8_lossy(&rest)
        );
    } else {
        assert!(
            head.lines().any(|l| l == "connection: keep-alive"),
            "{status}: says neither close nor keep-alive: {head}"
        );
        let next = s
            .write_all(chat_request("keep-alive").as_bytes())
            .map(|()| read_one_or_closed(&mut s));
        match next {
            Ok(Some(a)) => assert!(a.starts_with("HTTP/1.1 200"), "{status}: then {a:?}"),
            _ => panic!("{status}: said keep-alive, then lost the next request"),
        }
    }
    (status, !close)
}

/// [`read_one`], or `None` when the gateway closes before any answer.
fn read_one_or_closed(s: &mut TcpStream) -> Option<String> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut first = [0u8; 1];
    match s.peek(&mut first) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(read_one(s)),
    }
}

/// Every answer, refusals included, tells the truth about the connection:
/// one that says `keep-alive` serves the next request on it, one that
/// closes says `close`. The gateway's failures after routing (an
/// unreachable provider, an open circuit, for small and large bodies) are
/// answered and then closed by Pingora, so they say `close`; refusals
/// whose request was read whole keep the connection.
#[test]
fn every_answer_says_whether_the_connection_stays_open() {
    let mock = Mock::start();
    let dead = format!("http://127.0.0.1:{}", free_port());
    let yaml = default_config(&mock)
        .replace(
            "  an:\n",
            &format!("  dead:\n    kind: openai_compatible\n    base_url: {dead}\n    api_key_env: LOOPGATE_TEST_UPSTREAM_KEY\n    breaker: {{ consecutive_failures: 1, open_ms: 60000 }}\n  an:\n"),
        )
        .replace(
            "  - models: [\"claude-3-5-haiku*\"]\n",
            "  - models: [gpt-dead]\n    targets: [ { provider: dead } ]\n  - models: [\"claude-3-5-haiku*\"]\n",
        )
        .replace("models: [gpt-4o-mini, text", "models: [gpt-dead, gpt-4o-mini, text");
    let gw = Gateway::start(&yaml);
    let post = |key: &str, body: &str| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    };
    let dead_chat = r#"{"model":"gpt-dead","messages":[{"role":"user","content":"hi"}]}"#;
    let large = format!(
        r#"{{"model":"gpt-dead","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "z".repeat(80 * 1024)
    );
    // What each answer does with the connection: `Some(kept)` where that
    // is part of the contract (a request read whole keeps it), `None`
    // where either is right.
    let cases: Vec<(&str, Vec<u8>, Option<bool>)> = vec![
        ("unreachable", post(AGENT_KEY, dead_chat), Some(false)),
        ("circuit open", post(AGENT_KEY, dead_chat), Some(true)),
        ("circuit open, large body", post(AGENT_KEY, &large), Some(true)),
        ("unknown key", post("nope", CHAT), None),
        ("model not allowed", post(NARROW_KEY, CHAT), Some(true)),
        ("bad JSON", post(AGENT_KEY, "{"), Some(true)),
        (
            "body too large, unsent",
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {AGENT_KEY}\r\nContent-Length: {}\r\n\r\n",
                MAX_BODY + 1
            )
            .into_bytes(),
            Some(false),
        ),
        ("served", chat_request("keep-alive").into_bytes(), Some(true)),
    ];
    let mut follow_ups = 0;
    for (what, req, want) in cases {
        let (status, kept) = keeps_its_word(&gw, &req);
        if let Some(want) = want {
            assert_eq!(kept, want, "{what}: {status}");
        }
        follow_ups += usize::from(kept);
    }
    // Only `served` and the follow-ups on kept connections reached it.
    assert_eq!(mock.requests().len(), 1 + follow_ups);
}

/// Reads until the gateway closes; what it answered.
fn read_to_close(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// A header whose lines end in a bare LF never ends (no CRLF CRLF comes),
/// and a reader that takes LF as a line end disagrees with one that does
/// not on where headers end: refused at once with 400, on a fresh or a
/// kept-alive connection, and nothing reaches the upstream. A bare LF in
/// the body is the body's business.
#[test]
fn a_header_with_bare_lf_line_ends_is_refused_at_once() {
    let mock = Mock::start();
    // A long header deadline: waiting it out would answer 408, not 400.
    let gw = Gateway::start(&config_with(&mock, "{ header_timeout_ms: 60000 }"));
    let bare = [
        "GET /v1/models HTTP/1.1\nHost: x\n\n".to_string(),
        format!("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {AGENT_KEY}\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ];
    for req in &bare {
        let mut s = TcpStream::connect(gw.addr).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let answer = read_to_close(&mut s);
        assert!(answer.starts_with("HTTP/1.1 400"), "{req:?}: {answer:?}");
        assert!(answer.contains("\"code\":\"bad_request\""), "{answer:?}");
        assert!(
            answer.contains("x-loopgate-error: bad_request"),
            "{answer:?}"
        );
        assert!(answer.contains("connection: close"), "{answer:?}");
    }
    // On a kept-alive connection, after a request served.
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.write_all(chat_request("keep-alive").as_bytes()).unwrap();
    assert!(read_one(&mut s).starts_with("HTTP/1.1 200"));
    s.write_all(bare[0].as_bytes()).unwrap();
    let answer = read_to_close(&mut s);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert_eq!(
        gw.metric("loopgate_connections_refused_total{reason=\"malformed\"}"),
        3.0
    );
    assert_eq!(
        gw.metric("loopgate_connections_refused_total{reason=\"header_timeout\"}"),
        0.0
    );
    // CRLF headers with LFs in the body are served.
    let body = "{\n\"model\": \"gpt-4o-mini\",\n\"messages\": []\n}\n";
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {AGENT_KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let answer = read_to_close(&mut s);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert_eq!(mock.requests().len(), 2, "the two served requests only");
}

/// The issue's scenario, small: connections from two addresses each finish
/// one request, then trickle the next header, until they fill the
/// listener. They are waiting for a header (slowly), not being served: a
/// client from a third address takes the place of the one that has waited
/// longest, every time, and nobody is refused for capacity.
#[test]
fn trickling_kept_alive_connections_are_reclaimed_for_a_new_client() {
    let mock = Mock::start();
    let gw = Gateway::start(&config_with(&mock, "{ max: 40 }"));
    let script = format!(
        r#"
import socket, sys, threading, time
req = {req:?}.encode()
conns = []
for ip in ("127.0.0.2", "127.0.0.3"):
    for i in range(20):
        s = socket.socket()
        s.bind((ip, 0))
        s.connect(("127.0.0.1", {port}))
        s.settimeout(10)
        s.sendall(req)
        data = b""
        while b"chat.completion" not in data:
            data += s.recv(65536)
        assert data.startswith(b"HTTP/1.1 200"), data
        conns.append(s)
stop = False
def trickle():
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 10000
    i = 0
    while not stop and i < len(head):
        for s in conns:
            try:
                s.send(head[i:i + 1])
            except OSError:
                pass
        i += 1
        time.sleep(0.2)
t = threading.Thread(target=trickle)
t.start()
print("ready", flush=True)
sys.stdin.read()
stop = True
t.join()
"#,
        req = chat_request("keep-alive"),
        port = gw.addr.port(),
    );
    let (child, line) = python(&script);
    assert_eq!(line, "ready");
    assert_eq!(gw.metric("loopgate_connections_open"), 40.0);
    // A second: long enough to count as waiting.
    std::thread::sleep(Duration::from_millis(1500));
    for _ in 0..5 {
        assert_eq!(status(&gw, Some("127.0.0.4")), 200);
    }
    assert_eq!(
        gw.metric("loopgate_connections_refused_total{reason=\"capacity\"}"),
        0.0
    );
    assert!(gw.metric("loopgate_connections_reclaimed_total") >= 1.0);
    done(child);
}

/// A gateway whose bodies must arrive within 1.5 s (a trickle earns
/// nothing more), with a tool whose bodies are streamed upstream unread.
fn body_deadline_gateway(mock: &Mock, min_rate: u64) -> Gateway {
    let yaml = config_with(
        mock,
        &format!("{{ body_timeout_ms: 1500, body_min_bytes_per_sec: {min_rate} }}"),
    )
    .replace(
        ", \"claude-3-5-haiku*\"]\n",
        ", \"claude-3-5-haiku*\"]\n    tool_access:\n      orders: { methods: [POST], paths: [\"/*\"] }\n",
    );
    Gateway::start(&format!(
        "{yaml}tools:\n  orders:\n    base_url: \"{}/echo/orders\"\n",
        mock.url()
    ))
}

/// The 408 a late body gets: structured, and the connection closed.
fn assert_late_body(answer: &str, what: &str) {
    assert!(answer.starts_with("HTTP/1.1 408"), "{what}: {answer:?}");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("x-loopgate-error: request_timeout"),
        "{what}: {head}"
    );
    assert!(head.contains("connection: close"), "{what}: {head}");
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["error"]["code"], "request_timeout", "{what}: {v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{what}: {v}");
    assert_eq!(v["error"]["retryable"], true, "{what}: {v}");
}

/// A prompt header then a body trickled a byte at a time: the body has a
/// deadline too, on a fresh connection and on a kept-alive one, whether
/// admission reads the body (a model call) or Pingora streams it to the
/// upstream as it comes (a tool call). Nothing half-sent is served.
#[test]
fn a_body_trickled_after_a_prompt_header_has_a_deadline() {
    let mock = Mock::start();
    let gw = body_deadline_gateway(&mock, 1_000_000);
    let head = |path: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {AGENT_KEY}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{\"model\":\"gpt-4o-mini\",\"messages\":[]"
        )
        .into_bytes()
    };
    let model = head("/v1/chat/completions");
    let tool = head("/tools/orders/orders");
    let mut s = TcpStream::connect(gw.addr).unwrap();
    assert_late_body(&trickle_after(&mut s, &model, b" "), "model call");
    let mut s = TcpStream::connect(gw.addr).unwrap();
    assert_late_body(&trickle_after(&mut s, &tool, b" "), "tool call");
    // After a request served on the same connection.
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.write_all(chat_request("keep-alive").as_bytes()).unwrap();
    assert!(read_one(&mut s).starts_with("HTTP/1.1 200"));
    assert_late_body(&trickle_after(&mut s, &model, b" "), "kept alive");
    assert_eq!(
        mock.requests().len(),
        1,
        "only the whole request was served"
    );
    assert_eq!(
        gw.metric("loopgate_denials_total{code=\"request_timeout\"}"),
        3.0
    );
    // The gateway still serves.
    assert_eq!(status(&gw, None), 200);
}

/// The deadline grows with what the body delivers: an honest body sent
/// steadily for longer than `body_timeout_ms`, faster than
/// `body_min_bytes_per_sec`, is served whole.
#[test]
fn a_steady_body_earns_more_time_than_the_base_deadline() {
    let mock = Mock::start();
    // 1.5 s, plus a second per 1,000 bytes; the body below comes at about
    // 4,000 bytes a second for 3 s.
    let gw = body_deadline_gateway(&mock, 1000);
    let content = "x".repeat(12_000);
    let body = format!(
        r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"{content}"}}]}}"#
    );
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {AGENT_KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    for piece in body.as_bytes().chunks(400) {
        s.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    let answer = read_to_close(&mut s);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert_eq!(
        mock.last_request()["body_sha256"],
        sha256_hex(body.as_bytes())
    );
}

/// A request answered before its body was read (an unknown path) is not
/// kept alive (Pingora would otherwise read the rest off first, with no
/// deadline but its per-read timeout): a trickle after the answer holds
/// nothing.
#[test]
fn a_body_trickled_after_its_answer_holds_nothing() {
    let mock = Mock::start();
    let gw = body_deadline_gateway(&mock, 1_000_000);
    let mut s = TcpStream::connect(gw.addr).unwrap();
    let head = format!(
        "POST /v1/nowhere HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {AGENT_KEY}\r\nContent-Length: 100000\r\n\r\n{{"
    );
    s.write_all(head.as_bytes()).unwrap();
    let answer = read_one(&mut s);
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer:?}");
    assert!(answer.contains("Connection: close"), "{answer:?}");
    // Keep trickling the body: the gateway must end the connection.
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let started = Instant::now();
    let closed = loop {
        if s.write_all(b" ").is_err() {
            break true;
        }
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) | Err(_) if started.elapsed() > Duration::from_secs(60) => break false,
            Ok(0) => break true,
            Ok(n) => panic!(
                "more after the answer: {:?}",
                String::from_utf8_lossy(&buf[..n])
            ),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(closed, "the trickle held the connection");
}
