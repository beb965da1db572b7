//! Fair CPU (#35 item 3), over real sockets: judging large bodies does not
//! hold up another agent's small calls. The gateway runs one thread, so a
//! body judged on it would make every other request wait out the judging.
//! Outcomes are compared as ratios measured in the same run, never against
//! a wall-clock threshold.

use loopgate_tests::*;
use std::time::Duration;

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

/// A chat completion POST as `key`: its status and how long it took.
fn post(gw: &Gateway, key: &str, body: &[u8]) -> (u16, Duration) {
    gw.timed_post("/v1/chat/completions", key, &[], body)
}

fn median(v: &[Duration]) -> Duration {
    percentile(v, 50)
}

/// `n` small calls as the victim, a few milliseconds apart.
fn small_calls(gw: &Gateway, n: usize) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let (status, took) = post(gw, VICTIM_KEY, CHAT.as_bytes());
            assert_eq!(status, 200);
            std::thread::sleep(Duration::from_millis(7));
            took
        })
        .collect()
}

#[test]
fn a_small_call_does_not_wait_out_another_agents_large_judging() {
    let mock = Mock::start();
    let gw = Gateway::start(&config(&mock));
    // ~6 MiB of U+FDFA, which NFKC makes 18 characters each: the costliest
    // plain text to judge per byte.
    let text = "\u{fdfa}".repeat(2 * 1024 * 1024);
    let hostile =
        format!(r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"{text}"}}]}}"#)
            .into_bytes();
    let quiet = small_calls(&gw, 40);
    // Alone: what one large call takes, judging included.
    let alone: Vec<Duration> = (0..3)
        .map(|_| {
            let (status, took) = post(&gw, HOSTILE_KEY, &hostile);
            assert_eq!(status, 200);
            took
        })
        .collect();
    let large = median(&alone);
    // Two agents' worth of large calls back to back, and the victim's small
    // calls meanwhile (after one large call's time, so judging is under way).
    let path = "/v1/chat/completions";
    let (victim, statuses) = gw.while_posting(2, (path, HOSTILE_KEY, &[]), &hostile, || {
        std::thread::sleep(large);
        small_calls(&gw, 40)
    });
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    let small_median = median(&victim);
    eprintln!(
        "one large call alone: {large:?}; the victim's small calls alone: {}; \
         while two senders' large calls are judged: {}",
        latency_summary(&quiet),
        latency_summary(&victim)
    );
    assert!(statuses.len() >= 4, "the large calls ran alongside");
    // Judged on the gateway's one thread, a small call waits on average
    // half a judging (about large / 2); judged aside, it waits for none.
    assert!(
        small_median * 4 < large,
        "a small call took {small_median:?} (median) while large calls were judged; one large call alone takes {large:?}"
    );
}
