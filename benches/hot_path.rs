//! Criterion: the hot-path pieces besides policy evaluation (see
//! `policy.rs`): request fingerprinting, a breaker check and record, usage
//! scanning (SSE per chunk, a whole JSON response), and admitting through
//! the memory store: a typical admission, and a refusal by a daily token
//! budget that a busy day has filled (its cost and the store's memory must
//! not grow with the day's requests).
//!
//! Run: cargo bench -p loopgate-benches --bench hot_path

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use loopgate_benches::report_allocations;
use loopgate_breaker::{fingerprint, BreakerConfig, BreakerSet, LoopConfig, Outcome};
use loopgate_policy::{MemoryStore, SlotTake, StateStore, UsageScanner, WindowTake};
use std::time::Duration;

#[global_allocator]
static ALLOC: loopgate_benches::CountingAlloc = loopgate_benches::CountingAlloc;

fn bench(c: &mut Criterion) {
    let body: serde_json::Value = serde_json::json!({
        "model": "gpt-4o-mini", "user": "u-1", "stream": true,
        "messages": [
            {"role": "system", "content": "You are a careful billing assistant."},
            {"role": "user", "content": "Find the order status for customer 4411."},
            {"role": "assistant", "tool_calls": [{"id": "call_1", "function": {"name": "get_order", "arguments": "{\"id\":\"4411\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"status\":\"shipped\"}"}
        ],
        "tools": [{"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}}}]
    });
    let cfg = LoopConfig::default();
    report_allocations("fingerprint_request", 1000, || {
        black_box(fingerprint("/v1/chat/completions", black_box(&body), &cfg));
    });
    c.bench_function("fingerprint_request", |b| {
        b.iter(|| fingerprint("/v1/chat/completions", black_box(&body), &cfg))
    });

    let set = BreakerSet::new();
    let bcfg = BreakerConfig::default();
    let mut now = Duration::from_secs(1);
    let mut acquire_and_record = || {
        now += Duration::from_micros(10);
        let (t, _) = set.acquire("openai", &bcfg, now).unwrap();
        set.record(
            "openai",
            t.unwrap(),
            Outcome::Success,
            Some(Duration::from_millis(5)),
            now,
        )
        .unwrap()
    };
    report_allocations("breaker_acquire_and_record", 1000, || {
        black_box(acquire_and_record());
    });
    c.bench_function("breaker_acquire_and_record", |b| {
        b.iter(&mut acquire_and_record)
    });

    let chunk = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"finish_reason\":null}]}\n\n";
    let mut scanner = UsageScanner::for_content_type(Some("text/event-stream"));
    report_allocations("sse_usage_scan/per_chunk", 1000, || {
        scanner.feed(black_box(chunk.as_bytes()))
    });
    let mut g = c.benchmark_group("sse_usage_scan");
    g.throughput(Throughput::Bytes(chunk.len() as u64));
    g.bench_function("per_chunk", |b| {
        let mut s = UsageScanner::for_content_type(Some("text/event-stream"));
        b.iter(|| s.feed(black_box(chunk.as_bytes())))
    });
    g.finish();

    // A whole non-streaming response, as the mock provider answers.
    let response = br#"{"id":"chatcmpl-loopgate-mock","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"mock reply: Summarise the last three support tickets for customer 4411. The first ticket was about a late delivery; the second about a refund; the third about a login problem."},"finish_reason":"stop"}],"usage":{"prompt_tokens":31,"completion_tokens":42,"total_tokens":73}}"#;
    let mut scan_response = || {
        let mut s = UsageScanner::for_content_type(Some("application/json"));
        s.feed(black_box(response));
        s.finish()
    };
    report_allocations("json_usage_scan/response", 1000, || {
        black_box(scan_response());
    });
    let mut g = c.benchmark_group("json_usage_scan");
    g.throughput(Throughput::Bytes(response.len() as u64));
    g.bench_function("response", |b| b.iter(&mut scan_response));
    g.finish();

    let store = MemoryStore::new();
    // The memory store never waits, so a current-thread runtime adds little.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let windows = vec![
        WindowTake {
            key: "a:rpm".into(),
            limit: u64::MAX,
            window: Duration::from_secs(60),
            cost: 1,
            enforce: true,
        },
        WindowTake {
            key: "a:tpm".into(),
            limit: u64::MAX,
            window: Duration::from_secs(60),
            cost: 300,
            enforce: true,
        },
    ];
    let slots = vec![SlotTake {
        key: "a:inflight".into(),
        limit: u64::MAX,
        enforce: true,
    }];
    let mut t = Duration::from_secs(1);
    let mut admit_and_finish = || {
        t += Duration::from_millis(1);
        rt.block_on(async {
            let out = store.admit(t, &windows, &slots).await.unwrap();
            if let loopgate_policy::AdmitOutcome::Taken { lease, .. } = out {
                store.finish(t, &lease, &[]).await.unwrap();
            }
        })
    };
    report_allocations("store_admit_and_finish", 1000, &mut admit_and_finish);
    c.bench_function("store_admit_and_finish", |b| b.iter(&mut admit_and_finish));

    // A daily budget after a busy day: 200,000 small admissions (one every
    // 400 ms, about 22 hours) filled it. A request reserving 10,000 more is
    // refused, and the refusal must say when that much has aged out.
    const DAY_ADMISSIONS: u64 = 200_000;
    let day = [WindowTake {
        key: "a:budget:day".into(),
        limit: DAY_ADMISSIONS,
        window: Duration::from_secs(86_400),
        cost: 1,
        enforce: true,
    }];
    let busy = MemoryStore::new();
    let before = loopgate_benches::resident_bytes();
    let mut t = Duration::from_secs(1);
    rt.block_on(async {
        for _ in 0..DAY_ADMISSIONS {
            t += Duration::from_millis(400);
            if let loopgate_policy::AdmitOutcome::Taken { lease, .. } =
                busy.admit(t, &day, &[]).await.unwrap()
            {
                busy.finish(t, &lease, &[]).await.unwrap();
            }
        }
    });
    println!(
        "memory store after {DAY_ADMISSIONS} admissions into one daily budget: {:.1} MB more resident",
        loopgate_benches::resident_bytes().saturating_sub(before) as f64 / 1e6
    );
    let big = [WindowTake {
        cost: 10_000,
        ..day[0].clone()
    }];
    let mut refused = || {
        rt.block_on(async {
            let out = busy.admit(t, &big, &[]).await.unwrap();
            assert!(matches!(out, loopgate_policy::AdmitOutcome::Refused(_)));
        })
    };
    c.bench_function("store_refused_by_a_full_daily_budget", |b| {
        b.iter(&mut refused)
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
