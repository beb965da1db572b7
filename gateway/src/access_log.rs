//! The access log: one JSON line per request, written by a dedicated thread.
//!
//! Proxy threads only format the line and append it to a shared buffer (a
//! short, uncontended lock; no syscall, no thread wake-up per line). The
//! writer thread swaps the buffer out every few milliseconds and writes it
//! in one go. If the writer falls behind (a slow disk, a blocked stdout),
//! lines past the buffer bound are dropped and counted
//! (`loopgate_access_log_dropped_total`) rather than ever making a request
//! wait. (A channel per line cost a futex wake per request: measured at
//! about 15% of the proxy's CPU in `benches/compare`.) Lines carry no key material and no prompt
//! text: identifiers, names, sizes, timings and decisions only.

use crate::metrics::Metrics;
use serde::Serialize;
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Bytes buffered between proxy threads and the writer.
const MAX_PENDING: usize = 8 * 1024 * 1024;
/// How often the writer flushes.
const FLUSH_EVERY: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Stdout,
    Stderr,
    File(String),
    Off,
}

pub struct AccessLog {
    pending: Option<Arc<Mutex<Vec<u8>>>>,
    metrics: Arc<Metrics>,
    /// For a file: set to ask the writer to reopen it (after logrotate
    /// moved it away), on SIGUSR1 or `POST /admin/access-log/reopen`.
    reopen: Option<Arc<AtomicBool>>,
}

impl AccessLog {
    /// Starts the writer thread for `target`.
    pub fn start(target: &Target, metrics: Arc<Metrics>) -> std::io::Result<AccessLog> {
        let out: Box<dyn Write + Send> = match target {
            Target::Off => {
                return Ok(AccessLog {
                    pending: None,
                    metrics,
                    reopen: None,
                })
            }
            Target::Stdout => Box::new(std::io::stdout()),
            Target::Stderr => Box::new(std::io::stderr()),
            Target::File(path) => Box::new(open_file(path)?),
        };
        let reopen = match target {
            Target::File(path) => Some((path.clone(), Arc::new(AtomicBool::new(false)))),
            _ => None,
        };
        let pending = Arc::new(Mutex::new(Vec::with_capacity(64 * 1024)));
        let shared = pending.clone();
        let flag = reopen.as_ref().map(|(_, f)| f.clone());
        std::thread::Builder::new()
            .name("loopgate-access-log".into())
            .spawn(move || write_lines(shared, out, reopen))?;
        Ok(AccessLog {
            pending: Some(pending),
            metrics,
            reopen: flag,
        })
    }

    /// Asks the writer to reopen the log file by its path at its next
    /// flush (within 20 ms): lines written before go to the file as it was
    /// (moved away or not), none is lost. `false` when the log is no file.
    pub fn reopen(&self) -> bool {
        match &self.reopen {
            Some(flag) => {
                flag.store(true, Ordering::Release);
                true
            }
            None => false,
        }
    }

    pub fn enabled(&self) -> bool {
        self.pending.is_some()
    }

    /// Queues one record; never blocks on I/O.
    pub fn write(&self, record: &Record<'_>) {
        let Some(pending) = &self.pending else { return };
        // Serialised into a buffer this thread reuses, so a line costs no
        // allocation; the shared lock is held only for the copy.
        LINE.with_borrow_mut(|line| {
            line.clear();
            record.write_json(line);
            line.push(b'\n');
            match pending.lock() {
                Ok(mut buf) if buf.len() + line.len() <= MAX_PENDING => buf.extend_from_slice(line),
                _ => self.metrics.access_log_dropped.inc(),
            }
            // A huge line (long ids are clipped, so rare) is not kept around.
            if line.capacity() > 64 * 1024 {
                *line = Vec::with_capacity(1024);
            }
        });
    }
}

thread_local! {
    static LINE: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(1024));
}

fn open_file(path: &str) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

fn write_lines(
    pending: Arc<Mutex<Vec<u8>>>,
    out: Box<dyn Write + Send>,
    reopen: Option<(String, Arc<AtomicBool>)>,
) {
    let mut out = BufWriter::with_capacity(256 * 1024, out);
    let mut batch = Vec::with_capacity(64 * 1024);
    loop {
        std::thread::sleep(FLUSH_EVERY);
        match pending.lock() {
            Ok(mut buf) => std::mem::swap(&mut *buf, &mut batch),
            Err(_) => return,
        }
        if !batch.is_empty() {
            let _ = out.write_all(&batch);
            let _ = out.flush();
            batch.clear();
        }
        // After the lines already taken went to the old file.
        if let Some((path, flag)) = &reopen {
            if flag.swap(false, Ordering::AcqRel) {
                match open_file(path) {
                    Ok(f) => out = BufWriter::with_capacity(256 * 1024, Box::new(f)),
                    // Keep writing where we were rather than lose lines.
                    Err(e) => log::warn!(
                        "access log {path:?}: cannot reopen ({e}); still writing to the old file"
                    ),
                }
            }
        }
    }
}

/// One access-log line. Strings are bounded by the caller.
#[derive(Debug, Serialize, Default)]
pub struct Record<'a> {
    pub time: Timestamp,
    pub request_id: &'a str,
    pub agent_id: Option<&'a str>,
    pub task_id: Option<&'a str>,
    pub call_id: Option<&'a str>,
    pub tool_name: Option<&'a str>,
    pub method: &'a str,
    pub path: &'a str,
    pub model: Option<&'a str>,
    pub stream: bool,
    pub provider: Option<&'a str>,
    pub breaker_state: Option<&'static str>,
    /// `allow`, `deny` or `error`.
    pub decision: &'static str,
    pub code: Option<&'static str>,
    pub would_deny: Option<&'static str>,
    pub upstream_status: Option<u16>,
    pub status: u16,
    pub latency_ms: f64,
    pub ttfb_ms: Option<f64>,
    pub overhead_us: u64,
    pub bytes_in: usize,
    pub bytes_out: usize,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// What the answer cost in US dollars, from the reported usage and the
    /// model's price; absent when either is unknown.
    pub cost_usd: Option<f64>,
    pub attempts: u32,
    /// Answered from an idempotency record; nothing was forwarded.
    pub idempotent_replay: bool,
    pub fallback_used: bool,
    pub fallback_from: Option<&'a str>,
    pub fallback_to: Option<&'a str>,
    /// The API family that answered, when it was not the agent's: the
    /// answer was translated (`openai`, `anthropic`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub translated_from: Option<&'a str>,
    /// MCP requests: server, JSON-RPC method, tool and the SHA-256 of the
    /// canonical arguments (never the arguments themselves).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp_server: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp_method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp_tool: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp_args_sha256: Option<&'a str>,
}

/// `,"name":`, the separator and key written before a field's value.
macro_rules! k {
    ($name:literal) => {
        concat!(",\"", $name, "\":")
    };
}

impl Record<'_> {
    /// Appends the record as one JSON object: the same bytes as serde's
    /// derived `Serialize` (a test holds them equal), written field by field
    /// with the keys as constants. A typical line: ~250 ns, against ~550 for
    /// the derived serializer, which escapes and frames each of the 35 keys
    /// every time.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let mut o = JsonObject::new(out);
        // The first key has no comma before it.
        o.str(&k!("time")[1..], self.time.as_str());
        o.str(k!("request_id"), self.request_id);
        o.opt_str(k!("agent_id"), self.agent_id);
        o.opt_str(k!("task_id"), self.task_id);
        o.opt_str(k!("call_id"), self.call_id);
        o.opt_str(k!("tool_name"), self.tool_name);
        o.str(k!("method"), self.method);
        o.str(k!("path"), self.path);
        o.opt_str(k!("model"), self.model);
        o.bool(k!("stream"), self.stream);
        o.opt_str(k!("provider"), self.provider);
        o.opt_str(k!("breaker_state"), self.breaker_state);
        o.str(k!("decision"), self.decision);
        o.opt_str(k!("code"), self.code);
        o.opt_str(k!("would_deny"), self.would_deny);
        o.opt_num(k!("upstream_status"), self.upstream_status);
        o.num(k!("status"), self.status);
        o.num(k!("latency_ms"), self.latency_ms);
        o.opt_num(k!("ttfb_ms"), self.ttfb_ms);
        o.num(k!("overhead_us"), self.overhead_us);
        o.num(k!("bytes_in"), self.bytes_in);
        o.num(k!("bytes_out"), self.bytes_out);
        o.opt_num(k!("prompt_tokens"), self.prompt_tokens);
        o.opt_num(k!("completion_tokens"), self.completion_tokens);
        o.opt_num(k!("cost_usd"), self.cost_usd);
        o.num(k!("attempts"), self.attempts);
        o.bool(k!("idempotent_replay"), self.idempotent_replay);
        o.bool(k!("fallback_used"), self.fallback_used);
        o.opt_str(k!("fallback_from"), self.fallback_from);
        o.opt_str(k!("fallback_to"), self.fallback_to);
        // Left out when absent, as `skip_serializing_if` does.
        for (key, v) in [
            (k!("translated_from"), self.translated_from),
            (k!("mcp_server"), self.mcp_server),
            (k!("mcp_method"), self.mcp_method),
            (k!("mcp_tool"), self.mcp_tool),
            (k!("mcp_args_sha256"), self.mcp_args_sha256),
        ] {
            if let Some(v) = v {
                o.str(key, v);
            }
        }
        o.end();
    }
}

/// A JSON object written straight into a buffer. Keys come whole from
/// [`k!`] (`,"name":`, constants that need no escaping, one copy each);
/// values go through serde_json, so they are escaped and formatted exactly
/// as the derived `Serialize` would.
struct JsonObject<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> JsonObject<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        JsonObject { out }
    }

    fn key(&mut self, key: &str) {
        self.out.extend_from_slice(key.as_bytes());
    }

    fn str(&mut self, key: &str, v: &str) {
        // Ids, names and paths almost never need escaping: copied whole
        // when no byte does (serde_json escapes only `"`, `\\` and controls
        // below 0x20, and writes everything else, UTF-8 included, as is).
        if v.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
            self.key(key);
            self.out.reserve(v.len() + 2);
            self.out.push(b'"');
            self.out.extend_from_slice(v.as_bytes());
            self.out.push(b'"');
        } else {
            self.value(key, v);
        }
    }

    fn opt_str(&mut self, key: &str, v: Option<&str>) {
        match v {
            Some(v) => self.str(key, v),
            None => self.null(key),
        }
    }

    fn bool(&mut self, key: &str, v: bool) {
        self.key(key);
        self.out
            .extend_from_slice(if v { b"true" as &[u8] } else { b"false" });
    }

    fn num<N: Serialize>(&mut self, key: &str, v: N) {
        self.value(key, v);
    }

    /// One value through serde_json's serializer (its string escaping,
    /// itoa, ryu and `null` for a non-finite float), straight into the
    /// buffer: no allocation, no tree. Writing to a `Vec` cannot fail; a
    /// value serde refused would still leave valid JSON (`null`).
    fn value<V: Serialize>(&mut self, key: &str, v: V) {
        self.key(key);
        if serde_json::to_writer(&mut *self.out, &v).is_err() {
            self.out.extend_from_slice(b"null");
        }
    }

    fn opt_num<N: Serialize>(&mut self, key: &str, v: Option<N>) {
        match v {
            Some(v) => self.num(key, v),
            None => self.null(key),
        }
    }

    fn null(&mut self, key: &str) {
        self.key(key);
        self.out.extend_from_slice(b"null");
    }

    fn end(self) {
        self.out.push(b'}');
    }
}

/// A UTC time as `2026-12-02T16:06:11.123Z`, formatted without allocating.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Timestamp([u8; 24]);

const EPOCH: &[u8; 24] = b"1970-01-01T00:00:00.000Z";

impl Timestamp {
    pub fn as_str(&self) -> &str {
        // Only ASCII digits and separators are ever written.
        std::str::from_utf8(&self.0).unwrap_or("1970-01-01T00:00:00.000Z")
    }
}

impl Default for Timestamp {
    fn default() -> Self {
        Timestamp(*EPOCH)
    }
}

impl std::fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

thread_local! {
    /// The last second formatted on this thread: the date and time of day
    /// change once a second, the milliseconds on every line.
    static LAST_SECOND: std::cell::Cell<(u64, Timestamp)> =
        const { std::cell::Cell::new((u64::MAX, Timestamp(*EPOCH))) };
}

/// `t` as an RFC 3339 UTC timestamp with milliseconds.
pub fn timestamp(t: SystemTime) -> Timestamp {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = d.as_secs();
    let (cached_secs, mut ts) = LAST_SECOND.get();
    if cached_secs != secs {
        ts = format_second(secs);
        LAST_SECOND.set((secs, ts));
    }
    let ms = d.subsec_millis();
    ts.0[20] = b'0' + (ms / 100) as u8;
    ts.0[21] = b'0' + (ms / 10 % 10) as u8;
    ts.0[22] = b'0' + (ms % 10) as u8;
    ts
}

/// The whole-second part of a timestamp (milliseconds left at `000`).
fn format_second(secs: u64) -> Timestamp {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = (yoe + era * 400 + i64::from(month <= 2)).clamp(0, 9999) as u64;
    let mut out = *EPOCH;
    let mut put = |at: usize, width: usize, mut v: u64| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, month as u64);
    put(8, 2, day as u64);
    put(11, 2, rem / 3600);
    put(14, 2, rem % 3600 / 60);
    put(17, 2, rem % 60);
    Timestamp(out)
}

/// `2026-12-02T16:06:11.123Z`
pub fn rfc3339_millis(t: SystemTime) -> String {
    timestamp(t).as_str().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_timestamps() {
        let t = UNIX_EPOCH + Duration::from_millis(1_796_227_571_123);
        assert_eq!(rfc3339_millis(t), "2026-12-02T16:06:11.123Z");
        assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339_millis(leap), "2000-02-29T00:00:00.000Z");
        // The cached second is reused only within that second.
        let a = UNIX_EPOCH + Duration::from_millis(1_796_227_571_007);
        let b = UNIX_EPOCH + Duration::from_millis(1_796_227_571_999);
        let c = UNIX_EPOCH + Duration::from_millis(1_796_227_572_000);
        assert_eq!(timestamp(a).as_str(), "2026-12-02T16:06:11.007Z");
        assert_eq!(timestamp(b).as_str(), "2026-12-02T16:06:11.999Z");
        assert_eq!(timestamp(c).as_str(), "2026-12-02T16:06:12.000Z");
        assert_eq!(timestamp(a).as_str(), "2026-12-02T16:06:11.007Z");
        let line = serde_json::to_string(&Record {
            time: timestamp(c),
            ..Record::default()
        })
        .unwrap();
        assert!(
            line.starts_with(r#"{"time":"2026-12-02T16:06:12.000Z","#),
            "{line}"
        );
    }

    proptest::proptest! {
        /// The hand-written line is byte for byte what serde writes.
        #[test]
        fn hand_written_lines_equal_serdes(
            s in proptest::collection::vec("\\PC*|[\"\\\\\u{0}-\u{1f}\u{7f}é€😀a-z]{0,12}", 8),
            opt in proptest::collection::vec(proptest::bool::ANY, 12),
            n in proptest::collection::vec(proptest::num::u64::ANY, 6),
            f in proptest::num::f64::ANY,
            flags in proptest::collection::vec(proptest::bool::ANY, 3),
        ) {
            let some = |i: usize, v: &str| opt[i].then(|| v.to_string());
            let (a, b, c, d) = (some(0, &s[2]), some(1, &s[3]), some(2, &s[4]), some(3, &s[5]));
            let (mcp1, mcp2) = (some(4, &s[6]), some(5, &s[7]));
            let r = Record {
                time: timestamp(UNIX_EPOCH + Duration::from_millis(n[0] % 4_000_000_000_000)),
                request_id: &s[0],
                agent_id: a.as_deref(),
                task_id: b.as_deref(),
                call_id: c.as_deref(),
                tool_name: d.as_deref(),
                method: &s[1],
                path: &s[2],
                model: opt[6].then_some(s[3].as_str()),
                stream: flags[0],
                provider: opt[7].then_some(s[4].as_str()),
                breaker_state: opt[8].then_some("half_open"),
                decision: "allow",
                code: opt[9].then_some("rate_limited"),
                would_deny: None,
                upstream_status: opt[10].then_some(n[1] as u16),
                status: n[2] as u16,
                latency_ms: f,
                ttfb_ms: opt[11].then_some(f / 3.0),
                overhead_us: n[3],
                bytes_in: n[4] as usize,
                bytes_out: n[5] as usize,
                prompt_tokens: opt[0].then_some(n[1]),
                completion_tokens: opt[1].then_some(n[2]),
                cost_usd: opt[4].then_some(f / 7.0),
                attempts: n[3] as u32,
                idempotent_replay: flags[1],
                fallback_used: flags[2],
                fallback_from: opt[2].then_some(s[6].as_str()),
                fallback_to: opt[3].then_some(s[7].as_str()),
                translated_from: opt[5].then_some("openai"),
                mcp_server: mcp1.as_deref(),
                mcp_method: mcp2.as_deref(),
                mcp_tool: opt[6].then_some(s[0].as_str()),
                mcp_args_sha256: opt[7].then_some(s[1].as_str()),
            };
            let mut mine = Vec::new();
            r.write_json(&mut mine);
            let serde = serde_json::to_vec(&r).unwrap();
            proptest::prop_assert_eq!(String::from_utf8_lossy(&mine), String::from_utf8_lossy(&serde));
        }
    }

    #[test]
    fn a_full_buffer_drops_and_counts_instead_of_blocking() {
        let metrics = Arc::new(Metrics::new());
        let pending = Arc::new(Mutex::new(vec![b'x'; MAX_PENDING - 10]));
        let log = AccessLog {
            pending: Some(pending.clone()),
            metrics: metrics.clone(),
            reopen: None,
        };
        let r = Record::default();
        log.write(&r);
        log.write(&r);
        assert_eq!(metrics.access_log_dropped.get(), 2);
        pending.lock().unwrap().clear();
        log.write(&r);
        assert_eq!(metrics.access_log_dropped.get(), 2);
        assert!(pending.lock().unwrap().ends_with(b"}\n"));
    }
}
