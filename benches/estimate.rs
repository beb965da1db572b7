//! How far the prompt estimate (one token per 4 bytes of text, what the
//! context guard and the budgets use for models without a tokenizer) is
//! from a real count, on a corpus of chat requests: per kind of text, the
//! estimate over the `o200k_base` count (gpt-4o's tokenizer, the one real
//! count compiled in; Anthropic's tokenizer is not published, so this is
//! the nearest honest reference).
//!
//! The corpus is built from text in this repository and a few paragraphs
//! of other scripts written here: English prose (README paragraphs),
//! source code (Rust files of the gateway), structured data (the lock
//! file's packages as a JSON tool result) and six non-Latin languages.
//! Each request is a chat completion of a system prompt, a user turn of
//! about 0.5-4 KB of one kind and a short assistant turn. Three kinds are
//! not text in a turn: tool schemas whose properties are the lock file's
//! packages (named by package, or by checksum as hashed keys), where the
//! keys are most of the prompt, and completions whose `prompt` is token
//! ids, where each id is one token.
//!
//! Run: cargo run --release -p loopgate-benches --bin estimate

use loopgate_policy::prompt::count_prompt;
use loopgate_policy::{inspect_body, Endpoint};
use serde_json::{json, Value};

const README: &str = include_str!("../README.md");
const CODE: [&str; 3] = [
    include_str!("../gateway/src/proxy/admit.rs"),
    include_str!("../policy/src/store.rs"),
    include_str!("../policy/src/prompt.rs"),
];
const LOCK: &str = include_str!("../Cargo.lock");

/// A few paragraphs per script, on what an agent gateway does.
const SCRIPTS: [(&str, &str); 6] = [
    (
        "Russian",
        "Шлюз стоит между агентами и моделями. Он проверяет каждый запрос, \
         считает токены и деньги, и отказывает, если бюджет задачи исчерпан. \
         Агент, который повторяет один и тот же вызов, останавливается, \
         а провайдер, который отвечает ошибками, получает паузу.",
    ),
    (
        "Chinese",
        "网关位于智能体和模型之间。它检查每一个请求，计算令牌和费用，\
         当任务的预算用完时拒绝请求。反复发出相同调用的智能体会被停止，\
         连续返回错误的服务商会被暂时隔离。",
    ),
    (
        "Japanese",
        "ゲートウェイはエージェントとモデルの間に立ちます。すべてのリクエストを検査し、\
         トークンと費用を数え、タスクの予算が尽きたら拒否します。\
         同じ呼び出しを繰り返すエージェントは停止されます。",
    ),
    (
        "Arabic",
        "تقف البوابة بين الوكلاء والنماذج. تفحص كل طلب وتحسب الرموز والتكلفة، \
         وترفض الطلب عندما تنفد ميزانية المهمة. يتم إيقاف الوكيل الذي يكرر \
         نفس الاستدعاء مرارا.",
    ),
    (
        "Hindi",
        "गेटवे एजेंटों और मॉडलों के बीच खड़ा होता है। यह हर अनुरोध की जाँच करता है, \
         टोकन और लागत गिनता है, और कार्य का बजट खत्म होने पर अनुरोध अस्वीकार करता है।",
    ),
    (
        "Greek",
        "Η πύλη βρίσκεται ανάμεσα στους πράκτορες και στα μοντέλα. Ελέγχει κάθε \
         αίτημα, μετρά τα διακριτικά και το κόστος, και αρνείται όταν εξαντληθεί \
         ο προϋπολογισμός της εργασίας.",
    ),
];

fn main() {
    let system = "You are a careful assistant for a platform team. Answer briefly.";
    let chat = |turns: Vec<String>| -> Vec<(Endpoint, Value)> {
        turns
            .into_iter()
            .map(|turn| {
                let body = json!({
                    "model": "gpt-4o",
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": turn},
                        {"role": "assistant", "content": "Understood; checking now."},
                    ],
                });
                (Endpoint::ChatCompletions, body)
            })
            .collect()
    };
    let mut kinds: Vec<(String, Vec<(Endpoint, Value)>)> = vec![
        ("English prose".into(), chat(prose())),
        ("Source code".into(), chat(code())),
        ("JSON tool result".into(), chat(json_results(false))),
        ("JSON, hex digests".into(), chat(json_results(true))),
    ];
    for (name, text) in SCRIPTS {
        // The same paragraph repeated to 0.5-2 KB, as a user turn.
        let turns = (1..=4).map(|n| text.repeat(n)).collect();
        kinds.push((name.into(), chat(turns)));
    }
    kinds.push(("Tool schema".into(), tool_schemas(system, false)));
    kinds.push(("Schema, hex keys".into(), tool_schemas(system, true)));
    kinds.push(("Token ids".into(), token_ids()));
    println!(
        "{:<18} {:>8} {:>10} {:>10} {:>9} {:>9} {:>9}",
        "kind", "requests", "estimate", "counted", "mean", "min", "max"
    );
    let mut all = Vec::new();
    for (name, turns) in &kinds {
        let mut ratios = Vec::new();
        let (mut est_sum, mut count_sum) = (0u64, 0u64);
        for (endpoint, body) in turns {
            let body = serde_json::to_vec(body).expect("a JSON body");
            let facts = inspect_body(*endpoint, &body, None).expect("a body");
            let estimate = facts.estimated_prompt_tokens();
            let (counted, _) = count_prompt(*endpoint, "gpt-4o", &body, estimate);
            ratios.push(estimate as f64 / counted as f64);
            est_sum += estimate;
            count_sum += counted;
        }
        all.extend(ratios.iter().copied());
        row(name, &ratios, est_sum, count_sum);
    }
    println!("{:-<79}", "");
    let (lo, hi) = min_max(&all);
    println!(
        "{:<18} {:>8} {:>10} {:>10} {:>9.2} {:>9.2} {:>9.2}",
        "all",
        all.len(),
        "",
        "",
        all.iter().sum::<f64>() / all.len() as f64,
        lo,
        hi
    );
    println!("ratio = estimate / o200k count; below 1 the estimate undercounts");
}

fn row(name: &str, ratios: &[f64], est: u64, counted: u64) {
    let (lo, hi) = min_max(ratios);
    println!(
        "{:<18} {:>8} {:>10} {:>10} {:>9.2} {:>9.2} {:>9.2}",
        name,
        ratios.len(),
        est,
        counted,
        ratios.iter().sum::<f64>() / ratios.len().max(1) as f64,
        lo,
        hi
    );
}

fn min_max(xs: &[f64]) -> (f64, f64) {
    xs.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(*x), hi.max(*x))
        })
}

/// README prose (paragraphs and list items; no code blocks, tables or
/// headings), grouped into turns of at least 500 bytes.
fn prose() -> Vec<String> {
    let mut text = String::new();
    let mut in_code = false;
    for line in README.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        let t = line.trim_start();
        if in_code || t.starts_with(['|', '#']) || line.starts_with("    ") {
            continue;
        }
        text.push_str(line);
        text.push('\n');
    }
    chunks(&text, 1024)
}

/// Source files cut into turns of about 2 KB, at line ends.
fn code() -> Vec<String> {
    CODE.iter().flat_map(|file| chunks(file, 2048)).collect()
}

/// The lock file's packages as JSON arrays of objects, as a tool would
/// return them: name, version and dependencies, and with `digests` each
/// package's SHA-256 too (hex tokenizes at about 2 bytes a token).
fn json_results(digests: bool) -> Vec<String> {
    let packages: Vec<serde_json::Value> = LOCK
        .split("[[package]]")
        .skip(1)
        .map(|p| {
            let field = |k: &str| {
                p.lines()
                    .find_map(|l| l.strip_prefix(&format!("{k} = \"")))
                    .map(|v| v.trim_end_matches('"').to_string())
            };
            let deps: Vec<&str> = p
                .split("dependencies = [")
                .nth(1)
                .and_then(|d| d.split(']').next())
                .map(|d| d.split('"').skip(1).step_by(2).collect())
                .unwrap_or_default();
            let mut o = serde_json::json!({"name": field("name"), "version": field("version"), "dependencies": deps});
            if digests {
                o["checksum"] = field("checksum").into();
            }
            o
        })
        .collect();
    packages
        .chunks(24)
        .map(|c| serde_json::to_string_pretty(c).expect("JSON"))
        .collect()
}

/// Chat calls with one tool each whose parameters are 24 of the lock
/// file's packages: named by package (a description with its version and
/// dependencies), or with `hex` by checksum (the hashed property names a
/// generated schema can have; 64 hex digits, about 2 bytes a token).
fn tool_schemas(system: &str, hex: bool) -> Vec<(Endpoint, Value)> {
    let packages: Vec<(String, String, String)> = LOCK
        .split("[[package]]")
        .skip(1)
        .filter_map(|p| {
            let field = |k: &str| {
                p.lines()
                    .find_map(|l| l.strip_prefix(&format!("{k} = \"")))
                    .map(|v| v.trim_end_matches('"').to_string())
            };
            Some((field("name")?, field("version")?, field("checksum")?))
        })
        .collect();
    packages
        .chunks(24)
        .map(|c| {
            let props: serde_json::Map<String, Value> = c
                .iter()
                .map(|(name, version, sum)| {
                    let key = if hex { sum.clone() } else { name.clone() };
                    let schema = if hex {
                        json!({})
                    } else {
                        json!({"type": "string", "description": format!("the {name} crate, version {version}")})
                    };
                    (key, schema)
                })
                .collect();
            let body = json!({
                "model": "gpt-4o",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": "Which of these packages are outdated?"},
                ],
                "tools": [{"type": "function", "function": {
                    "name": "check_packages", "description": "Checks packages for updates.",
                    "parameters": {"type": "object", "properties": props}}}],
            });
            (Endpoint::ChatCompletions, body)
        })
        .collect()
}

/// Completions whose `prompt` is token ids, an id per word of README
/// prose (the ids' values do not matter: each is one token to the model
/// and to both counts), in turns of about 1 KB of text.
fn token_ids() -> Vec<(Endpoint, Value)> {
    prose()
        .into_iter()
        .take(20)
        .map(|turn| {
            let ids: Vec<u64> = turn
                .split_whitespace()
                .map(|w| {
                    w.bytes()
                        .fold(17u64, |h, b| (h * 31 + u64::from(b)) % 200_000)
                })
                .collect();
            (
                Endpoint::Completions,
                json!({"model": "gpt-4o", "prompt": ids}),
            )
        })
        .collect()
}

fn chunks(text: &str, size: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        cur.push_str(line);
        cur.push('\n');
        if cur.len() >= size {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}
