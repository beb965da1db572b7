//! `loopgate mock`: a local OpenAI- and Anthropic-compatible provider for
//! the demo, the tests and the benchmarks.
//!
//! Serves chat completions, completions, responses, embeddings, messages and
//! models, non-streaming and as real SSE in each provider's format with a
//! final usage. Faults are injected per request with `x-mock-*` headers, or
//! for every request from the command line (see [`Faults`]). It records the
//! last requests it received (headers, body length and SHA-256, and the
//! body itself up to 128 KiB) at `GET /_mock/requests`, so tests can see
//! exactly what reached a provider, and counts accepted connections,
//! request heads read (whole body or not) and requests recorded at
//! `GET /_mock/stats`: a request forwarded with framing the mock cannot
//! parse still shows as a connection, one whose body never ends as a head.
//!
//! With `--strict` (or `x-mock-strict: 1`) it refuses output limits as the
//! real providers do ([`strict`]).
//!
//! Any path under `/echo` acts as a generic HTTP tool that echoes the
//! method, path, query and body digest it received.
//!
//! Built on Pingora's HTTP/1 server session over a plain tokio listener:
//! keep-alive, chunked streaming and a bound port that can be 0.

mod faults;
mod mcp;
mod responses;
mod strict;

pub use faults::Faults;

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::protocols::http::ServerSession;
use pingora::protocols::Stream;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How many received requests the mock remembers.
const RECORD_LIMIT: usize = 1000;
/// Bodies up to this size are recorded whole.
const RECORD_BODY_LIMIT: usize = 128 * 1024;

#[derive(Debug, Clone, Default)]
pub struct MockOptions {
    pub defaults: Faults,
}

/// One request as it reached the mock.
#[derive(Debug, Clone)]
struct Recorded {
    seq: u64,
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body_len: usize,
    body_sha256: String,
    /// The body as text, when it is at most [`RECORD_BODY_LIMIT`] bytes.
    body: Option<String>,
}

pub struct MockState {
    options: MockOptions,
    seq: AtomicU64,
    connections: AtomicU64,
    /// Request heads read, counted before the body is.
    heads: AtomicU64,
    /// MCP server streams (`GET /mcp`) open now, and opened in all.
    mcp_streams_open: AtomicU64,
    mcp_streams_opened: AtomicU64,
    recorded: Mutex<VecDeque<Recorded>>,
}

impl MockState {
    pub fn new(options: MockOptions) -> Arc<Self> {
        Arc::new(MockState {
            options,
            seq: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            heads: AtomicU64::new(0),
            mcp_streams_open: AtomicU64::new(0),
            mcp_streams_opened: AtomicU64::new(0),
            recorded: Mutex::new(VecDeque::with_capacity(RECORD_LIMIT)),
        })
    }

    fn record(&self, r: Recorded) {
        if let Ok(mut q) = self.recorded.lock() {
            if q.len() == RECORD_LIMIT {
                q.pop_front();
            }
            q.push_back(r);
        }
    }

    fn recorded_json(&self) -> Value {
        let q = match self.recorded.lock() {
            Ok(q) => q.clone(),
            Err(_) => VecDeque::new(),
        };
        json!({
            "requests": q.iter().map(|r| json!({
                "seq": r.seq,
                "method": r.method,
                "path": r.path,
                "headers": r.headers.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
                "body_len": r.body_len,
                "body_sha256": r.body_sha256,
                "body": r.body,
            })).collect::<Vec<_>>()
        })
    }
}

/// Binds `addr` and serves until the process ends. Returns the bound address
/// through `on_bound` (useful with port 0).
pub async fn serve(
    addr: SocketAddr,
    options: MockOptions,
    on_bound: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    // A deep accept queue: a load test's first burst (a thousand upstream
    // connections at once from the gateway) must not overflow it, or the
    // connects time out and the gateway's breaker opens.
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(4096)?;
    on_bound(listener.local_addr()?);
    let state = MockState::new(options);
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                log::warn!("mock: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        state.connections.fetch_add(1, Ordering::Relaxed);
        let state = state.clone();
        tokio::spawn(async move {
            let stream: Stream = Box::new(pingora::protocols::l4::stream::Stream::from(tcp));
            serve_connection(stream, state).await;
        });
    }
}

/// Runs the mock on its own runtime in a background thread; returns the
/// bound address once it is listening.
pub fn spawn(
    addr: SocketAddr,
    options: MockOptions,
    threads: usize,
) -> std::io::Result<SocketAddr> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("loopgate-mock".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads.max(1))
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let tx2 = tx.clone();
            let res = rt.block_on(serve(addr, options, move |a| {
                let _ = tx2.send(Ok(a));
            }));
            if let Err(e) = res {
                let _ = tx.send(Err(e));
            }
        })?;
    rx.recv()
        .map_err(|_| std::io::Error::other("mock thread ended"))?
}

async fn serve_connection(mut stream: Stream, state: Arc<MockState>) {
    loop {
        let mut session = ServerSession::new_http1(stream);
        match session.read_request().await {
            Ok(true) => {}
            _ => return,
        }
        state.heads.fetch_add(1, Ordering::Relaxed);
        let rf = faults::ResponseFaults::from_headers(&session.req_header().headers);
        if !RESPONSE_FAULTS
            .scope(rf, handle(&mut session, &state))
            .await
        {
            return; // fault: drop the connection mid-response
        }
        match session.finish().await {
            Ok(Some(reusable)) => stream = reusable.into_parts().0,
            _ => return,
        }
    }
}

tokio::task_local! {
    /// The current request's [`faults::ResponseFaults`], for the writers.
    static RESPONSE_FAULTS: faults::ResponseFaults;
}

fn response_faults() -> faults::ResponseFaults {
    RESPONSE_FAULTS.try_with(Clone::clone).unwrap_or_default()
}

/// Serves one request. Returns false when the connection must be dropped.
async fn handle(session: &mut ServerSession, state: &MockState) -> bool {
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(_) => return false,
        }
    }
    let req = session.req_header();
    let method = req.method.as_str().to_string();
    let path = req.uri.path().to_string();
    let faults = state.options.defaults.overridden_by(&req.headers);

    if path == "/_mock/requests" {
        return write_json(session, 200, &state.recorded_json(), &[]).await;
    }
    if path == "/_mock/stats" {
        let stats = json!({
            "connections": state.connections.load(Ordering::Relaxed),
            "heads": state.heads.load(Ordering::Relaxed),
            "requests": state.seq.load(Ordering::Relaxed),
            "mcp_streams_open": state.mcp_streams_open.load(Ordering::Relaxed),
            "mcp_streams_opened": state.mcp_streams_opened.load(Ordering::Relaxed),
        });
        return write_json(session, 200, &stats, &[]).await;
    }
    if path == "/_mock/reset" {
        if let Ok(mut q) = state.recorded.lock() {
            q.clear();
        }
        return write_json(session, 200, &json!({"reset": true}), &[]).await;
    }

    state.record(Recorded {
        seq: state.seq.fetch_add(1, Ordering::Relaxed),
        method: method.clone(),
        path: req
            .uri
            .path_and_query()
            .map_or_else(|| path.clone(), |p| p.to_string()),
        headers: req
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body_len: body.len(),
        body_sha256: hex::encode(Sha256::digest(&body)),
        body: (body.len() <= RECORD_BODY_LIMIT)
            .then(|| String::from_utf8_lossy(&body).into_owned()),
    });

    if faults.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(faults.latency_ms)).await;
    }
    let anthropic = path.starts_with("/v1/messages");
    if let Some(status) = faults.status {
        let body = responses::error_body(anthropic, status, "injected fault");
        let retry_after = faults.retry_after.map(|s| s.to_string());
        let extra: Vec<(&str, &str)> = retry_after
            .as_deref()
            .map(|r| vec![("retry-after", r)])
            .unwrap_or_default();
        return write_json(session, status, &body, &extra).await;
    }

    let parsed: Option<Value> = if body.is_empty() {
        None
    } else {
        serde_json::from_slice(&body).ok()
    };
    if faults.upgrade {
        let Ok(mut resp) = ResponseHeader::build(101, Some(2)) else {
            return false;
        };
        let _ = resp.insert_header("upgrade", "websocket");
        let _ = resp.insert_header("connection", "upgrade");
        let _ = session.write_response_header(Box::new(resp)).await;
        return false;
    }
    if let Some(raw) = &faults.body {
        return write_raw(session, raw.as_bytes()).await;
    }
    if path == "/mcp" {
        if method == "GET" {
            return serve_mcp_stream(session, state).await;
        }
        return serve_mcp(session, &method, parsed.as_ref()).await;
    }
    if path.starts_with("/echo") {
        // A generic HTTP tool: echoes what it received.
        let echo = json!({
            "method": method,
            "path": path,
            "query": session.req_header().uri.query(),
            "body_len": body.len(),
            "body_sha256": hex::encode(Sha256::digest(&body)),
        });
        return write_json(session, 200, &echo, &[]).await;
    }
    if (method.as_str(), path.as_str()) == ("POST", "/v1/messages/count_tokens") {
        // Anthropic's answer; the count is the body's length over four
        // (the gateway's own count differs, so a test tells who counted).
        return match parsed.filter(|v| v.is_object()) {
            Some(_) => {
                let tokens = (body.len() / 4).max(1);
                write_json(session, 200, &json!({ "input_tokens": tokens }), &[]).await
            }
            None => {
                let body = responses::error_body(true, 400, "body must be a JSON object");
                write_json(session, 400, &body, &[]).await
            }
        };
    }
    let endpoint = match (method.as_str(), path.as_str()) {
        ("GET", "/v1/models") => {
            return write_json(session, 200, &responses::models(), &[]).await;
        }
        ("POST", p) => responses::Endpoint::from_path(p),
        _ => None,
    };
    let Some(endpoint) = endpoint else {
        let body = responses::error_body(anthropic, 404, &format!("no route {method} {path}"));
        return write_json(session, 404, &body, &[]).await;
    };
    let Some(req_json) = parsed.filter(|v| v.is_object()) else {
        let body = responses::error_body(anthropic, 400, "body must be a JSON object");
        return write_json(session, 400, &body, &[]).await;
    };
    if faults.strict {
        if let Some((status, refusal)) = strict::refusal(endpoint, &req_json, faults.max_output) {
            return write_json(session, status, &refusal, &[]).await;
        }
    }
    let exchange = responses::Exchange::new(endpoint, &req_json, body.len(), &faults);
    if req_json.get("stream").and_then(Value::as_bool) == Some(true)
        && endpoint != responses::Endpoint::Embeddings
    {
        stream_events(session, &exchange, &faults).await
    } else if faults.reset_after.is_some() {
        write_cut_json(session, &exchange.full_response()).await
    } else {
        write_json(session, 200, &exchange.full_response(), &[]).await
    }
}

/// A 200 JSON answer whose connection drops halfway through its body (its
/// `Content-Length` promised all of it).
async fn write_cut_json(session: &mut ServerSession, v: &Value) -> bool {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let Ok(mut resp) = ResponseHeader::build(200, Some(2)) else {
        return false;
    };
    let _ = resp.insert_header("content-type", "application/json");
    let _ = resp.insert_header("content-length", body.len().to_string());
    if session.write_response_header(Box::new(resp)).await.is_ok() {
        let half = Bytes::copy_from_slice(&body[..body.len() / 2]);
        let _ = session.write_response_body(half, false).await;
    }
    false // abrupt end: the connection is not reused
}

async fn serve_mcp(session: &mut ServerSession, method: &str, body: Option<&Value>) -> bool {
    if method == "DELETE" {
        return write_json(session, 200, &json!({}), &[]).await;
    }
    let Some(body) = body.filter(|_| method == "POST") else {
        let err = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "POST a JSON-RPC message"}});
        return write_json(session, 405, &err, &[]).await;
    };
    let initialize = body.get("method").and_then(Value::as_str) == Some("initialize");
    let sid = format!("mock-session-{:016x}", rand_id());
    let extra: Vec<(&str, &str)> = if initialize {
        vec![("mcp-session-id", sid.as_str())]
    } else {
        Vec::new()
    };
    let Some(answer) = mcp::answer_body(body) else {
        let Ok(resp) = ResponseHeader::build(202, Some(1)) else {
            return false;
        };
        if session.write_response_header(Box::new(resp)).await.is_err() {
            return false;
        }
        return session
            .write_response_body(Bytes::new(), true)
            .await
            .is_ok();
    };
    let sse = session
        .req_header()
        .headers
        .get("x-mock-mcp-sse")
        .is_some_and(|v| v.as_bytes() == b"1");
    if !sse {
        return write_json(session, 200, &answer, &extra).await;
    }
    let mut resp = match ResponseHeader::build(200, Some(4)) {
        Ok(r) => r,
        Err(_) => return false,
    };
    let _ = resp.insert_header("content-type", "text/event-stream");
    let _ = resp.insert_header("transfer-encoding", "chunked");
    for (k, v) in &extra {
        let _ = resp.insert_header(k.to_string(), v.to_string());
    }
    if session.write_response_header(Box::new(resp)).await.is_err() {
        return false;
    }
    let progress = json!({"jsonrpc": "2.0", "method": "notifications/message",
        "params": {"level": "info", "data": "working"}});
    for event in [
        format!("event: message\ndata: {progress}\n\n"),
        format!("event: message\nid: 1\ndata: {answer}\n\n"),
    ] {
        if session
            .write_response_body(Bytes::from(event), false)
            .await
            .is_err()
        {
            return false;
        }
    }
    session
        .write_response_body(Bytes::new(), true)
        .await
        .is_ok()
}

/// The MCP server's own stream (`GET /mcp`, server to client): an event
/// stream that stays open, silent (or with a `: ping` comment every
/// `x-mock-mcp-ping-ms`), until the client closes it. Counted open in
/// `/_mock/stats` (`mcp_streams_open`) from its header to the moment the
/// mock sees the close, so tests can tell when a stream was let go.
async fn serve_mcp_stream(session: &mut ServerSession, state: &MockState) -> bool {
    let ping = session
        .req_header()
        .headers
        .get("x-mock-mcp-ping-ms")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis);
    if !write_sse_header(session).await {
        return false;
    }
    /// Counts the stream open until it is dropped.
    struct Open<'a>(&'a MockState);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            self.0.mcp_streams_open.fetch_sub(1, Ordering::Relaxed);
        }
    }
    state.mcp_streams_open.fetch_add(1, Ordering::Relaxed);
    state.mcp_streams_opened.fetch_add(1, Ordering::Relaxed);
    let _open = Open(state);
    loop {
        // The request has no body: this read ends only when the client
        // closes (or sends what it should not).
        let closed = match ping {
            Some(every) => tokio::time::timeout(every, session.read_body_or_idle(true))
                .await
                .is_ok(),
            None => {
                let _ = session.read_body_or_idle(true).await;
                true
            }
        };
        if closed {
            return false;
        }
        let comment = Bytes::from_static(b": ping\n\n");
        if session.write_response_body(comment, false).await.is_err() {
            return false;
        }
    }
}

/// A 200 event-stream header, chunked; false when it could not be written.
async fn write_sse_header(session: &mut ServerSession) -> bool {
    let Ok(mut resp) = ResponseHeader::build(200, Some(3)) else {
        return false;
    };
    let _ = resp.insert_header("content-type", "text/event-stream");
    let _ = resp.insert_header("cache-control", "no-cache");
    let _ = resp.insert_header("transfer-encoding", "chunked");
    session.write_response_header(Box::new(resp)).await.is_ok()
}

/// A session id that differs between calls and processes.
fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

async fn stream_events(
    session: &mut ServerSession,
    ex: &responses::Exchange,
    faults: &Faults,
) -> bool {
    if !write_sse_header(session).await {
        return false;
    }
    let events = ex.stream_events();
    if let Some(n) = faults.bad_event_after {
        // The first n - 1 events as usual, then the n-th and a broken one
        // in one write: one read for the reader.
        for (i, event) in events.iter().take(n).enumerate() {
            if i > 0 && faults.chunk_delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(faults.chunk_delay_ms)).await;
            }
            let mut piece = event.clone();
            if i + 1 == n {
                piece.push_str("event: content_block_delta\ndata: {\"broken\n\n");
            }
            if session
                .write_response_body(Bytes::from(piece), false)
                .await
                .is_err()
            {
                return false;
            }
        }
        return session
            .write_response_body(Bytes::new(), true)
            .await
            .is_ok();
    }
    for (i, event) in events.iter().enumerate() {
        if faults.reset_after.is_some_and(|n| i >= n) {
            return false; // abrupt end: no terminating chunk
        }
        if i > 0 && faults.chunk_delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(faults.chunk_delay_ms)).await;
        }
        if session
            .write_response_body(Bytes::from(event.clone()), false)
            .await
            .is_err()
        {
            return false;
        }
    }
    session
        .write_response_body(Bytes::new(), true)
        .await
        .is_ok()
}

async fn write_raw(session: &mut ServerSession, body: &[u8]) -> bool {
    let Ok(mut resp) = ResponseHeader::build(200, Some(2)) else {
        return false;
    };
    let _ = resp.insert_header("content-type", "text/plain");
    let _ = resp.insert_header("content-length", body.len().to_string());
    if session.write_response_header(Box::new(resp)).await.is_err() {
        return false;
    }
    session
        .write_response_body(Bytes::copy_from_slice(body), true)
        .await
        .is_ok()
}

async fn write_json(
    session: &mut ServerSession,
    status: u16,
    v: &Value,
    extra: &[(&str, &str)],
) -> bool {
    let rf = response_faults();
    let mut body = serde_json::to_vec(v).unwrap_or_default();
    if rf.gzip {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        if enc.write_all(&body).is_err() {
            return false;
        }
        body = enc.finish().unwrap_or_default();
    }
    let Ok(mut resp) = ResponseHeader::build(status, Some(4 + extra.len())) else {
        return false;
    };
    let _ = resp.insert_header("content-type", "application/json");
    let _ = resp.insert_header("content-length", body.len().to_string());
    if rf.gzip {
        let _ = resp.insert_header("content-encoding", "gzip");
    }
    for (k, val) in extra {
        let _ = resp.insert_header(k.to_string(), val.to_string());
    }
    for (k, val) in &rf.headers {
        let _ = resp.append_header(k.to_string(), val.to_string());
    }
    if session.write_response_header(Box::new(resp)).await.is_err() {
        return false;
    }
    session
        .write_response_body(Bytes::from(body), true)
        .await
        .is_ok()
}
