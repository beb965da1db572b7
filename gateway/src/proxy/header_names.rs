//! One reading of header names in both directions: `_` folded into `-`.
//!
//! HTTP header names are compared case-insensitively but `_` and `-` are
//! different characters, so `x_agent_task_id` is not `x-agent-task-id` to
//! the gateway. Readers on either side fold them together (CGI and WSGI
//! turn both into `HTTP_X_AGENT_TASK_ID`, as do some frameworks and
//! proxies): an upstream behind such a reader would take an agent's
//! `x_agent_task_id` or `x_api_key` for the header the gateway judged (or
//! stripped), and an agent's framework would take an upstream's
//! `x-loopgate_cost_usd` for the gateway's own. So an agent header whose
//! folded name is one the gateway reads, sets or strips is refused (400
//! `invalid_header`: two readers could read it differently), and an
//! upstream answer's header whose folded name is one the gateway speaks in
//! is removed with the gateway's own names ([`forged_answer_header`]).
//!
//! Cost: only names that hold `_` are looked at (ordinary clients send
//! none), one byte search per name.

use crate::error::GatewayError;
use loopgate_policy::{clip, Deny, DenyCode};

/// Request headers the gateway reads, sets or strips, by folded name
/// (lower case, `-`): the agent's credentials, the task and call ids the
/// guards key on, idempotency, MCP sessions, framing, and every header
/// stripped before forwarding (`config::agents::NEVER_FORWARDED`,
/// `SCOPING_HEADERS`).
const READ: [&str; 20] = [
    "authorization",
    "x-api-key",
    "x-agent-token",
    "x-agent-task-id",
    "x-agent-call-id",
    "x-agent-tool-name",
    "idempotency-key",
    "x-request-id",
    "mcp-session-id",
    "content-length",
    "transfer-encoding",
    "content-type",
    "content-encoding",
    "host",
    "expect",
    "connection",
    "upgrade",
    "accept-encoding",
    "proxy-authorization",
    "anthropic-version",
];

/// Whether `folded` (lower case, `_` folded into `-`) names a header the
/// gateway reads, sets or strips on a request.
fn gateway_request_header(folded: &str) -> bool {
    READ.contains(&folded)
        || crate::config::runtime::NEVER_FORWARDED.contains(&folded)
        || crate::config::runtime::SCOPING_HEADERS.contains(&folded)
        || gateway_answer_header(folded)
}

/// Whether `folded` names a header the gateway speaks in on an answer.
fn gateway_answer_header(folded: &str) -> bool {
    folded.starts_with("x-loopgate-") || folded == super::respond::REQUEST_ID_HEADER
}

/// `name` lower-cased (header names are) with `_` folded into `-`, when
/// it holds a `_`.
fn folded(name: &str) -> Option<String> {
    name.as_bytes()
        .contains(&b'_')
        .then(|| name.replace('_', "-"))
}

/// Refuses a request carrying an underscore spelling of a header the
/// gateway reads (400 `invalid_header`), before anything reads it.
pub fn check_request(req: &pingora::http::RequestHeader) -> Result<(), GatewayError> {
    for name in req.headers.keys() {
        let Some(f) = folded(name.as_str()) else {
            continue;
        };
        if gateway_request_header(&f) {
            return Err(GatewayError::Denied(
                Deny::new(
                    DenyCode::InvalidHeader,
                    format!(
                        "header `{}` reads as `{}` to servers that fold `_` into `-`; \
                         send `{}` itself, or nothing",
                        clip(name.as_str(), 64),
                        clip(&f, 64),
                        clip(&f, 64)
                    ),
                )
                .never_retryable(),
            ));
        }
    }
    Ok(())
}

/// An upstream's answer header the gateway removes: its own names
/// (`x-loopgate-*`), and their spellings with `_` for `-`
/// (`x-loopgate_cost_usd`, `x_request_id`), which an agent's framework
/// that folds `_` would read as the gateway's decision.
pub fn forged_answer_header(name: &str) -> bool {
    name.starts_with("x-loopgate-") || folded(name).is_some_and(|f| gateway_answer_header(&f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn underscore_spellings_of_read_headers_are_refused() {
        for name in [
            "x_agent_task_id",
            "x-agent_task-id",
            "x_api_key",
            "idempotency_key",
            "x_forwarded_for",
            "openai_organization",
            "x_loopgate_cost_usd",
            "content_length",
        ] {
            let mut req =
                pingora::http::RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
            req.insert_header(name, "v").unwrap();
            let e = check_request(&req).unwrap_err();
            assert_eq!(e.code(), "invalid_header", "{name}");
        }
        for name in ["x_trace_tag", "x-agent-task-id", "user_agent_note"] {
            let mut req = pingora::http::RequestHeader::build("GET", b"/", None).unwrap();
            req.insert_header(name, "v").unwrap();
            assert!(check_request(&req).is_ok(), "{name}");
        }
    }

    #[test]
    fn forged_answer_headers_include_underscore_spellings() {
        for name in [
            "x-loopgate-cost-usd",
            "x-loopgate_cost_usd",
            "x_loopgate_provider",
            "x_request_id",
        ] {
            assert!(forged_answer_header(name), "{name}");
        }
        for name in ["x-request-id", "x-upstream_note", "content-type"] {
            assert!(!forged_answer_header(name), "{name}");
        }
    }
}
