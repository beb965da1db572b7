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
        let Ok(mut line) = serde_json::to_vec(record) else {
            return;
        };
        line.push(b'\n');
        match pending.lock() {
            Ok(mut buf) if buf.len() + line.len() <= MAX_PENDING => buf.extend_from_slice(&line),
            _ => self.metrics.access_log_dropped.inc(),
        }
    }
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
    pub time: String,
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

/// `2026-12-02T16:06:11.123Z`
pub fn rfc3339_millis(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = d.as_secs();
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
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        d.subsec_millis()
    )
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
