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
}

impl AccessLog {
    /// Starts the writer thread for `target`.
    pub fn start(target: &Target, metrics: Arc<Metrics>) -> std::io::Result<AccessLog> {
        let out: Box<dyn Write + Send> = match target {
            Target::Off => {
                return Ok(AccessLog {
                    pending: None,
                    metrics,
                })
            }
            Target::Stdout => Box::new(std::io::stdout()),
            Target::Stderr => Box::new(std::io::stderr()),
            Target::File(path) => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
        };
        let pending = Arc::new(Mutex::new(Vec::with_capacity(64 * 1024)));
        let shared = pending.clone();
        std::thread::Builder::new()
            .name("loopgate-access-log".into())
            .spawn(move || write_lines(shared, out))?;
        Ok(AccessLog {
            pending: Some(pending),
            metrics,
        })
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
            if serde_json::to_writer(&mut *line, record).is_err() {
                return;
            }
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

fn write_lines(pending: Arc<Mutex<Vec<u8>>>, out: Box<dyn Write + Send>) {
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
    pub attempts: u32,
    /// Answered from an idempotency record; nothing was forwarded.
    pub idempotent_replay: bool,
    pub fallback_used: bool,
    pub fallback_from: Option<&'a str>,
    pub fallback_to: Option<&'a str>,
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

    #[test]
    fn a_full_buffer_drops_and_counts_instead_of_blocking() {
        let metrics = Arc::new(Metrics::new());
        let pending = Arc::new(Mutex::new(vec![b'x'; MAX_PENDING - 10]));
        let log = AccessLog {
            pending: Some(pending.clone()),
            metrics: metrics.clone(),
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
