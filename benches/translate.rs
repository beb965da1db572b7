//! Criterion: provider-family translation (issue 24), what a translated
//! call costs the gateway on top of a pass-through one: a 20-chunk stream
//! each way (per stream, fed as the upstream sends it, one read per
//! event) and a 100 KB request each way (parse strictly, translate,
//! serialize), with allocations per call.
//!
//! Run: cargo bench -p loopgate-benches --bench translate

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use loopgate_benches::report_allocations;
use loopgate_translate::request::{self, Options};
use loopgate_translate::stream::{StreamOptions, StreamTranslator};
use loopgate_translate::Family;
use serde_json::json;

#[global_allocator]
static ALLOC: loopgate_benches::CountingAlloc = loopgate_benches::CountingAlloc;

/// An OpenAI stream of 20 chunks: role, 17 text deltas, finish, usage.
fn openai_stream() -> Vec<Vec<u8>> {
    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000,
                   "model": "gpt-4o-mini", "choices": [{"index": 0, "delta": delta, "logprobs": null,
                   "finish_reason": finish}], "usage": null})
        )
        .into_bytes()
    };
    let mut out = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        json!(null),
    )];
    for i in 0..17 {
        out.push(chunk(json!({"content": format!(" token{i}")}), json!(null)));
    }
    out.push(chunk(json!({}), json!("stop")));
    out.push(
        format!(
            "data: {}\n\ndata: [DONE]\n\n",
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000,
                   "model": "gpt-4o-mini", "choices": [],
                   "usage": {"prompt_tokens": 20, "completion_tokens": 17, "total_tokens": 37}})
        )
        .into_bytes(),
    );
    out
}

/// An Anthropic stream of 20 events: start, block start, 15 text deltas,
/// block stop, message delta, stop.
fn anthropic_stream() -> Vec<Vec<u8>> {
    let ev =
        |name: &str, v: serde_json::Value| format!("event: {name}\ndata: {v}\n\n").into_bytes();
    let mut out = vec![
        ev(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "model": "claude-sonnet-4-5", "content": [], "stop_reason": null,
            "stop_sequence": null, "usage": {"input_tokens": 20, "output_tokens": 1}}}),
        ),
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
        ),
    ];
    for i in 0..15 {
        out.push(ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": format!(" token{i}")}}),
        ));
    }
    out.push(ev(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    out.push(ev("message_delta", json!({"type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 15}})));
    out.push(ev("message_stop", json!({"type": "message_stop"})));
    out
}

/// A ~100 KB OpenAI request: a system prompt, 40 turns with tool calls and
/// their results.
fn openai_request() -> Vec<u8> {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a careful billing assistant. ".repeat(20)}),
    ];
    let mut i = 0;
    while serde_json::to_vec(&messages).map_or(0, |b| b.len()) < 100_000 {
        messages.push(json!({"role": "user", "content": format!("Find the order status for customer {i}. {}", "Details follow. ".repeat(60))}));
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{i}"), "type": "function", "function": {"name": "get_order",
             "arguments": format!("{{\"id\":\"{i}\",\"verbose\":true}}")}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"),
            "content": format!("{{\"status\":\"shipped\",\"lines\":{}}}", "[1,2,3],".repeat(40))}));
        i += 1;
    }
    serde_json::to_vec(&json!({"model": "gpt-4o", "max_tokens": 1000, "stream": true, "messages": messages,
        "tools": [{"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}}}]}))
    .unwrap_or_default()
}

fn translate_stream(upstream: Family, chunks: &[Vec<u8>], out: &mut Vec<u8>) {
    out.clear();
    let mut t = StreamTranslator::new(
        upstream,
        StreamOptions {
            usage_chunk: true,
            ..StreamOptions::default()
        },
    );
    for c in chunks {
        t.feed(c, out).expect("translates");
    }
    t.finish().expect("complete");
}

fn translate_request(from: Family, body: &[u8]) -> Vec<u8> {
    let t = request::translate(from, body, &Options::default()).expect("translates");
    serde_json::to_vec(&t.body).unwrap_or_default()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("translate_stream_20_chunks");
    for (name, upstream, chunks) in [
        ("openai_to_anthropic", Family::OpenAi, openai_stream()),
        ("anthropic_to_openai", Family::Anthropic, anthropic_stream()),
    ] {
        assert_eq!(chunks.len(), 20);
        let mut out = Vec::with_capacity(16 << 10);
        report_allocations(&format!("stream_{name}"), 1000, || {
            translate_stream(upstream, black_box(&chunks), &mut out);
        });
        g.throughput(Throughput::Bytes(
            chunks.iter().map(|c| c.len() as u64).sum(),
        ));
        g.bench_function(name, |b| {
            b.iter(|| translate_stream(upstream, black_box(&chunks), &mut out))
        });
    }
    g.finish();

    let openai = openai_request();
    let anthropic = translate_request(Family::OpenAi, &openai);
    let mut g = c.benchmark_group("translate_request_100kb");
    for (name, from, body) in [
        ("openai_to_anthropic", Family::OpenAi, &openai),
        ("anthropic_to_openai", Family::Anthropic, &anthropic),
    ] {
        println!("request {name}: {} bytes", body.len());
        report_allocations(&format!("request_{name}"), 50, || {
            black_box(translate_request(from, black_box(body)));
        });
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| translate_request(from, black_box(body)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
