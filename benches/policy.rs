//! Criterion: evaluating a typical agent request (parse and judge the body,
//! head and body rules) with 10 vs 1,000 blocked phrases. The phrase scan
//! is one aho-corasick automaton, so the two should cost about the same.
//!
//! Also the cost of pricing an answer and of counting a prompt's tokens
//! with OpenAI's tokenizer for the context guard, per KB of prompt (the
//! guard's cheap bound skips the count for bodies far below the window).
//!
//! Run: cargo bench -p loopgate-benches --bench policy

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use loopgate_policy::{inspect_body, AgentRules, Endpoint, PatternList, PhraseMatcher, Verdict};
use std::sync::Arc;

#[global_allocator]
static ALLOC: loopgate_benches::CountingAlloc = loopgate_benches::CountingAlloc;

/// A typical chat request: a system prompt, a few turns, two tools (~2 KB).
fn typical_body() -> Vec<u8> {
    let turn = "Could you look up the order status for customer 4411 and summarise the last three \
                support tickets, including any refunds that were issued?";
    format!(
        r#"{{"model":"gpt-4o-mini","max_tokens":512,"stream":true,
        "messages":[
          {{"role":"system","content":"You are a careful billing assistant. Answer briefly."}},
          {{"role":"user","content":"{turn}"}},
          {{"role":"assistant","content":"Sure, let me check the order system first."}},
          {{"role":"tool","tool_call_id":"call_1","content":"{{\"status\":\"shipped\",\"eta\":\"2026-12-04\"}}"}},
          {{"role":"user","content":"{turn} Also include the shipping carrier."}}
        ],
        "tools":[
          {{"type":"function","function":{{"name":"get_order","description":"Look up an order","parameters":{{"type":"object","properties":{{"id":{{"type":"string"}}}}}}}}}},
          {{"type":"function","function":{{"name":"search_tickets","description":"Search tickets","parameters":{{"type":"object"}}}}}}
        ]}}"#
    )
    .into_bytes()
}

fn phrases(n: usize) -> Vec<String> {
    let base = [
        "ignore previous instructions",
        "developer mode",
        "jailbreak",
        "system prompt",
        "do anything now",
    ];
    (0..n)
        .map(|i| format!("{} {i}", base[i % base.len()]))
        .collect()
}

fn rules(n: usize) -> AgentRules {
    let mut r = AgentRules::new(
        "bench",
        PatternList::parse(&["gpt-4o-mini"]).unwrap(),
        1 << 20,
    );
    r.tools = Some(PatternList::parse(&["get_*", "search_tickets"]).unwrap());
    r.required_headers = vec!["x-agent-task-id".into()];
    r.max_tokens = Some(4096);
    r.max_messages = Some(64);
    r.phrases = Some(Arc::new(PhraseMatcher::new(&phrases(n)).unwrap()));
    r
}

fn evaluate(rules: &AgentRules, body: &[u8]) -> Verdict {
    let mut v = Verdict::default();
    rules
        .check_head(
            Endpoint::ChatCompletions,
            |_| Some(b"task-1".as_slice()),
            &mut v,
        )
        .unwrap();
    let facts = inspect_body(Endpoint::ChatCompletions, body, rules.phrases.as_deref()).unwrap();
    rules.check_body(&facts, &mut v).unwrap();
    v
}

fn bench(c: &mut Criterion) {
    let body = typical_body();
    let mut g = c.benchmark_group("evaluate_typical_request");
    for n in [10, 1000] {
        let r = rules(n);
        assert!(evaluate(&r, &body).would_deny.is_none());
        loopgate_benches::report_allocations(
            &format!("evaluate_typical_request/{n}_phrases"),
            1000,
            || {
                black_box(evaluate(&r, black_box(&body)));
            },
        );
        g.bench_function(format!("{n}_phrases"), |b| {
            b.iter(|| evaluate(&r, black_box(&body)))
        });
    }
    g.finish();
}

/// A chat body whose user message is `kb` KB of English-like text.
fn prompt_body(kb: usize) -> Vec<u8> {
    let sentence = "The agent retried the parser again because the schema had changed overnight. ";
    let text: String = sentence.repeat(kb * 1024 / sentence.len() + 1)[..kb * 1024].to_string();
    serde_json::to_vec(&serde_json::json!({
        "model": "gpt-4o", "max_tokens": 512,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
    }))
    .unwrap()
}

fn pricing_and_counting(c: &mut Criterion) {
    use loopgate_policy::prompt::{count_prompt, ContextCheck};
    use loopgate_policy::{Price, Usage};
    let mut g = c.benchmark_group("pricing_and_counting");
    let price = Price {
        input: 2.5,
        output: 10.0,
        cache_read: 1.25,
        cache_write: 2.5,
    };
    let usage = Usage {
        input_tokens: 12_000,
        output_tokens: 800,
        cached_input_tokens: 4_000,
        ..Usage::default()
    };
    g.bench_function("price_one_answer", |b| {
        b.iter(|| black_box(&price).cost(black_box(&usage)))
    });
    // Warm the tokenizer (its vocabulary is parsed once per process).
    let _ = count_prompt(Endpoint::ChatCompletions, "gpt-4o", &prompt_body(1), 1);
    for kb in [1usize, 16, 64] {
        let body = prompt_body(kb);
        g.bench_function(format!("count_o200k_{kb}kb"), |b| {
            b.iter(|| count_prompt(Endpoint::ChatCompletions, "gpt-4o", black_box(&body), 1))
        });
    }
    // The guard's usual case: far below the window, nothing counted.
    let body = prompt_body(16);
    g.bench_function("guard_16kb_under_the_bound", |b| {
        let guard = ContextCheck {
            endpoint: Endpoint::ChatCompletions,
            model: "gpt-4o",
            window: 128_000,
            output: 512,
            estimate: 1,
            messages: 2,
            watch: Some(0.8),
        };
        b.iter(|| guard.check(black_box(&body)))
    });
    g.finish();
}

criterion_group!(benches, bench, pricing_and_counting);
criterion_main!(benches);
