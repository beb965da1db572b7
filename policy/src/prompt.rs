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
//! of 3 tokens per message and 3 to prime the reply. Images and files are
//! not counted (their cost depends on detail settings the provider applies).
//!
//! Other families (Anthropic, local models) are estimated: one token per
//! 4 bytes of the body's text ([`crate::BodyFacts::estimated_prompt_tokens`]),
//! the usual rule of thumb for English. It undercounts code and non-Latin
//! scripts; the guard then lets the provider refuse instead (a false
//! refusal here would be worse).
//!
//! The tokenizer is not cheap (about 17-20 us per KB of prompt, see the
//! `pricing_and_counting` bench),
//! so the guard first checks a bound that needs no counting: a BPE token
//! covers at least one byte, so a body whose length plus overhead plus
//! output fits the window fits; only larger ones are counted.

use crate::decision::{Deny, DenyCode};
use crate::endpoint::Endpoint;
use serde_json::Value;
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

/// The texts of a prompt, and how many messages (or input items) it has.
fn texts<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter().for_each(|x| texts(x, out)),
        Value::Object(o) => {
            for (k, x) in o {
                if !skipped(k) {
                    texts(x, out);
                }
            }
        }
        _ => {}
    }
}

/// Texts longer than this are tokenized a piece at a time (cut before a
/// whitespace near the end of the piece where there is one): the
/// tokenizer's work space grows with the longest piece it is given (a
/// multiple of it), so a string of megabytes would cost hundreds of
/// megabytes at once. Exact but for a token at a cut that falls inside
/// one (at most one per piece of a long string).
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
    let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(body) else {
        return (estimate, Counted::Estimate);
    };
    let mut out = Vec::new();
    let mut items = 0u64;
    for field in PROMPT_FIELDS {
        let Some(v) = doc.get(field) else {
            continue;
        };
        if matches!(field, "messages" | "input") {
            if let Value::Array(a) = v {
                items += a.len() as u64;
            }
        }
        texts(v, &mut out);
    }
    let mut text = 0u64;
    for t in &out {
        if text > limit {
            break;
        }
        text += count_text(bpe, t, limit - text);
    }
    let overhead = match endpoint {
        Endpoint::ChatCompletions | Endpoint::Responses => {
            items.saturating_mul(PER_MESSAGE) + REPLY_PRIMING
        }
        _ => 0,
    };
    (text + overhead, Counted::Tokenizer)
}

/// Whether [`check_context`] counts a body of `body_len` bytes with
/// `messages` messages (the bound without counting does not show that it
/// fits): the count parses the body into a `serde_json::Value` and runs
/// the tokenizer, memory the caller may want to charge first.
pub fn counts(body_len: usize, messages: u64, window: u64, output: u64) -> bool {
    bound(body_len, messages, output) > window
}

/// A prompt's tokens can be no more than this: every token covers a byte
/// at least.
fn bound(body_len: usize, messages: u64, output: u64) -> u64 {
    (body_len as u64)
        .saturating_add(messages.saturating_mul(PER_MESSAGE) + REPLY_PRIMING)
        .saturating_add(output)
}

/// What the tokenizer may hold at once besides the tree: its work space
/// for one [`PIECE`] (a multiple of it) and the tokens of one piece.
pub const COUNT_WORK_BYTES: u64 = 64 * PIECE as u64;

/// The context guard for one call: `window` is the model's, `output` the
/// call's output limit per completion (its `max_tokens`, the agent's
/// inserted limit, or the default output), `estimate` the body's
/// length-based estimate and `messages` its message count. Counts only
/// when the cheap bound does not already show the call fits.
pub fn check_context(
    endpoint: Endpoint,
    model: &str,
    body: &[u8],
    estimate: u64,
    messages: u64,
    window: u64,
    output: u64,
) -> Result<(), Deny> {
    // Every token covers a byte at least, and the estimate is below the
    // body's length: this bound fits, so the count would.
    if bound(body.len(), messages, output) <= window {
        return Ok(());
    }
    let limit = window.saturating_sub(output);
    let (prompt, how) = count_prompt_until(endpoint, model, body, estimate, limit);
    if prompt.saturating_add(output) <= window {
        return Ok(());
    }
    Err(Deny::new(
        DenyCode::ContextWindowExceeded,
        format!(
            "the prompt ({prompt} tokens, {}) plus the output limit ({output} tokens) is {} tokens: \
             more than `{}`'s context window of {window} tokens",
            how.as_str(),
            prompt.saturating_add(output),
            crate::clip(model, 200),
        ),
    )
    .never_retryable())
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
        let fits = check_context(
            Endpoint::ChatCompletions,
            "gpt-4o",
            &body,
            1,
            2,
            n + 100,
            100,
        );
        assert!(fits.is_ok());
        let d = check_context(
            Endpoint::ChatCompletions,
            "gpt-4o",
            &body,
            1,
            2,
            n + 99,
            100,
        )
        .unwrap_err();
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
        let d = check_context(Endpoint::Messages, "claude-x", &body, 5000, 2, 5000, 1).unwrap_err();
        assert!(
            d.message.contains("(5000 tokens, estimated)"),
            "{}",
            d.message
        );
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
