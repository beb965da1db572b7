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

/// The prompt tokens of `body` (a JSON object) for `model`, with the
/// tokenizer where the model has one, else `estimate`.
pub fn count_prompt(endpoint: Endpoint, model: &str, body: &[u8], estimate: u64) -> (u64, Counted) {
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
    let text: u64 = out
        .iter()
        .map(|t| bpe.encode_ordinary(t).len() as u64)
        .sum();
    let overhead = match endpoint {
        Endpoint::ChatCompletions | Endpoint::Responses => {
            items.saturating_mul(PER_MESSAGE) + REPLY_PRIMING
        }
        _ => 0,
    };
    (text + overhead, Counted::Tokenizer)
}

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
    let bound = (body.len() as u64)
        .saturating_add(messages.saturating_mul(PER_MESSAGE) + REPLY_PRIMING)
        .saturating_add(output);
    if bound <= window {
        return Ok(());
    }
    let (prompt, how) = count_prompt(endpoint, model, body, estimate);
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
