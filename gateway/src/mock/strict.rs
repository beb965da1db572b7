//! The mock's strict mode: output limits refused as the real providers
//! refuse them, with their status and error bodies, so tests can show that
//! what the gateway forwards is accepted upstream.
//!
//! - OpenAI's reasoning models (`o1`, `o3`, `o4`, `gpt-5` families) on chat
//!   completions: `max_tokens` is refused with OpenAI's exact 400
//!   (`unsupported_parameter`); they read `max_completion_tokens`.
//! - A limit above the model's output maximum (the table below, or
//!   `x-mock-max-output`): 400 in the provider's words (OpenAI's
//!   `invalid_value` naming the field, Anthropic's `max_tokens: N > M`).
//! - Anthropic Messages without `max_tokens`: 400 `Field required`.

use super::responses::Endpoint;
use loopgate_policy::output::openai_needs_max_completion_tokens;
use serde_json::{json, Value};

/// Output maxima (tokens per completion) of well-known models, by name
/// prefix; the longest matching prefix wins. As the providers document
/// them; a model not listed has no maximum here.
const MAX_OUTPUT: [(&str, u64); 16] = [
    ("gpt-4o", 16_384),
    ("gpt-4o-mini", 16_384),
    ("gpt-4.1", 32_768),
    ("gpt-5", 128_000),
    ("o1", 100_000),
    ("o1-mini", 65_536),
    ("o3", 100_000),
    ("o3-mini", 100_000),
    ("o4-mini", 100_000),
    ("claude-3-5-haiku", 8_192),
    ("claude-3-5-sonnet", 8_192),
    ("claude-3-7-sonnet", 64_000),
    ("claude-sonnet-4", 64_000),
    ("claude-opus-4", 32_000),
    ("claude-haiku-4", 64_000),
    ("mock-", 4_096),
];

fn table_max(model: &str) -> Option<u64> {
    MAX_OUTPUT
        .iter()
        .filter(|(p, _)| model.starts_with(p))
        .max_by_key(|(p, _)| p.len())
        .map(|&(_, m)| m)
}

/// The provider's refusal of `body` on `endpoint`, if it would refuse it:
/// status and error body. `max_output` overrides the table for every model.
pub fn refusal(endpoint: Endpoint, body: &Value, max_output: Option<u64>) -> Option<(u16, Value)> {
    let model = body.get("model").and_then(Value::as_str).unwrap_or("");
    let set = |f: &str| body.get(f).filter(|v| !v.is_null());
    if endpoint == Endpoint::ChatCompletions
        && openai_needs_max_completion_tokens(model)
        && set("max_tokens").is_some()
    {
        return Some((
            400,
            json!({"error": {
                "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
                "type": "invalid_request_error",
                "param": "max_tokens",
                "code": "unsupported_parameter"
            }}),
        ));
    }
    if endpoint == Endpoint::Messages && set("max_tokens").is_none() {
        return Some((400, anthropic_error("max_tokens: Field required")));
    }
    let max = max_output.or_else(|| table_max(model))?;
    let fields: &[&str] = match endpoint {
        Endpoint::ChatCompletions => &["max_tokens", "max_completion_tokens"],
        Endpoint::Completions | Endpoint::Messages => &["max_tokens"],
        Endpoint::Responses => &["max_output_tokens"],
        Endpoint::Embeddings => &[],
    };
    let (field, asked) = fields
        .iter()
        .find_map(|f| Some((*f, set(f)?.as_u64()?)).filter(|(_, v)| *v > max))?;
    if endpoint == Endpoint::Messages {
        return Some((
            400,
            anthropic_error(&format!(
                "max_tokens: {asked} > {max}, which is the maximum allowed number of output tokens for {model}"
            )),
        ));
    }
    Some((
        400,
        json!({"error": {
            "message": format!("{field} is too large: {asked}. This model supports at most {max} completion tokens, whereas you provided {asked}."),
            "type": "invalid_request_error",
            "param": field,
            "code": "invalid_value"
        }}),
    ))
}

fn anthropic_error(message: &str) -> Value {
    json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Option<(u16, Value)> {
        refusal(Endpoint::ChatCompletions, &body, None)
    }

    #[test]
    fn reasoning_models_refuse_max_tokens_with_openais_exact_body() {
        for model in ["o3-mini", "o4-mini", "gpt-5-mini", "o1"] {
            let (status, body) = chat(json!({"model": model, "max_tokens": 100})).unwrap();
            assert_eq!(status, 400);
            assert_eq!(
                body.to_string(),
                r#"{"error":{"code":"unsupported_parameter","message":"Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.","param":"max_tokens","type":"invalid_request_error"}}"#
            );
            assert_eq!(
                chat(json!({"model": model, "max_completion_tokens": 100})),
                None
            );
        }
        assert_eq!(chat(json!({"model": "gpt-4o", "max_tokens": 100})), None);
    }

    #[test]
    fn limits_above_the_models_maximum_are_refused_in_the_providers_words() {
        let (s, b) = chat(json!({"model": "gpt-4o-mini", "max_tokens": 16_385})).unwrap();
        assert_eq!((s, b["error"]["param"].as_str()), (400, Some("max_tokens")));
        assert_eq!(b["error"]["code"], "invalid_value");
        assert_eq!(
            chat(json!({"model": "gpt-4o-mini", "max_tokens": 16_384})),
            None
        );
        let (_, b) = chat(json!({"model": "o3-mini", "max_completion_tokens": 100_001})).unwrap();
        assert_eq!(b["error"]["param"], "max_completion_tokens");
        let (_, b) = refusal(
            Endpoint::Messages,
            &json!({"model": "claude-3-5-haiku-latest", "max_tokens": 9000}),
            None,
        )
        .unwrap();
        assert_eq!(
            b["error"]["message"],
            "max_tokens: 9000 > 8192, which is the maximum allowed number of output tokens for claude-3-5-haiku-latest"
        );
        let (_, b) = refusal(
            Endpoint::Responses,
            &json!({"model": "anything", "max_output_tokens": 11}),
            Some(10),
        )
        .unwrap();
        assert_eq!(b["error"]["param"], "max_output_tokens");
        // Unknown models have no maximum unless one is given.
        assert_eq!(
            chat(json!({"model": "llama3", "max_tokens": 1_000_000})),
            None
        );
    }

    #[test]
    fn messages_need_max_tokens() {
        let (s, b) = refusal(
            Endpoint::Messages,
            &json!({"model": "claude-3-5-haiku"}),
            None,
        )
        .unwrap();
        assert_eq!((s, b["type"].as_str()), (400, Some("error")));
        assert_eq!(b["error"]["message"], "max_tokens: Field required");
    }
}
