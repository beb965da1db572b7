//! Fair CPU (#35 item 3), over real sockets: judging large bodies does not
//! hold up another agent's small calls. The gateway runs one thread, so a
//! body judged on it would make every other request wait out the judging.
//! Outcomes are compared as ratios measured in the same run, never against
//! a wall-clock threshold.

use loopgate_tests::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HOSTILE_KEY: &str = "hostile-key-0001";
const VICTIM_KEY: &str = "victim-key-0002";

fn config(mock: &Mock) -> String {
    format!(
        r#"
listen: 127.0.0.1:{{PORT}}
threads: 1
{providers}
models:
  gpt-4o-mini: {{ context_window: 1000000000 }}
policy:
  max_body_bytes: 8388608
  blocked_phrases: ["ignore previous instructions", "developer mode"]
agents:
  hostile:
    key_sha256: "{hostile}"
    models: [gpt-4o-mini]
  victim:
    key_sha256: "{victim}"
    models: [gpt-4o-mini]
"#,
        providers = oa_provider(mock, "gpt-4o-mini", ""),
        hostile = sha256_hex(HOSTILE_KEY.as_bytes()),
        victim = sha256_hex(VICTIM_KEY.as_bytes()),
    )
}

/// One POST of `body` as `key` on a fresh connection: the status and how
/// long the answer took.
fn post(port: u16, key: &str, body: &[u8]) -> (u16, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write head");
    s.write_all(body).expect("write body");
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("read");
    let status = std::str::from_utf8(&answer[9..12.min(answer.len())])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, started.elapsed())
}

fn median(v: &[Duration]) -> Duration {
    percentile(v, 50)
}

fn percentile(v: &[Duration], p: usize) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[(v.len() * p / 100).min(v.len() - 1)]
}

/// `n` small calls as the victim, a few milliseconds apart.
fn small_calls(port: u16, n: usize) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let (status, took) = post(port, VICTIM_KEY, CHAT.as_bytes());
            assert_eq!(status, 200);
            std::thread::sleep(Duration::from_millis(7));
            took
        })
        .collect()
}

fn summary(v: &[Duration]) -> String {
    format!(
        "p50 {:?}, p90 {:?}, max {:?}",
        percentile(v, 50),
        percentile(v, 90),
        percentile(v, 100)
    )
}

#[test]
fn a_small_call_does_not_wait_out_another_agents_large_judging() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    let port: u16 = gw
        .url("")
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    // ~6 MiB of U+FDFA, which NFKC makes 18 characters each: the costliest
    // plain text to judge per byte.
    let text = "\u{fdfa}".repeat(2 * 1024 * 1024);
    let hostile =
        format!(r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"{text}"}}]}}"#)
            .into_bytes();
    let quiet = small_calls(port, 40);
    // Alone: what one large call takes, judging included.
    let alone: Vec<Duration> = (0..3)
        .map(|_| {
            let (status, took) = post(port, HOSTILE_KEY, &hostile);
            assert_eq!(status, 200);
            took
        })
        .collect();
    let large = median(&alone);
    // Two agents' worth of large calls back to back, and the victim's small
    // calls meanwhile.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let senders: Vec<_> = (0..2)
        .map(|_| {
            let (stop, sent, body) = (stop.clone(), sent.clone(), hostile.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let (status, _) = post(port, HOSTILE_KEY, &body);
                    assert_eq!(status, 200);
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(large);
    let victim = small_calls(port, 40);
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        s.join().expect("sender");
    }
    let small_median = median(&victim);
    eprintln!(
        "one large call alone: {large:?}; the victim's small calls alone: {}; \
         while two senders' large calls are judged: {}",
        summary(&quiet),
        summary(&victim)
    );
    assert!(
        sent.load(Ordering::Relaxed) >= 4,
        "the large calls ran alongside"
    );
    // Judged on the gateway's one thread, a small call waits on average
    // half a judging (about large / 2); judged aside, it waits for none.
    assert!(
        small_median * 4 < large,
        "a small call took {small_median:?} (median) while large calls were judged; one large call alone takes {large:?}"
    );
}
