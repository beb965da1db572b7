//! Prompt tokens, counted before a call goes upstream, and the context
//! window guard: a prompt plus its output limit must fit the model's
//! window, or the call is refused (`context_window_exceeded`) before it
//! costs anything.
//!
//! OpenAI models (those `tiktoken` maps to `o200k_base` or `cl100k_base`:
//! `gpt-4o`, `gpt-4.1`, `gpt-5`, `o1`/`o3`/`o4`, `gpt-4`, `gpt-3.5`, the
//! embeddings) are counted with the real tokenizer (`tiktoken-rs`, its
//! vocabulary files compiled in: nothing is downloaded at run time). Every
//! text of the prompt fields is encoded, plus OpenAI's documented overhead
//! of 3 tokens per message and 3 to prime the reply; so are the keys of
//! `tools` and `functions` (a schema's property names are prompt the model
//! reads) and the numbers of every prompt field, and an integer under
//! `input` or `prompt` (embeddings' and completions' token ids) is exactly
//! one token. Images and files are not counted (their cost depends on
//! detail settings the provider applies).
//!
//! Other families (Anthropic, local models) are estimated: one token per
//! 4 bytes of the body's text (the usual rule of thumb for English) and
//! per 3 bytes of the keys of nested objects, plus numbers and token ids
//! counted as tokens ([`crate::BodyFacts::estimated_prompt_tokens`]).
//! Against a real count (`benches/estimate.rs`) it undercounts JSON of hex
//! digests by up to ~40% and overcounts multi-byte scripts; an undercount
//! lets the provider refuse instead (a false refusal here would be worse).
//!
//! The tokenizer is not cheap (about 17-20 us per KB of prompt, see the
//! `pricing_and_counting` bench),
//! so the guard first checks a bound that needs no counting: a BPE token
//! covers at least one byte, so a body whose length plus overhead plus
//! output fits the window fits; only larger ones are counted.

use crate::decision::{Deny, DenyCode};
use crate::endpoint::Endpoint;
use tiktoken_rs::tokenizer::{get_tokenizer, Tokenizer};
use tiktoken_rs::CoreBPE;

/// Tokens per message and for the reply's priming, as OpenAI documents
/// for its chat models.
const PER_MESSAGE: u64 = 3;
const REPLY_PRIMING: u64 = 3;

/// How a prompt's tokens were counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// With the model's own tokenizer.
    Tokenizer,
    /// Estimated from the text's length.
    Estimate,
}

impl Counted {
    pub fn as_str(self) -> &'static str {
        match self {
            Counted::Tokenizer => "counted",
            Counted::Estimate => "estimated",
        }
    }
}

/// The tokenizer of an OpenAI model, if it has one compiled in.
fn tokenizer(model: &str) -> Option<&'static CoreBPE> {
    match get_tokenizer(model)? {
        Tokenizer::O200kBase => Some(tiktoken_rs::o200k_base_singleton()),
        Tokenizer::Cl100kBase => Some(tiktoken_rs::cl100k_base_singleton()),
        _ => None,
    }
}

/// Whether `model`'s prompts are counted with a real tokenizer.
pub fn has_tokenizer(model: &str) -> bool {
    matches!(
        get_tokenizer(model),
        Some(Tokenizer::O200kBase | Tokenizer::Cl100kBase)
    )
}

/// Fields of a request body that hold the prompt.
const PROMPT_FIELDS: [&str; 7] = [
    "messages",
    "system",
    "prompt",
    "input",
    "instructions",
    "tools",
    "functions",
];

/// Keys whose values are not text the model reads as tokens (ids, kinds,
/// encoded images and files).
fn skipped(key: &str) -> bool {
    matches!(
        key,
        "type" | "id" | "tool_call_id" | "image_url" | "url" | "data" | "file_data" | "file_id"
    )
}

/// Texts longer than this are tokenized a piece at a time (cut before a
/// whitespace near the end of the piece where there is one): the
/// tokenizer's work space grows with the longest piece it is given (a
/// multiple of it), so a string of megabytes would cost hundreds of
/// megabytes at once (8 MiB of U+FDFA: 418 MB). Exact but for a token at
/// a cut that falls inside one (at most one per piece of a long string).
const PIECE: usize = 64 * 1024;

/// The tokens of `text`, a piece at a time ([`PIECE`]), stopping once past
/// `limit`.
fn count_text(bpe: &CoreBPE, text: &str, limit: u64) -> u64 {
    let mut n = 0u64;
    let mut rest = text;
    while !rest.is_empty() && n <= limit {
        let mut cut = rest.len().min(PIECE);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        if cut < rest.len() {
            let near = rest[..cut]
                .rfind(char::is_whitespace)
                .filter(|&w| w > cut - PIECE / 4);
            cut = near.unwrap_or(cut);
        }
        n += bpe.encode_ordinary(&rest[..cut]).len() as u64;
        rest = &rest[cut..];
    }
    n
}

/// The prompt tokens of `body` (a JSON object) for `model`, with the
/// tokenizer where the model has one, else `estimate`.
pub fn count_prompt(endpoint: Endpoint, model: &str, body: &[u8], estimate: u64) -> (u64, Counted) {
    count_prompt_until(endpoint, model, body, estimate, u64::MAX)
}

/// As [`count_prompt`], stopping once the count passes `limit` (what it
/// returns then is over `limit`, not the whole count): a prompt of
/// megabytes past a window of 128k tokens is refused after about the
/// window's worth of tokenizing.
pub fn count_prompt_until(
    endpoint: Endpoint,
    model: &str,
    body: &[u8],
    estimate: u64,
    limit: u64,
) -> (u64, Counted) {
    let Some(bpe) = tokenizer(model) else {
        return (estimate, Counted::Estimate);
    };
    // Read as tokens, not into a `serde_json::Value`: a tree of a body of
    // tiny strings costs many times the body (see `crate::tokens`), and
    // counting runs on the largest bodies.
    let mut counter = Counter {
        bpe,
        depth: 0,
        field: Field::Other,
        ids: false,
        skip_next: false,
        skip_from: None,
        items: 0,
        in_items: false,
        text: 0,
        limit,
        object: false,
    };
    if crate::tokens::read(body, &mut counter).is_err() || !counter.object {
        return (estimate, Counted::Estimate);
    }
    let overhead = match endpoint {
        Endpoint::ChatCompletions | Endpoint::Responses => {
            counter.items.saturating_mul(PER_MESSAGE) + REPLY_PRIMING
        }
        _ => 0,
    };
    (counter.text + overhead, Counted::Tokenizer)
}

/// Which top-level field the tokens being read belong to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    /// A prompt field whose items are messages (`messages`, `input`).
    Items,
    /// `tools`, `functions`: their keys are prompt too (property names).
    Tools,
    /// Another prompt field.
    Prompt,
    Other,
}

/// Counts the tokens of every string under a prompt field, except under
/// keys that hold no text ([`skipped`]), and the items of `messages` or
/// `input`.
struct Counter {
    bpe: &'static CoreBPE,
    /// Containers open.
    depth: usize,
    field: Field,
    /// Under `input` or `prompt`, whose integers are token ids.
    ids: bool,
    /// The next value belongs to a skipped key.
    skip_next: bool,
    /// Inside a skipped key's container opened at this depth.
    skip_from: Option<usize>,
    items: u64,
    /// Inside the array of `messages` or `input`.
    in_items: bool,
    text: u64,
    /// Past this many tokens of text, no more is tokenized.
    limit: u64,
    /// The document is an object.
    object: bool,
}

impl Counter {
    /// Adds the tokens of `text`, unless past the limit already.
    fn count(&mut self, text: &str) {
        if self.text <= self.limit {
            let n = count_text(self.bpe, text, self.limit - self.text);
            self.text = self.text.saturating_add(n);
        }
    }

    /// A number in a prompt field: a token id is one token, any other is
    /// counted as written.
    fn number(&mut self, integer: bool, written: impl FnOnce() -> String) {
        if self.value(false) {
            if integer && self.ids {
                self.text = self.text.saturating_add(1);
            } else {
                self.count(&written());
            }
        }
    }

    /// A value begins at the current depth; `false` when it is skipped.
    fn value(&mut self, container: bool) -> bool {
        if self.depth == 2 && self.in_items {
            self.items += 1;
        }
        if self.skip_from.is_some() {
            return false;
        }
        if std::mem::take(&mut self.skip_next) {
            if container {
                self.skip_from = Some(self.depth);
            }
            return false;
        }
        self.field != Field::Other
    }
}

impl crate::tokens::TokenSink for Counter {
    fn token(&mut self, t: crate::tokens::Token<'_>) {
        use crate::tokens::Token;
        match t {
            Token::ObjectStart | Token::ArrayStart => {
                self.value(true);
                if self.depth == 0 {
                    self.object = t == Token::ObjectStart;
                }
                if self.depth == 1 {
                    self.in_items = self.field == Field::Items && t == Token::ArrayStart;
                }
                self.depth += 1;
            }
            Token::ObjectEnd | Token::ArrayEnd => {
                self.depth = self.depth.saturating_sub(1);
                if self.skip_from == Some(self.depth) {
                    self.skip_from = None;
                }
            }
            Token::Key(k) if self.depth == 1 => {
                self.field = match k {
                    "messages" | "input" => Field::Items,
                    "tools" | "functions" => Field::Tools,
                    _ if PROMPT_FIELDS.contains(&k) => Field::Prompt,
                    _ => Field::Other,
                };
                self.ids = matches!(k, "input" | "prompt");
            }
            Token::Key(k) => {
                if self.skip_from.is_none() {
                    if self.field == Field::Tools {
                        self.count(k);
                    }
                    if skipped(k) {
                        self.skip_next = true;
                    }
                }
            }
            Token::Str(text) => {
                if self.value(false) {
                    self.count(text);
                }
            }
            Token::U64(n) => self.number(true, || n.to_string()),
            Token::I64(n) => self.number(true, || n.to_string()),
            Token::F64(n) => self.number(false, || n.to_string()),
            Token::Bool(_) | Token::Null => {
                self.value(false);
            }
        }
    }
}

/// The context guard for one call, against the window of the model it is
/// sent (`model`).
#[derive(Debug, Clone, Copy)]
pub struct ContextCheck<'a> {
    pub endpoint: Endpoint,
    pub model: &'a str,
    /// The model's context window, in tokens.
    pub window: u64,
    /// The call's output limit per completion (its `max_tokens`, the
    /// agent's inserted limit, or the default output).
    pub output: u64,
    /// The body's length-based estimate and its message count.
    pub estimate: u64,
    pub messages: u64,
    /// The watchdog's lowest context-occupancy threshold (a share of the
    /// window), when it watches the call: the prompt's share is measured
    /// once it may reach it.
    pub watch: Option<f64>,
}

impl ContextCheck<'_> {
    /// Refuses a prompt plus output past the window; else the share of the
    /// window the prompt fills, when it may reach [`ContextCheck::watch`]
    /// (`None`: below it, or not watched). Counts only when the cheap
    /// bound does not already answer both.
    pub fn check(&self, body: &[u8]) -> Result<Option<f64>, Deny> {
        // Every token covers a byte at least, and the estimate is below
        // the body's length: within this bound, so is the count.
        let prompt_bound = (body.len() as u64)
            .saturating_add(self.messages.saturating_mul(PER_MESSAGE) + REPLY_PRIMING);
        let watched = |prompt: u64| {
            self.watch
                .filter(|w| prompt as f64 >= w * self.window as f64)
                .map(|_| prompt as f64 / self.window as f64)
        };
        if prompt_bound.saturating_add(self.output) <= self.window
            && watched(prompt_bound).is_none()
        {
            return Ok(None);
        }
        // Past the window less the output it is refused, so the count
        // stops there: a prompt of megabytes costs about a window's worth
        // of tokenizing.
        let limit = self.window.saturating_sub(self.output);
        let (prompt, how) =
            count_prompt_until(self.endpoint, self.model, body, self.estimate, limit);
        if prompt.saturating_add(self.output) <= self.window {
            return Ok(watched(prompt));
        }
        Err(Deny::new(
            DenyCode::ContextWindowExceeded,
            format!(
                "the prompt ({prompt} tokens, {}) plus the output limit ({} tokens) is {} tokens: \
                 more than `{}`'s context window of {} tokens",
                how.as_str(),
                self.output,
                prompt.saturating_add(self.output),
                crate::clip(self.model, 200),
                self.window,
            ),
        )
        .never_retryable())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_string_is_counted_a_piece_at_a_time_and_stops_past_the_limit() {
        let bpe = tokenizer("gpt-4o").unwrap();
        // Words: pieces cut before a space count as the whole does.
        let words = "the quick brown fox jumps over the lazy dog ".repeat(5000);
        let whole = bpe.encode_ordinary(&words).len() as u64;
        assert!(words.len() > 3 * PIECE);
        assert_eq!(count_text(bpe, &words, u64::MAX), whole);
        // No whitespace: cut at a character boundary, a token at most more
        // a cut.
        let wide = "\u{fdfa}".repeat(60_000);
        let whole = bpe.encode_ordinary(&wide).len() as u64;
        let pieces = count_text(bpe, &wide, u64::MAX);
        assert!(pieces >= whole && pieces <= whole + (wide.len() / PIECE) as u64);
        // Past the limit it stops: over the limit, and short of the whole.
        let n = count_text(bpe, &words, 1000);
        assert!(n > 1000 && n < whole, "{n}");
    }

    fn chat(content: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": [{"type": "text", "text": content}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
            ]
        }))
        .unwrap()
    }

    #[test]
    fn openai_prompts_are_counted_with_the_real_tokenizer() {
        assert!(has_tokenizer("gpt-4o-2024-08-06"));
        assert!(has_tokenizer("gpt-4.1-mini"));
        assert!(has_tokenizer("o3-mini"));
        assert!(!has_tokenizer("claude-sonnet-4-5"));
        assert!(!has_tokenizer("llama3"));
        // "hello world" is 2 tokens in o200k_base; roles 1 each; 2 messages.
        let (n, how) = count_prompt(Endpoint::ChatCompletions, "gpt-4o", &chat("hello world"), 1);
        assert_eq!(how, Counted::Tokenizer);
        let system = tiktoken_rs::o200k_base_singleton()
            .encode_ordinary("You are terse.")
            .len() as u64;
        assert_eq!(n, system + 2 + 1 + 1 + 2 * PER_MESSAGE + REPLY_PRIMING);
        // Other families: the estimate as given.
        assert_eq!(
            count_prompt(Endpoint::Messages, "claude-3-5-haiku", b"{}", 42),
            (42, Counted::Estimate)
        );
    }

    #[test]
    fn a_prompt_that_outgrows_the_window_is_refused_with_the_counts() {
        let body = chat(&"lorem ipsum dolor sit amet ".repeat(200));
        let (n, _) = count_prompt(Endpoint::ChatCompletions, "gpt-4o", &body, 1);
        assert!(n > 1000 && n < 1300, "{n}");
        let guard = |window, watch| ContextCheck {
            endpoint: Endpoint::ChatCompletions,
            model: "gpt-4o",
            window,
            output: 100,
            estimate: 1,
            messages: 2,
            watch,
        };
        assert_eq!(guard(n + 100, None).check(&body), Ok(None));
        // Watched: the share is measured once the prompt may reach it.
        let share = n as f64 / (n + 100) as f64;
        assert_eq!(guard(n + 100, Some(0.8)).check(&body), Ok(Some(share)));
        assert_eq!(guard(n + 100, Some(0.99)).check(&body), Ok(None));
        assert_eq!(guard(1_000_000, Some(0.8)).check(&body), Ok(None));
        let d = guard(n + 99, Some(0.8)).check(&body).unwrap_err();
        assert_eq!(d.code, DenyCode::ContextWindowExceeded);
        assert!(
            d.message.contains(&format!("({n} tokens, counted)")),
            "{}",
            d.message
        );
        assert!(
            d.message.contains(&format!("window of {} tokens", n + 99)),
            "{}",
            d.message
        );
        // Estimated families: the estimate decides.
        let d = ContextCheck {
            endpoint: Endpoint::Messages,
            model: "claude-x",
            window: 5000,
            output: 1,
            estimate: 5000,
            messages: 2,
            watch: None,
        }
        .check(&body)
        .unwrap_err();
        assert!(
            d.message.contains("(5000 tokens, estimated)"),
            "{}",
            d.message
        );
    }

    /// The count as a walk of a `serde_json::Value` tree gives it (what
    /// the token reader replaced).
    fn count_from_tree(body: &[u8]) -> u64 {
        use serde_json::Value;
        // `tools`: keys count; `ids`: integers are token ids.
        fn texts(v: &Value, bpe: &CoreBPE, n: &mut u64, tools: bool, ids: bool) {
            let encode = |s: &str| bpe.encode_ordinary(s).len() as u64;
            match v {
                Value::String(s) => *n += encode(s),
                Value::Number(x) if ids && !x.is_f64() => *n += 1,
                Value::Number(x) => *n += encode(&x.to_string()),
                Value::Array(a) => a.iter().for_each(|x| texts(x, bpe, n, tools, ids)),
                Value::Object(o) => {
                    for (k, x) in o {
                        if tools {
                            *n += encode(k);
                        }
                        if !skipped(k) {
                            texts(x, bpe, n, tools, ids);
                        }
                    }
                }
                _ => {}
            }
        }
        let bpe = tiktoken_rs::o200k_base_singleton();
        let doc: serde_json::Map<String, Value> = serde_json::from_slice(body).unwrap();
        let (mut n, mut items) = (0, 0);
        for f in PROMPT_FIELDS {
            if let Some(v) = doc.get(f) {
                if let (true, Value::Array(a)) = (matches!(f, "messages" | "input"), v) {
                    items += a.len() as u64;
                }
                let tools = matches!(f, "tools" | "functions");
                texts(v, bpe, &mut n, tools, matches!(f, "input" | "prompt"));
            }
        }
        n + items * PER_MESSAGE + REPLY_PRIMING
    }

    #[test]
    fn the_token_reader_counts_what_a_tree_walk_counts() {
        let bodies = [
            serde_json::json!({"model": "gpt-4o", "messages": [
                {"role": "user", "content": "hi there", "id": "msg_1", "type": "x"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "f", "arguments": "{\"a\": [1, 2, \"three\"]}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "ok"}]}],
                "tools": [{"type": "function", "function": {"name": "f", "description": "does f",
                    "parameters": {"type": "object", "properties": {"a": {"type": "array"}}}}}],
                "metadata": {"note": "not prompt"}, "temperature": 0.2}),
            serde_json::json!({"model": "gpt-4o", "input": "one string input", "instructions": "be brief"}),
            serde_json::json!({"model": "gpt-4o", "input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": {"url": "data:x", "detail": "low"}},
                {"type": "input_text", "text": "what is this"}]}, "plain"], "system": ["a", {"data": {"deep": ["x"]}}]}),
            serde_json::json!({"model": "gpt-4o", "prompt": ["a b c", "d e f"], "functions": [{"name": "g"}],
                "messages": {"not": "an array"}}),
            serde_json::json!({"model": "gpt-4o", "input": [[100, 200, 300], [4]], "tools": [{"type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "properties": {
                    "a3f9": {"type": "integer", "minimum": 10, "enum": [1, 2.5, -3]}, "b": {}}}}}]}),
        ];
        for b in bodies {
            let body = serde_json::to_vec(&b).unwrap();
            let (n, how) = count_prompt(Endpoint::ChatCompletions, "gpt-4o", &body, 1);
            assert_eq!(how, Counted::Tokenizer);
            assert_eq!(n, count_from_tree(&body), "{b}");
        }
    }

    #[test]
    fn token_ids_and_schema_keys_are_counted() {
        let ids: Vec<u64> = (0..5000).map(|i| 1000 + i).collect();
        let body = serde_json::to_vec(&serde_json::json!({
            "model": "text-embedding-3-small", "input": [ids, [1, 2]]
        }))
        .unwrap();
        let (n, how) = count_prompt(Endpoint::Embeddings, "text-embedding-3-small", &body, 1);
        assert_eq!((n, how), (5002, Counted::Tokenizer));
        // A tool schema: 100 hashed property names, 64 hex digits each.
        let props: serde_json::Map<String, serde_json::Value> = (0..100)
            .map(|i| (format!("{:064x}", i * 7919), serde_json::json!({})))
            .collect();
        let body = serde_json::to_vec(&serde_json::json!({"model": "gpt-4o", "messages": [],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"properties": props}}}]}))
        .unwrap();
        let (n, _) = count_prompt(Endpoint::ChatCompletions, "gpt-4o", &body, 1);
        assert!(n > 100 * 16, "{n}");
    }

    #[test]
    fn odd_bodies_fall_back_to_the_estimate() {
        for body in [&b"[]"[..], b"{", b"\xff"] {
            assert_eq!(
                count_prompt(Endpoint::ChatCompletions, "gpt-4o", body, 7),
                (7, Counted::Estimate)
            );
        }
    }
}
