//! Every error Loopgate itself answers with, mapped in one place to an HTTP
//! status, a stable code, an OpenAI-style error type and a retry hint.
//!
//! The body is OpenAI's error shape, extended:
//! `{"error":{"type":..,"code":..,"message":..,"request_id":..,"retryable":..}}`
//! and the response carries `x-loopgate-error: <code>`, so an agent can tell a
//! gateway decision from a provider's own error.

use loopgate_policy::{Deny, DenyCode};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayError {
    /// Admission refused the request.
    Denied(Deny),
    /// The request could not be read (broken framing, client went away).
    BadRequest(String),
    /// The routed provider does not speak this endpoint's API.
    UnsupportedEndpoint { model: String },
    /// No connection could be made (refused, unreachable, TLS, unresolved).
    UpstreamUnreachable(String),
    /// The provider did not answer in time.
    UpstreamTimeout(String),
    /// The exchange with the provider failed after connecting.
    UpstreamFailed(String),
    /// Every target's circuit is open: refused at once, no upstream call.
    CircuitOpen {
        provider: String,
        retry_after: std::time::Duration,
    },
    /// Breaker state could not be read: refused (fail closed).
    BreakerUnavailable,
    /// The gateway ran out of its own sockets (descriptors, local ports):
    /// no provider was tried, and no breaker counts it.
    Overloaded(String),
    /// Something inside the gateway went wrong; the request is refused.
    Internal(String),
}

impl From<Deny> for GatewayError {
    fn from(d: Deny) -> Self {
        GatewayError::Denied(d)
    }
}

impl GatewayError {
    pub fn status(&self) -> u16 {
        match self {
            GatewayError::Denied(d) => d.code.status(),
            GatewayError::UnsupportedEndpoint { .. } | GatewayError::BadRequest(_) => 400,
            GatewayError::UpstreamUnreachable(_) | GatewayError::UpstreamFailed(_) => 502,
            GatewayError::UpstreamTimeout(_) => 504,
            GatewayError::CircuitOpen { .. }
            | GatewayError::BreakerUnavailable
            | GatewayError::Overloaded(_) => 503,
            GatewayError::Internal(_) => 500,
        }
    }

    /// Stable machine-readable code; also the metrics label.
    pub fn code(&self) -> &'static str {
        match self {
            GatewayError::Denied(d) => d.code.as_str(),
            GatewayError::UnsupportedEndpoint { .. } => "unsupported_endpoint",
            GatewayError::BadRequest(_) => "bad_request",
            GatewayError::UpstreamUnreachable(_) => "upstream_unreachable",
            GatewayError::UpstreamTimeout(_) => "upstream_timeout",
            GatewayError::UpstreamFailed(_) => "upstream_error",
            GatewayError::CircuitOpen { .. } => "circuit_open",
            GatewayError::BreakerUnavailable => "breaker_unavailable",
            GatewayError::Overloaded(_) => "gateway_overloaded",
            GatewayError::Internal(_) => "internal_error",
        }
    }

    pub fn error_type(&self) -> &'static str {
        match self {
            GatewayError::Denied(d) => d.code.error_type(),
            GatewayError::UnsupportedEndpoint { .. } | GatewayError::BadRequest(_) => {
                "invalid_request_error"
            }
            GatewayError::UpstreamUnreachable(_)
            | GatewayError::UpstreamTimeout(_)
            | GatewayError::UpstreamFailed(_)
            | GatewayError::CircuitOpen { .. } => "upstream_error",
            GatewayError::BreakerUnavailable
            | GatewayError::Overloaded(_)
            | GatewayError::Internal(_) => "gateway_error",
        }
    }

    /// `Retry-After` in whole seconds, when known.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            GatewayError::Denied(d) => d.retry_after_secs(),
            GatewayError::CircuitOpen { retry_after, .. } => {
                Some(retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0))
            }
            // Sockets come back as streams end: soon, but not at once.
            GatewayError::Overloaded(_) => Some(1),
            _ => None,
        }
    }

    pub fn retryable(&self) -> bool {
        match self {
            GatewayError::Denied(d) => d.retryable,
            GatewayError::UnsupportedEndpoint { .. } | GatewayError::BadRequest(_) => false,
            GatewayError::UpstreamUnreachable(_)
            | GatewayError::UpstreamTimeout(_)
            | GatewayError::UpstreamFailed(_)
            | GatewayError::CircuitOpen { .. }
            | GatewayError::BreakerUnavailable
            | GatewayError::Overloaded(_)
            | GatewayError::Internal(_) => true,
        }
    }

    pub fn message(&self) -> String {
        match self {
            GatewayError::Denied(d) => d.message.clone(),
            GatewayError::UnsupportedEndpoint { model } => {
                format!(
                    "model `{model}` is served by a provider that does not support this endpoint"
                )
            }
            GatewayError::BadRequest(m)
            | GatewayError::UpstreamUnreachable(m)
            | GatewayError::UpstreamTimeout(m)
            | GatewayError::UpstreamFailed(m)
            | GatewayError::Overloaded(m)
            | GatewayError::Internal(m) => m.clone(),
            GatewayError::CircuitOpen {
                provider,
                retry_after,
            } => format!(
                "the circuit for upstream `{provider}` is open; retry in {} s",
                retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0)
            ),
            GatewayError::BreakerUnavailable => {
                "circuit breaker state is unavailable; refusing to forward".to_string()
            }
        }
    }

    pub fn deny_code(&self) -> Option<DenyCode> {
        match self {
            GatewayError::Denied(d) => Some(d.code),
            _ => None,
        }
    }

    /// Whether the upstream itself failed (as opposed to a gateway decision).
    pub fn upstream_failed(&self) -> bool {
        matches!(
            self,
            GatewayError::UpstreamUnreachable(_)
                | GatewayError::UpstreamTimeout(_)
                | GatewayError::UpstreamFailed(_)
        )
    }

    /// The JSON body; for tool calls it also says whether the tool broke
    /// (`upstream_failed: true`) or the gateway refused, so an agent stops
    /// retrying into a wall.
    pub fn body_for(&self, request_id: &str, tool_call: bool) -> Vec<u8> {
        let mut v = serde_json::json!({
            "error": {
                "type": self.error_type(),
                "code": self.code(),
                "message": self.message(),
                "request_id": request_id,
                "retryable": self.retryable(),
            }
        });
        if tool_call {
            v["error"]["upstream_failed"] = serde_json::Value::Bool(self.upstream_failed());
        }
        serde_json::to_vec(&v).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_the_documented_shape() {
        let e = GatewayError::Denied(Deny::new(DenyCode::ModelNotAllowed, "no \"x\""));
        let v: serde_json::Value = serde_json::from_slice(&e.body_for("rid-1", false)).unwrap();
        assert_eq!(v["error"]["code"], "model_not_allowed");
        assert_eq!(v["error"]["type"], "permission_error");
        assert_eq!(v["error"]["message"], "no \"x\"");
        assert_eq!(v["error"]["request_id"], "rid-1");
        assert_eq!(v["error"]["retryable"], false);
        assert_eq!(e.status(), 403);
    }

    #[test]
    fn upstream_errors_are_retryable_gateway_statuses() {
        for (e, s) in [
            (GatewayError::UpstreamUnreachable("x".into()), 502),
            (GatewayError::UpstreamTimeout("x".into()), 504),
            (GatewayError::UpstreamFailed("x".into()), 502),
            (GatewayError::Internal("x".into()), 500),
        ] {
            assert_eq!(e.status(), s);
            assert!(e.retryable());
        }
    }

    #[test]
    fn the_gateways_own_shortage_is_a_retryable_503_not_an_upstream_failure() {
        let e = GatewayError::Overloaded("out of sockets".into());
        assert_eq!((e.status(), e.code()), (503, "gateway_overloaded"));
        assert_eq!(e.error_type(), "gateway_error");
        assert_eq!(e.retry_after_secs(), Some(1));
        assert!(e.retryable());
        assert!(!e.upstream_failed());
    }
}
