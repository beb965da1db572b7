//! Another agent's latency while a hostile agent sends the costliest
//! bodies to judge (issue #35 item 3), against the real binary and the
//! mock: a victim agent sends small chat completions at a steady pace
//! (each 10 ms after the last one's answer, on a fresh connection) and
//! its calls' p50, p90, p99 and max latency are printed (a) alone, then (b) while a hostile agent sends
//! ~8 MiB bodies back to back, with 1 and 2 senders: plain ASCII (the
//! reference), U+FDFA (NFKC makes each 18 characters), the same
//! JSON-escaped (`\ufdfa`), and 60-deep chains of nested objects with a
//! task id (the loop guard fingerprints them). Each row's ratios are
//! against (a), measured in the same run. The hostile bodies are judged
//! whole, then sent to the mock, which refuses them at once
//! (`x-mock-status: 400`, before it would parse them) so that only the
//! gateway's work is measured; their model is one the price catalog does
//! not know, so the context-window guard leaves them alone on any build.
//! `tests/fairness.rs` checks the same effect as a test.
//!
//! Run: cargo run --release -p loopgate-benches --bin latency [seconds]
//! (each phase's length, default 5: nine phases, about a minute). The
//! gateway runs `THREADS` threads (default 1: a body judged on the
//! runtime's one thread holds up every other call); `LOOPGATE=path` runs
//! another build of the gateway (the mock stays this build's).

use loopgate_benches::bodies;
use loopgate_tests::{percentile, sha256_hex, Gateway, Mock, CHAT};
use std::time::{Duration, Instant};

const HOSTILE_KEY: &str = "bench-hostile-key";
const VICTIM_KEY: &str = "bench-victim-key";
/// The victim's pause between an answer and its next call.
const EVERY: Duration = Duration::from_millis(10);

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5.0);
    let phase = Duration::from_secs_f64(secs);
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let mock = Mock::start();
    let yaml = config(&mock, threads);
    let gw = match std::env::var_os("LOOPGATE") {
        Some(bin) => Gateway::start_bin(std::path::Path::new(&bin), &yaml, &[]),
        None => Gateway::start(&yaml),
    };
    let hostile: Vec<(&str, Vec<u8>, bool)> = bodies::table((8 << 20) - 4096)
        .into_iter()
        .filter(|b| {
            [
                "plain ASCII",
                "U+FDFA",
                "U+FDFA JSON-escaped",
                "60-deep chains, task id",
            ]
            .contains(&b.name)
        })
        .map(|b| (b.name, unknown_model(b.bytes), b.task))
        .collect();
    victim(&gw, Duration::from_secs(1)); // warm-up
    println!(
        "gateway threads: {threads}; the victim's small calls {EVERY:?} after each answer, {secs} s a phase"
    );
    println!(
        "{:<26} {:>7} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9}   vs alone (p50 p90 p99 max)",
        "hostile body", "senders", "judged", "calls", "p50", "p90", "p99", "max",
    );
    let alone = victim(&gw, phase);
    let base = summary(&alone);
    row("(a) alone", 0, 0, &alone, &base);
    for (name, body, task) in &hostile {
        for senders in [1, 2] {
            let extra: &[&str] = match task {
                true => &["x-agent-task-id: bench-task", "x-mock-status: 400"],
                false => &["x-mock-status: 400"],
            };
            let path = "/v1/chat/completions";
            let (lat, statuses) =
                gw.while_posting(senders, (path, HOSTILE_KEY, extra), body, || {
                    victim(&gw, phase)
                });
            let judged = statuses.iter().filter(|&&s| s == 400).count();
            if judged != statuses.len() {
                eprintln!("{name}: hostile statuses other than the mock's 400: {statuses:?}");
            }
            row(name, senders, judged, &lat, &base);
        }
    }
}

/// The victim's small calls for `how_long`, each sent [`EVERY`] after the
/// last one's answer (as an agent does between steps): each one's
/// latency. Paced from the answers, never catching up: calls sent in a
/// burst after a stall would be fast and hide it (and calls due during
/// it would never be counted), while a victim that cannot catch up would
/// measure its own backlog, not the gateway.
fn victim(gw: &Gateway, how_long: Duration) -> Vec<Duration> {
    let start = Instant::now();
    let mut took = Vec::new();
    while start.elapsed() < how_long {
        let (status, t) = gw.timed_post("/v1/chat/completions", VICTIM_KEY, &[], CHAT.as_bytes());
        if status != 200 {
            eprintln!("a victim call got {status}");
        }
        took.push(t);
        std::thread::sleep(EVERY);
    }
    took
}

/// p50, p90, p99, max.
fn summary(v: &[Duration]) -> [Duration; 4] {
    [50, 90, 99, 100].map(|p| percentile(v, p))
}

/// One line: the hostile body, its senders, how many of its calls were
/// judged, the victim's calls and their percentiles, and those against
/// `base`.
fn row(name: &str, senders: usize, judged: usize, calls: &[Duration], base: &[Duration; 4]) {
    let s = &summary(calls);
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    let ratios: Vec<String> = s
        .iter()
        .zip(base)
        .map(|(a, b)| format!("{:.1}x", a.as_secs_f64() / b.as_secs_f64().max(1e-9)))
        .collect();
    println!(
        "{:<26} {:>7} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9}   {}",
        name,
        senders,
        judged,
        calls.len(),
        ms(s[0]),
        ms(s[1]),
        ms(s[2]),
        ms(s[3]),
        ratios.join(" ")
    );
}

/// The body with its model renamed to one the price catalog does not
/// know (same length: `gpt-4o-mini` and `bench-model`).
fn unknown_model(mut body: Vec<u8>) -> Vec<u8> {
    let (from, to) = (b"\"gpt-4o-mini\"", b"\"bench-model\"");
    if let Some(at) = body.windows(from.len()).position(|w| w == from) {
        body[at..at + to.len()].copy_from_slice(to);
    }
    body
}

/// The victim's calls go to `gpt-4o-mini`, the hostile ones to
/// `bench-model`, both served by the mock; 100 blocked phrases; the
/// hostile agent's loop guard keeps every call of its task without
/// tripping (so every body is judged and fingerprinted).
fn config(mock: &Mock, threads: usize) -> String {
    let phrases: Vec<String> = (1..=100)
        .map(|i| format!("\"blocked phrase number {i}\""))
        .collect();
    format!(
        r#"
listen: 127.0.0.1:{{PORT}}
threads: {threads}
access_log: {{ path: "off" }}
providers:
  mock: {{ kind: openai_compatible, base_url: "{mock}", api_key_env: LOOPGATE_TEST_UPSTREAM_KEY, timeouts: {{ connect_ms: 5000, read_ms: 60000 }} }}
routes:
  - models: [gpt-4o-mini, bench-model]
    targets: [ {{ provider: mock }} ]
policy:
  max_body_bytes: 9000000
  blocked_phrases: [{phrases}]
agents:
  hostile:
    key_sha256: "{hostile}"
    models: [bench-model]
    loop_guard: {{ window: 1000, repeats: 1000 }}
  victim:
    key_sha256: "{victim}"
    models: [gpt-4o-mini]
"#,
        mock = mock.url(),
        phrases = phrases.join(", "),
        hostile = sha256_hex(HOSTILE_KEY.as_bytes()),
        victim = sha256_hex(VICTIM_KEY.as_bytes()),
    )
}
