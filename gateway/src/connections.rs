//! Connection admission on the agent listener: what slow clients may hold,
//! how many connections the gateway holds in all, and the header deadline
//! of every request on a connection (`listen.connections` in the config).
//!
//! The defence targets slowness, not concurrency. Pingora reads a request
//! header with a per-read timeout only, so a client that trickles a byte
//! now and then holds its connection (and a descriptor) indefinitely:
//! 1,100 such connections took a 1,024-descriptor gateway down for
//! everyone. One address, on the other hand, is what a gateway sees behind
//! a load balancer, a NAT or one busy agent host, and what every load test
//! sends, so the number of connections from an address is not limited.
//!
//! - Each request header (the first and every kept-alive one) is read here
//!   before Pingora parses it, and must arrive whole within
//!   `header_timeout` of its first byte (of the accept, for the first
//!   request): 408 and closed otherwise. A kept-alive connection waits
//!   `idle_timeout` for its next request and is then closed quietly.
//! - A header line ended by a bare LF is refused at once (400, see
//!   [`scan`]): it would never end, and it must not be read leniently.
//! - A body has a deadline too ([`BodyDeadline`]), kept by the proxy as it
//!   reads the body (408).
//! - A connection still short of its first header after [`SLOW_AFTER`], or
//!   trickling a later one for that long, is slow; one address may hold
//!   `slow_per_client` slow connections (`trusted` ranges are exempt),
//!   and the next is answered 503 and closed.
//! - The total keeps half the descriptors the process may open, less a
//!   reserve, so every admitted connection can still open its upstream
//!   connection and the admin listener keeps working. When it is reached,
//!   the connection that has waited longest for a request header (for
//!   [`SLOW_AFTER`] or more: idle, or slow) is closed to make room; only
//!   when none waits is the new one refused (503). A prompt request
//!   registers nothing: the wait costs it one timer.
//!
//! Every refusal is counted in `loopgate_connections_refused_total{reason}`
//! and logged at most once a second.

use crate::config::Config;
use crate::metrics::Metrics;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use tokio::time::Instant;

/// A header still incomplete after this is slow: a client's request
/// header is one write, so even a loaded network delivers it well within.
pub const SLOW_AFTER: Duration = Duration::from_secs(1);
/// Header bytes read ahead at most; Pingora refuses larger headers itself.
const HEADER_READ_AHEAD: usize = 64 * 1024;

/// `listen.connections`, validated (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectionLimits {
    pub slow_per_client: usize,
    /// `None`: from the open-file limit ([`total_for`]).
    pub max: Option<usize>,
    pub header_timeout: Duration,
    /// See [`BodyDeadline`].
    pub body_timeout: Duration,
    /// Body bytes a second that earn a second more (0: none do).
    pub body_min_rate: u64,
    pub idle_timeout: Duration,
    /// What request bodies, and judging them, may hold in all
    /// (`body_memory_bytes`; see `proxy::buffers`).
    pub body_memory: u64,
    pub reserve_fds: usize,
    pub trusted: Vec<ipnet::IpNet>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            slow_per_client: 256,
            max: None,
            header_timeout: Duration::from_secs(15),
            body_timeout: Duration::from_secs(20),
            body_min_rate: 16 * 1024,
            idle_timeout: Duration::from_secs(60),
            body_memory: crate::proxy::buffers::TOTAL_BYTES,
            reserve_fds: 128,
            trusted: Vec::new(),
        }
    }
}

impl ConnectionLimits {
    fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    /// The total for a process that may open `nofile` descriptors.
    pub fn total(&self, nofile: u64) -> usize {
        self.max
            .unwrap_or_else(|| total_for(nofile, self.reserve_fds))
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "slow_per_client": self.slow_per_client,
            "max": self.max,
            "header_timeout_ms": self.header_timeout.as_millis() as u64,
            "body_timeout_ms": self.body_timeout.as_millis() as u64,
            "body_min_bytes_per_sec": self.body_min_rate,
            "idle_timeout_ms": self.idle_timeout.as_millis() as u64,
            "body_memory_bytes": self.body_memory,
            "reserve_fds": self.reserve_fds,
            "trusted": self.trusted.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
        })
    }
}

/// The most a body's bytes can add to its deadline: a day.
const MAX_EARNED_SECS: u64 = 24 * 3600;

/// When a request body must have arrived: `body_timeout` after its header,
/// plus a second for every `body_min_rate` bytes received so far, as
/// Apache's `mod_reqtimeout` does (`body=20,MinRate=...`). A body trickled
/// after a prompt header would otherwise hold its connection (and, for a
/// body streamed to a tool, an upstream connection too) for as long as it
/// keeps a byte coming within each read timeout. The header's own
/// deadline is enforced above, before Pingora parses it; the body is read
/// by the proxy, which asks this at every read.
#[derive(Debug, Clone, Copy)]
pub struct BodyDeadline {
    start: Instant,
    timeout: Duration,
    min_rate: u64,
}

impl BodyDeadline {
    /// The deadline of a body whose header was read at `start`.
    pub fn new(limits: &ConnectionLimits, start: std::time::Instant) -> BodyDeadline {
        BodyDeadline {
            start: start.into(),
            timeout: limits.body_timeout,
            min_rate: limits.body_min_rate,
        }
    }

    /// When the body must be whole, `received` bytes into it.
    pub fn at(&self, received: u64) -> Instant {
        let earned = match self.min_rate {
            0 => Duration::ZERO,
            // Capped so no body size can overflow the clock.
            rate => Duration::from_secs((received / rate).min(MAX_EARNED_SECS)),
        };
        self.start + self.timeout + earned
    }

    /// The answer once it has passed.
    pub fn expired(&self) -> crate::error::GatewayError {
        let earned = match self.min_rate {
            0 => String::new(),
            rate => format!(", and a second more per {rate} bytes received"),
        };
        crate::error::GatewayError::RequestTimeout(format!(
            "the request body did not arrive in time ({} ms{earned})",
            self.timeout.as_millis()
        ))
    }
}

/// Why a connection was ended before a request was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The listener is full and no connection waits to be reclaimed.
    Capacity,
    /// Too many slow connections from this address.
    ClientShare,
    /// A request header did not arrive whole in time.
    HeaderTimeout,
    /// A request header with a line ended by a bare LF (see [`scan`]).
    Malformed,
}

impl Refusal {
    pub const ALL: [Refusal; 4] = [
        Refusal::Capacity,
        Refusal::ClientShare,
        Refusal::HeaderTimeout,
        Refusal::Malformed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Capacity => "capacity",
            Refusal::ClientShare => "client_share",
            Refusal::HeaderTimeout => "header_timeout",
            Refusal::Malformed => "malformed",
        }
    }

    fn answer(self) -> &'static [u8] {
        match self {
            Refusal::Capacity | Refusal::ClientShare => REFUSED,
            Refusal::HeaderTimeout => TIMED_OUT,
            Refusal::Malformed => MALFORMED,
        }
    }
}

/// The agent listener's app: Pingora's HTTP proxy behind the limits. It
/// runs the HTTP/1 keep-alive loop itself (as Pingora's own `ServerApp`
/// does) so that every request's header passes the deadline.
pub struct Limited<A> {
    inner: Arc<A>,
    config: Arc<ArcSwap<Config>>,
    metrics: Arc<Metrics>,
    nofile: u64,
    total: AtomicUsize,
    /// Slow connections per address.
    slow: Mutex<HashMap<IpAddr, usize>>,
    /// Connections waiting for a request header, oldest first, with the
    /// signal that closes them.
    waiting: Mutex<BTreeMap<u64, Arc<Notify>>>,
    next_wait: AtomicU64,
    log: RefusalLog,
}

impl<A> Limited<A> {
    pub fn new(
        inner: A,
        config: Arc<ArcSwap<Config>>,
        metrics: Arc<Metrics>,
        nofile: u64,
    ) -> Limited<A> {
        Limited {
            inner: Arc::new(inner),
            config,
            metrics,
            nofile,
            total: AtomicUsize::new(0),
            slow: Mutex::new(HashMap::new()),
            waiting: Mutex::new(BTreeMap::new()),
            next_wait: AtomicU64::new(0),
            log: RefusalLog::default(),
        }
    }

    /// Takes a place for a new connection, reclaiming the longest-waiting
    /// one when the total is reached; `None` when nothing can be reclaimed.
    fn admit(&self, total: usize) -> Option<Place<'_, A>> {
        if self.total.fetch_add(1, Ordering::Relaxed) >= total && !self.reclaim() {
            self.total.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        self.metrics.connections_open.inc();
        Some(Place { app: self })
    }

    /// Signals the connection that has waited longest for a header to
    /// close. Its place is given back when it does (moments later); the
    /// reserve in the total covers the overlap.
    fn reclaim(&self) -> bool {
        let Some((_, signal)) = self.waiting.lock().ok().and_then(|mut w| w.pop_first()) else {
            return false;
        };
        signal.notify_one();
        self.metrics.connections_reclaimed.inc();
        true
    }

    /// Counts a slow connection of `ip`, or `None` past its share.
    fn slow_mark(&self, ip: IpAddr, limits: &ConnectionLimits) -> Option<SlowMark<'_, A>> {
        let mut map = self.slow.lock().ok()?;
        let n = map.entry(ip).or_insert(0);
        if *n >= limits.slow_per_client && !limits.trusts(ip) {
            return None;
        }
        *n += 1;
        Some(SlowMark { app: self, ip })
    }

    /// Answers a refusal (best effort) and closes.
    async fn refuse<S: tokio::io::AsyncWrite + Unpin>(
        &self,
        mut stream: S,
        why: Refusal,
        ip: Option<IpAddr>,
    ) {
        self.metrics
            .connections_refused
            .with_label_values(&[why.as_str()])
            .inc();
        self.log.note(why, ip);
        let _ = stream.write_all(why.answer()).await;
        let _ = stream.shutdown().await;
    }

    /// Reads ahead until a request header is complete, within the
    /// deadlines, and puts what it read back for Pingora to parse. `None`:
    /// the connection is done (refused, reclaimed, idle, or gone).
    async fn next_header(
        &self,
        stream: Stream,
        ip: Option<IpAddr>,
        first: bool,
        limits: &ConnectionLimits,
    ) -> Option<Stream> {
        use pingora::protocols::l4::stream::Stream as Tcp;
        if !stream.as_any().is::<Tcp>() {
            return Some(stream); // not plain TCP (none today): Pingora's own timeouts
        }
        let mut tcp: Box<Tcp> = stream.into_any().downcast().ok()?;
        let start = Instant::now();
        // The first request's clock runs from the accept; a later one's
        // from its first byte, after an idle wait of up to `idle_timeout`.
        let mut header_by = first.then_some(start + limits.header_timeout);
        let mut slow_at = first.then_some(start + SLOW_AFTER);
        let idle_until = start + limits.idle_timeout;
        // Reclaimable once it has waited SLOW_AFTER: a prompt request, the
        // common case, registers nothing and waits on one timer.
        let mut register_at = Some(start + SLOW_AFTER);
        let mut waiting: Option<(Arc<Notify>, Waiting<'_, A>)> = None;
        let mut slow_mark = None;
        // Read straight into spare capacity: a zeroed 4 KiB buffer per
        // request cost ~4k instructions of memset (callgrind).
        let mut seen: Vec<u8> = Vec::with_capacity(4096);
        loop {
            let wake = [slow_at, register_at]
                .into_iter()
                .flatten()
                .fold(header_by.unwrap_or(idle_until), Instant::min);
            if seen.capacity() - seen.len() < 1024 {
                seen.reserve(4096);
            }
            let before = seen.len();
            let read = match &waiting {
                None => tokio::time::timeout_at(wake, tcp.read_buf(&mut seen)).await,
                Some((signal, _)) => tokio::select! {
                    biased;
                    r = tokio::time::timeout_at(wake, tcp.read_buf(&mut seen)) => r,
                    _ = signal.notified() => {
                        // Reclaimed for a new connection. An idle kept-alive
                        // connection just closes, as at its idle timeout.
                        if before > 0 || first {
                            let _ = tcp.write_all(REFUSED).await;
                        }
                        let _ = tcp.shutdown().await;
                        return None;
                    }
                },
            };
            match read {
                Err(_) => {
                    let now = Instant::now();
                    if header_by.is_none() && now >= idle_until {
                        return None; // idle: closed quietly
                    }
                    if header_by.is_some_and(|h| now >= h) {
                        self.refuse(tcp, Refusal::HeaderTimeout, ip).await;
                        return None;
                    }
                    if register_at.is_some_and(|t| now >= t) {
                        register_at = None;
                        let signal = Arc::new(Notify::new());
                        waiting = Some((signal.clone(), Waiting::new(self, signal)));
                    }
                    if slow_at.is_some_and(|t| now >= t) {
                        // Slow: it counts against its address's share now.
                        slow_at = None;
                        if let Some(ip) = ip {
                            match self.slow_mark(ip, limits) {
                                Some(m) => slow_mark = Some(m),
                                None => {
                                    self.refuse(tcp, Refusal::ClientShare, Some(ip)).await;
                                    return None;
                                }
                            }
                        }
                    }
                }
                Ok(Ok(0)) | Ok(Err(_)) => return None,
                Ok(Ok(_)) => {
                    if header_by.is_none() {
                        let now = Instant::now();
                        header_by = Some(now + limits.header_timeout);
                        slow_at = Some(now + SLOW_AFTER);
                    }
                    match scan(&seen, before) {
                        Scan::Complete => break,
                        Scan::BareLf => {
                            self.refuse(tcp, Refusal::Malformed, ip).await;
                            return None;
                        }
                        Scan::Incomplete if seen.len() >= HEADER_READ_AHEAD => break,
                        Scan::Incomplete => {}
                    }
                }
            }
        }
        drop(waiting);
        drop(slow_mark);
        tcp.rewind(&seen);
        Some(tcp)
    }
}

/// What the bytes read so far say about a request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// It ends (`CRLF CRLF`) with every line ended by `CRLF`.
    Complete,
    /// Not whole yet.
    Incomplete,
    /// A line before its end is ended by a bare LF.
    BareLf,
}

/// Scans a request header read so far (`seen`, of which `from..` is new)
/// up to its end, by its line feeds: each must follow a CR (RFC 9112 2.2).
///
/// A bare LF is refused at once (400) rather than waited on: no `CRLF
/// CRLF` would ever come, so the request used to hold its connection until
/// the header deadline (408). And it must not be read leniently either:
/// Pingora's parser (httparse) takes a bare LF as a line end, but a front
/// proxy or other reader that splits lines only on CRLF sees
/// `Host: x\nTransfer-Encoding: chunked` as one header, and two readers
/// that disagree on where a header ends disagree on how the body is
/// framed: request smuggling. Bytes past the header's end (the body) are
/// not looked at.
fn scan(seen: &[u8], from: usize) -> Scan {
    let mut at = from;
    // memchr: a byte-at-a-time search cost ~4 instructions a header byte.
    while let Some(i) = memchr::memchr(b'\n', &seen[at..]) {
        let lf = at + i;
        if lf == 0 || seen[lf - 1] != b'\r' {
            return Scan::BareLf;
        }
        // The LF two back was checked when it was seen.
        if lf >= 3 && seen[lf - 3] == b'\r' && seen[lf - 2] == b'\n' {
            return Scan::Complete;
        }
        at = lf + 1;
    }
    Scan::Incomplete
}

/// One admitted connection's place; given back on drop.
struct Place<'a, A> {
    app: &'a Limited<A>,
}

impl<A> Drop for Place<'_, A> {
    fn drop(&mut self) {
        self.app.total.fetch_sub(1, Ordering::Relaxed);
        self.app.metrics.connections_open.dec();
    }
}

/// A slow connection counted against its address; given back on drop.
struct SlowMark<'a, A> {
    app: &'a Limited<A>,
    ip: IpAddr,
}

impl<A> Drop for SlowMark<'_, A> {
    fn drop(&mut self) {
        if let Ok(mut map) = self.app.slow.lock() {
            if let Some(n) = map.get_mut(&self.ip) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&self.ip);
                }
            }
        }
    }
}

/// A connection's entry among those waiting for a header; removed on drop.
struct Waiting<'a, A> {
    app: &'a Limited<A>,
    id: u64,
}

impl<'a, A> Waiting<'a, A> {
    fn new(app: &'a Limited<A>, signal: Arc<Notify>) -> Self {
        let id = app.next_wait.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut w) = app.waiting.lock() {
            w.insert(id, signal);
        }
        Waiting { app, id }
    }
}

impl<A> Drop for Waiting<'_, A> {
    fn drop(&mut self) {
        if let Ok(mut w) = self.app.waiting.lock() {
            w.remove(&self.id);
        }
    }
}

/// Logs refusals at most once a second, with how many there were since.
#[derive(Default)]
struct RefusalLog {
    /// Seconds since `EPOCH` of the last line.
    last: AtomicU64,
    since: AtomicU64,
}

impl RefusalLog {
    fn note(&self, why: Refusal, ip: Option<IpAddr>) {
        let n = self.since.fetch_add(1, Ordering::Relaxed) + 1;
        let now = EPOCH.elapsed().as_secs() + 1;
        let last = self.last.load(Ordering::Relaxed);
        if now > last
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.since.fetch_sub(n, Ordering::Relaxed);
            let from = ip.map_or_else(|| "-".to_string(), |ip| ip.to_string());
            log::warn!(
                "refused {n} agent connection(s) since the last report; latest: {} from {from}",
                why.as_str()
            );
        }
    }
}

static EPOCH: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);

const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nx-loopgate-error: gateway_overloaded\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 155\r\n\r\n{\"error\":{\"code\":\"gateway_overloaded\",\"type\":\"gateway_error\",\"message\":\"too many connections from this client or in all; retry shortly\",\"retryable\":true}}\n";

const MALFORMED: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nx-loopgate-error: bad_request\r\nconnection: close\r\ncontent-length: 153\r\n\r\n{\"error\":{\"code\":\"bad_request\",\"type\":\"invalid_request_error\",\"message\":\"request header lines must end in CRLF; a bare LF is refused\",\"retryable\":false}}";

const TIMED_OUT: &[u8] = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nx-loopgate-error: request_timeout\r\nconnection: close\r\ncontent-length: 138\r\n\r\n{\"error\":{\"code\":\"request_timeout\",\"type\":\"invalid_request_error\",\"message\":\"the request header did not arrive in time\",\"retryable\":true}}";

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> ServerApp for Limited<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // The limits of the snapshot this connection was accepted under.
        let limits = self.config.load().connections.clone();
        let ip = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()));
        let Some(_place) = self.admit(limits.total(self.nofile)) else {
            self.refuse(stream, Refusal::Capacity, ip).await;
            return None;
        };
        let mut stream = self.next_header(stream, ip, true, &limits).await?;
        let mut settings: Option<HttpPersistentSettings> = None;
        // Pingora's HTTP/1 keep-alive loop, with each next header read
        // under the deadlines first.
        loop {
            let mut session = ServerSession::new_http1(stream);
            let idle = match *shutdown.borrow() {
                true => None,
                false => Some(limits.idle_timeout.as_secs().max(1)),
            };
            session.set_keepalive(idle);
            // A client may half-close after its request (RFC 9112 9.6:
            // `nc -N`, HTTP/1.0-style clients): it is still owed the
            // answer, so a FIN after the request does not abort the
            // exchange. A client that is really gone is seen when the
            // answer's write fails.
            session.set_abort_on_close(false);
            if let Some(s) = settings.take() {
                s.apply_to_session(&mut session);
            }
            let reused = self.inner.process_new_http(session, shutdown).await?;
            if *shutdown.borrow() {
                return None;
            }
            let (s, kept) = reused.consume();
            settings = kept;
            stream = self.next_header(s, ip, false, &limits).await?;
        }
    }

    async fn cleanup(&self) {
        self.inner.http_cleanup().await;
    }
}

/// The total for a process that may open `nofile` descriptors, keeping
/// `reserve` out: each agent connection needs one more upstream.
pub fn total_for(nofile: u64, reserve: usize) -> usize {
    (nofile as usize).saturating_sub(reserve).max(2) / 2
}

/// Raises the soft open-file limit to the hard one (as Go's runtime and
/// nginx's `worker_rlimit_nofile` do): the default soft limit of 1,024
/// would cap a gateway at a few hundred agent connections. Returns the
/// soft limit in force.
pub fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        // An unlimited hard limit is not a number of descriptors.
        let want = lim.rlim_max.min(1 << 20);
        if lim.rlim_cur < want {
            let raised = libc::rlimit {
                rlim_cur: want,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return want;
            }
        }
        lim.rlim_cur
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_well_formed_http() {
        for answer in [REFUSED, TIMED_OUT, MALFORMED] {
            let head = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
            let text = std::str::from_utf8(&answer[..head]).unwrap();
            let len: usize = text
                .rsplit("content-length: ")
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(answer.len() - head - 4, len, "{text}");
            let body: serde_json::Value = serde_json::from_slice(&answer[head + 4..]).unwrap();
            assert!(body["error"]["code"].is_string());
        }
    }

    #[test]
    fn a_header_ends_at_crlf_crlf_and_a_bare_lf_is_refused() {
        let whole = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(scan(whole, 0), Scan::Complete);
        // Read a byte at a time, it is whole only at its last byte.
        for n in 1..whole.len() {
            assert_eq!(scan(&whole[..n], n - 1), Scan::Incomplete, "{n}");
        }
        assert_eq!(scan(whole, whole.len() - 1), Scan::Complete);
        // The body after it is not the header's business.
        assert_eq!(scan(b"POST / HTTP/1.1\r\n\r\na\nb\n", 0), Scan::Complete);
        for bare in [
            &b"GET / HTTP/1.1\nHost: x\n\n"[..],
            b"GET / HTTP/1.1\r\nHost: x\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\n\r\n",
            b"\nGET / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\n\n",
        ] {
            assert_eq!(
                scan(bare, 0),
                Scan::BareLf,
                "{:?}",
                String::from_utf8_lossy(bare)
            );
            // However it is split across reads.
            for n in 1..bare.len() {
                let first = scan(&bare[..n], 0);
                if first != Scan::BareLf {
                    assert_eq!(first, Scan::Incomplete);
                    assert_eq!(scan(bare, n), Scan::BareLf);
                }
            }
        }
    }

    #[test]
    fn a_body_earns_a_second_per_min_rate_bytes() {
        let limits = ConnectionLimits {
            body_timeout: Duration::from_secs(20),
            body_min_rate: 1000,
            ..ConnectionLimits::default()
        };
        let start = std::time::Instant::now();
        let d = BodyDeadline::new(&limits, start);
        let base = Instant::from_std(start) + Duration::from_secs(20);
        assert_eq!(d.at(0), base);
        assert_eq!(d.at(999), base);
        assert_eq!(d.at(1000), base + Duration::from_secs(1));
        assert_eq!(d.at(8_000_000), base + Duration::from_secs(8000));
        let flat = BodyDeadline::new(
            &ConnectionLimits {
                body_min_rate: 0,
                ..limits
            },
            start,
        );
        assert_eq!(flat.at(u64::MAX), base);
        let e = d.expired();
        assert_eq!((e.status(), e.code()), (408, "request_timeout"));
        assert!(!flat.expired().message().contains("per 0 bytes"));
    }

    #[test]
    fn the_total_leaves_a_reserve_and_an_upstream_descriptor_each() {
        assert_eq!(total_for(1024, 128), 448);
        assert_eq!(total_for(100, 128), 1);
        let mut l = ConnectionLimits::default();
        assert_eq!(l.total(20_000), 9_936);
        l.max = Some(10);
        assert_eq!(l.total(20_000), 10);
    }

    #[test]
    fn trusted_ranges_match_addresses_inside_them() {
        let l = ConnectionLimits {
            trusted: vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
            ..ConnectionLimits::default()
        };
        assert!(l.trusts([10, 1, 2, 3].into()));
        assert!(l.trusts("::1".parse().unwrap()));
        assert!(!l.trusts([11, 0, 0, 1].into()));
    }
}
