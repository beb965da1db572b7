//! An upstream error (status and body, in the provider's family) rendered
//! in the agent's family, with the same status.
//!
//! OpenAI: `{"error": {"message", "type", "code", "param"}}`.
//! Anthropic: `{"type": "error", "error": {"type", "message"}}`.
//! The provider's message is kept (it is the provider's answer to the
//! agent's own request, as on a pass-through route); the type is the
//! agent family's type for the status, and an OpenAI agent's `code` keeps
//! the provider's type (e.g. `overloaded_error`) so nothing is lost.

use crate::Family;
use serde_json::{json, Value};

/// Anthropic's error type for an HTTP status.
pub fn anthropic_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// OpenAI's error type for an HTTP status.
pub fn openai_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    }
}

/// The message and type of an error body of either family (or neither).
fn read(body: &[u8]) -> (Option<String>, Option<String>) {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return (None, None);
    };
    let e = v.get("error");
    let s = |k: &str| {
        e.and_then(|e| e.get(k))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    (s("message"), s("type"))
}

/// The error body an agent of family `agent` gets for an upstream answer
/// of `status` with `body`.
pub fn render(agent: Family, status: u16, body: &[u8]) -> Vec<u8> {
    let (message, upstream_type) = read(body);
    let message = message.unwrap_or_else(|| format!("the provider answered status {status}"));
    error_value(agent, status, &message, upstream_type.as_deref())
        .to_string()
        .into_bytes()
}

fn error_value(agent: Family, status: u16, message: &str, upstream_type: Option<&str>) -> Value {
    match agent {
        Family::Anthropic => json!({
            "type": "error",
            "error": {"type": anthropic_type(status), "message": message},
        }),
        Family::OpenAi => json!({
            "error": {
                "message": message,
                "type": openai_type(status),
                "param": null,
                "code": upstream_type.map_or_else(|| Value::String(status.to_string()), |t| Value::String(t.to_owned())),
            }
        }),
    }
}

/// The SSE event that ends a stream with an error, in `agent`'s family:
/// Anthropic's `event: error`, or an OpenAI chunk holding `error` (the
/// OpenAI SDKs raise on it). `status` picks the type (500 for a stream
/// that broke).
pub fn sse_event(
    agent: Family,
    status: u16,
    message: &str,
    upstream_type: Option<&str>,
) -> Vec<u8> {
    let v = error_value(agent, status, message, upstream_type);
    match agent {
        Family::Anthropic => format!("event: error\ndata: {v}\n\n").into_bytes(),
        Family::OpenAi => format!("data: {v}\n\n").into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anthropic_overload_reaches_an_openai_agent_with_its_status() {
        let body =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let v: Value = serde_json::from_slice(&render(Family::OpenAi, 529, body)).unwrap();
        assert_eq!(
            v,
            json!({"error": {"message": "Overloaded", "type": "server_error", "param": null,
                             "code": "overloaded_error"}})
        );
    }

    #[test]
    fn an_openai_rate_limit_reaches_an_anthropic_agent() {
        let body = br#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
        let v: Value = serde_json::from_slice(&render(Family::Anthropic, 429, body)).unwrap();
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "Rate limit reached"}})
        );
    }

    #[test]
    fn a_body_that_is_not_an_error_gets_a_message_of_its_own() {
        let v: Value =
            serde_json::from_slice(&render(Family::Anthropic, 502, b"<html>bad gateway")).unwrap();
        assert_eq!(v["error"]["type"], "api_error");
        assert_eq!(v["error"]["message"], "the provider answered status 502");
    }
}
