//! Hostile bodies for the judging benchmark (`judging.rs`) and its test
//! (`tests/judging.rs`): the bodies of issue #35's table, each filling the
//! same size, and the judging a model call's body gets in the gateway
//! (`inspect_body` with blocked phrases, and the loop guard's fingerprint
//! when the call carries a task id).

use loopgate_breaker::{Fingerprint, Fingerprinter, LoopConfig};
use loopgate_policy::{inspect_body, inspect_body_with, BodyFacts, Deny, Endpoint, PhraseMatcher};

/// One body of the table.
pub struct Body {
    pub name: &'static str,
    pub bytes: Vec<u8>,
    /// Judged as a call with a task id (the loop guard fingerprints it).
    pub task: bool,
}

/// `{"model":..,"messages":[{"role":"user","content":<content>}]}` with
/// `unit` repeated in `content` (a JSON string's inside, or a list's items
/// when `list`) until the body is about `size` bytes.
fn chat(size: usize, unit: &str, list: bool, tail: &str) -> Vec<u8> {
    let head = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"#;
    let end = if list { "]}]}" } else { "\"}]}" };
    let mut b = String::with_capacity(size + 64);
    b.push_str(head);
    b.push(if list { '[' } else { '"' });
    let room = size.saturating_sub(head.len() + end.len() + tail.len() + 1);
    let mut first = true;
    while b.len() + unit.len() < room {
        if list && !first {
            b.push(',');
        }
        b.push_str(unit);
        first = false;
    }
    b.push_str(tail);
    b.push_str(end);
    b.into_bytes()
}

/// Chains of `depth` nested objects (`{"a":{"a":...}}`) in `messages`
/// until the body is about `size` bytes.
fn chains(size: usize, depth: usize) -> Vec<u8> {
    let mut chain = String::new();
    for _ in 0..depth {
        chain.push_str(r#"{"a":"#);
    }
    chain.push('1');
    for _ in 0..depth {
        chain.push('}');
    }
    let head = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}"#;
    let mut b = String::with_capacity(size + 64);
    b.push_str(head);
    while b.len() + chain.len() + 4 <= size {
        b.push(',');
        b.push_str(&chain);
    }
    b.push_str("]}");
    b.into_bytes()
}

/// The table's bodies, each about `size` bytes: plain ASCII first (the
/// reference the others are measured against), then those that left the
/// ASCII path or made the loop guard build a tree.
pub fn table(size: usize) -> Vec<Body> {
    let words = "the quick brown fox jumps over the lazy dog ";
    let body = |name, bytes, task| Body { name, bytes, task };
    vec![
        body("plain ASCII", chat(size, words, false, ""), false),
        body("plain ASCII, task id", chat(size, words, false, ""), true),
        body("ASCII + one é", chat(size, words, false, "é"), false),
        body("U+FDFA", chat(size, "\u{FDFA}", false, ""), false),
        body(
            "U+FDFA JSON-escaped",
            chat(size, "\\ufdfa", false, ""),
            false,
        ),
        body(
            "one-char U+FDFA strings",
            chat(size, "\"\u{FDFA}\"", true, ""),
            false,
        ),
        body("60-deep chains, task id", chains(size, 60), true),
        body("60-deep chains", chains(size, 60), false),
    ]
}

/// Bodies beyond the table that probe the same costs: a combining mark
/// after every letter (NFKC composes each pair), Korean (its skeleton is
/// three jamo a syllable), fullwidth Latin (NFKC folds each), many small
/// keys in one object and many floats (the loop guard sorts and formats
/// them), with a task id where the loop guard has work.
pub fn extra(size: usize) -> Vec<Body> {
    let body = |name, bytes, task| Body { name, bytes, task };
    let mut keys = String::from(r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":{"#);
    let mut i = 0u32;
    while keys.len() + 16 <= size {
        if i > 0 {
            keys.push(',');
        }
        keys.push_str(&format!("\"{i:x}\":0"));
        i += 1;
    }
    keys.push_str("}}]}");
    // A letter and 30 marks in falling combining class: NFKC sorts them.
    let zalgo: String = std::iter::once('a')
        .chain((0..30).map(|i| ['\u{301}', '\u{316}', '\u{334}', '\u{345}'][i % 4]))
        .collect();
    vec![
        body(
            "a + U+0301, task id",
            chat(size, "a\u{301}", false, ""),
            true,
        ),
        body("a + U+0301", chat(size, "a\u{301}", false, ""), false),
        body(
            "a + U+0301 + bc",
            chat(size, "a\u{301}bc", false, ""),
            false,
        ),
        body(
            "Hangul jamo",
            chat(size, "\u{1100}\u{1161}\u{11A8}", false, ""),
            false,
        ),
        body("30 marks a letter", chat(size, &zalgo, false, ""), false),
        body(
            "phrase prefixes",
            chat(size, "blocked phrase numbe ", false, ""),
            false,
        ),
        body(
            "one-char ASCII strings",
            chat(size, "\"a\"", true, ""),
            false,
        ),
        body(
            "zero-width spaces",
            chat(size, "\u{200B}", false, ""),
            false,
        ),
        body(
            "Korean, task id",
            chat(size, "한국어 텍스트 ", false, ""),
            true,
        ),
        body(
            "fullwidth Latin",
            chat(size, "ｉｇｎｏｒｅ ", false, ""),
            false,
        ),
        body("small keys, task id", keys.into_bytes(), true),
        body("floats, task id", chat(size, "1e15", true, ""), true),
    ]
}

/// The blocked phrases of the compare config (100 of them).
pub fn phrases() -> PhraseMatcher {
    let phrases: Vec<String> = (1..=100)
        .map(|i| format!("blocked phrase number {i}"))
        .collect();
    PhraseMatcher::new(&phrases).expect("phrases")
}

/// What judging a body decided.
pub struct Judged {
    pub facts: Result<BodyFacts, Deny>,
    pub fingerprint: Option<Fingerprint>,
}

/// Judges `body` as the gateway judges a chat completion's: facts and
/// blocked phrases, and, for a call with a task id, the loop guard's
/// fingerprint from the same pass.
pub fn judge(body: &[u8], phrases: &PhraseMatcher, loops: Option<&LoopConfig>) -> Judged {
    let endpoint = Endpoint::ChatCompletions;
    let mut fp = loops.map(|cfg| Fingerprinter::new(endpoint.path(), cfg));
    let facts = match fp.as_mut() {
        Some(fp) => inspect_body_with(endpoint, body, Some(phrases), fp),
        None => inspect_body(endpoint, body, Some(phrases)),
    };
    let fingerprint = match facts {
        Ok(_) => fp.map(Fingerprinter::finish),
        Err(_) => None,
    };
    Judged { facts, fingerprint }
}

/// How many of [`table`]'s bodies there are.
pub const TABLE_LEN: usize = 8;

/// What judging one body cost.
#[derive(Debug)]
pub struct Measured {
    /// The least CPU time of this thread over the runs.
    pub cpu: std::time::Duration,
    /// The body's bytes plus the most judging held at once (as counted by
    /// [`crate::CountingAlloc`], which must be the global allocator).
    pub peak: u64,
    /// What was decided, in words.
    pub outcome: String,
}

/// This thread's CPU time.
pub fn thread_cpu() -> std::time::Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `t`, which lives
    // through the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Judges `b` `runs` times (at least once).
pub fn measure(b: &Body, phrases: &PhraseMatcher, loops: &LoopConfig, runs: usize) -> Measured {
    let loops = b.task.then_some(loops);
    let mut cpu = std::time::Duration::MAX;
    let mut peak = 0;
    let mut outcome = String::new();
    for _ in 0..runs.max(1) {
        let held = crate::live_bytes();
        crate::reset_peak();
        let start = thread_cpu();
        let j = std::hint::black_box(judge(&b.bytes, phrases, loops));
        cpu = cpu.min(thread_cpu() - start);
        peak = peak.max(crate::peak_bytes(held));
        outcome = match (&j.facts, j.fingerprint) {
            (Err(d), _) => format!("refused: {:?}", d.code),
            (Ok(f), Some(_)) => format!("admitted, {} text bytes, fingerprinted", f.text_bytes),
            (Ok(f), None) => format!("admitted, {} text bytes", f.text_bytes),
        };
    }
    Measured {
        cpu,
        peak: b.bytes.len() as u64 + peak,
        outcome,
    }
}

/// A `tools/call` of `read_file` whose `arguments` hold `{"v":[...]}`, the
/// list made of `unit` repeated until the body is about `size` bytes
/// (`unit` is an element; `list` false: one string of it instead).
fn mcp_call(size: usize, unit: &str, list: bool) -> Vec<u8> {
    let head = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"v":"#;
    let (open, close) = if list { ("[", "]}}}") } else { ("\"", "\"}}}") };
    let mut b = String::with_capacity(size + 64);
    b.push_str(head);
    b.push_str(open);
    let room = size.saturating_sub(close.len());
    let mut first = true;
    while b.len() + unit.len() + 1 < room {
        if list && !first {
            b.push(',');
        }
        b.push_str(unit);
        first = false;
    }
    b.push_str(close);
    b.into_bytes()
}

/// MCP bodies whose `serde_json::Value` tree costs the most per byte
/// (`tools/call` arguments of many tiny values, small objects, deep
/// chains, one object of many keys, a batch of many empty messages) and
/// plain text as the reference: what `loopgate_policy::json::parse_cost`
/// must bound.
pub fn mcp(size: usize) -> Vec<Body> {
    let body = |name, bytes| Body {
        name,
        bytes,
        task: false,
    };
    let mut keys = String::from(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"#,
    );
    let mut i = 0u32;
    while keys.len() + 16 <= size {
        if i > 0 {
            keys.push(',');
        }
        keys.push_str(&format!("\"{i:x}\":0"));
        i += 1;
    }
    keys.push_str("}}}");
    let mut chain = String::new();
    for _ in 0..60 {
        chain.push_str(r#"{"a":"#);
    }
    chain.push('1');
    chain.push_str(&"}".repeat(60));
    let mut batch = String::from("[");
    while batch.len() + 4 <= size {
        if batch.len() > 1 {
            batch.push(',');
        }
        batch.push_str("{}");
    }
    batch.push(']');
    let words = "the quick brown fox jumps over the lazy dog ";
    vec![
        body("plain ASCII", mcp_call(size, words, false)),
        body("U+FDFA JSON-escaped", mcp_call(size, "\\ufdfa", false)),
        body("one escape at the end", {
            let mut b = mcp_call(size - 2, words, false);
            b.splice(b.len() - 4..b.len() - 4, *b"\\n");
            b
        }),
        body("small numbers", mcp_call(size, "0", true)),
        body("empty strings", mcp_call(size, "\"\"", true)),
        body("one-char strings", mcp_call(size, "\"a\"", true)),
        body("empty objects", mcp_call(size, "{}", true)),
        body("empty arrays", mcp_call(size, "[]", true)),
        body("one-key objects", mcp_call(size, r#"{"a":0}"#, true)),
        body(
            "two-key records",
            mcp_call(size, r#"{"id":1,"n":"xy"}"#, true),
        ),
        body("one-element arrays", mcp_call(size, "[0]", true)),
        body("small keys", keys.into_bytes()),
        body("60-deep chains", mcp_call(size, &chain, true)),
        body("batch of empty objects", batch.into_bytes()),
    ]
}

/// What judging an MCP body cost: the bytes `parse_cost` charges for it
/// and the most judging allocated at once (the body not included).
pub struct McpMeasured {
    pub charged: u64,
    pub peak: u64,
    pub outcome: String,
}

/// Judges `body` as the gateway judges an MCP POST (every message against
/// a grant of `read_file`; the first call's arguments taken out of the
/// judgement, serialised and fingerprinted), counting its peak allocation.
pub fn measure_mcp(body: &[u8]) -> McpMeasured {
    use loopgate_policy::mcp;
    let grant = mcp::McpGrant {
        tools: loopgate_policy::PatternList::parse(&["read_file"]).expect("pattern"),
        prompts: loopgate_policy::PatternList::default(),
        resources: loopgate_policy::PatternList::default(),
    };
    let loops = LoopConfig::default();
    let charged = loopgate_policy::json::parse_cost(body);
    let held = crate::live_bytes();
    crate::reset_peak();
    let outcome = match mcp::judge(&grant, body) {
        Ok(mut j) => {
            let first = j.messages.iter_mut().find_map(|m| m.tool.take());
            if let Some((tool, mut args)) = first {
                mcp::strip_noise(&mut args, &[]);
                let _ = serde_json::to_writer(std::io::sink(), &args);
                let call = serde_json::Value::Object(serde_json::Map::from_iter([
                    ("tool".to_string(), serde_json::Value::String(tool)),
                    ("arguments".to_string(), args),
                ]));
                std::hint::black_box(loopgate_breaker::fingerprint("mcp:s:t", &call, &loops));
            }
            "admitted".to_string()
        }
        Err(r) => format!("refused: {:?}", r.deny.code),
    };
    McpMeasured {
        charged,
        peak: crate::peak_bytes(held),
        outcome,
    }
}
