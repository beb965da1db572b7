//! Every error Loopgate itself answers with, mapped in one place to an HTTP
//! status, a stable code, an OpenAI-style error type and a retry hint.
//!
//! It is a `std::error::Error`, so a hook that fails for a reason it knows
//! (an open circuit, a stream cut by its budget) returns it as the cause of
//! its Pingora error, and `fail_to_proxy` answers with it (see
//! [`GatewayError::cause_of`]). How it is written on the wire (OpenAI JSON,
//! JSON-RPC, an SSE error event) is `proxy::respond`'s, one renderer each.

use loopgate_policy::{Deny, DenyCode};

/// A refusal that clears only after longer than this (a day's budget) is
/// not worth a client's own retry. Rate limits (a minute's window, whose
/// `Retry-After` may round up past the 60 s the openai and anthropic SDKs
/// wait out) stay retryable.
pub const LONG_WAIT_SECS: u64 = 300;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayError {
    /// Admission refused the request.
    Denied(Deny),
    /// The request could not be read (broken framing, client went away).
    BadRequest(String),
    /// The agent did not deliver its request body in time
    /// (`listen.connections.body_timeout_ms`): answered 408, closed.
    RequestTimeout(String),
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
    /// The path exists but not for this HTTP method: answered 405 with
    /// `Allow` (the methods that path takes, for this agent).
    MethodNotAllowed { allow: String, message: String },
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code(), self.message())
    }
}

impl std::error::Error for GatewayError {}

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
            GatewayError::RequestTimeout(_) => 408,
            GatewayError::CircuitOpen { .. }
            | GatewayError::BreakerUnavailable
            | GatewayError::Overloaded(_) => 503,
            GatewayError::Internal(_) => 500,
            GatewayError::MethodNotAllowed { .. } => 405,
        }
    }

    /// The gateway's own error a Pingora error carries as its cause (at
    /// any depth: Pingora wraps errors it passes on), if any.
    pub fn cause_of(e: &pingora::Error) -> Option<&GatewayError> {
        let mut cause = e.cause.as_deref();
        // Bounded: a cause chain is a few links long.
        for _ in 0..8 {
            let c = cause?;
            if let Some(g) = c.downcast_ref::<GatewayError>() {
                return Some(g);
            }
            let inner = c
                .downcast_ref::<Box<pingora::Error>>()
                .map(|b| &**b)
                .or_else(|| c.downcast_ref::<pingora::Error>())?;
            cause = inner.cause.as_deref();
        }
        None
    }

    /// Stable machine-readable code; also the metrics label.
    pub fn code(&self) -> &'static str {
        match self {
            GatewayError::Denied(d) => d.code.as_str(),
            GatewayError::UnsupportedEndpoint { .. } => "unsupported_endpoint",
            GatewayError::BadRequest(_) => "bad_request",
            GatewayError::RequestTimeout(_) => "request_timeout",
            GatewayError::UpstreamUnreachable(_) => "upstream_unreachable",
            GatewayError::UpstreamTimeout(_) => "upstream_timeout",
            GatewayError::UpstreamFailed(_) => "upstream_error",
            GatewayError::CircuitOpen { .. } => "circuit_open",
            GatewayError::BreakerUnavailable => "breaker_unavailable",
            GatewayError::Overloaded(_) => "gateway_overloaded",
            GatewayError::Internal(_) => "internal_error",
            GatewayError::MethodNotAllowed { .. } => DenyCode::MethodNotAllowed.as_str(),
        }
    }

    pub fn error_type(&self) -> &'static str {
        match self {
            GatewayError::Denied(d) => d.code.error_type(),
            GatewayError::UnsupportedEndpoint { .. }
            | GatewayError::BadRequest(_)
            | GatewayError::RequestTimeout(_) => "invalid_request_error",
            GatewayError::UpstreamUnreachable(_)
            | GatewayError::UpstreamTimeout(_)
            | GatewayError::UpstreamFailed(_)
            | GatewayError::CircuitOpen { .. } => "upstream_error",
            GatewayError::BreakerUnavailable
            | GatewayError::Overloaded(_)
            | GatewayError::Internal(_) => "gateway_error",
            GatewayError::MethodNotAllowed { .. } => DenyCode::MethodNotAllowed.error_type(),
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

    /// Whether a client's own retry (the official SDKs retry 408, 409, 429
    /// and 5xx by themselves, waiting out `Retry-After`) can succeed soon
    /// enough to be worth it: a refusal that waiting cannot fix, or one
    /// that clears only after [`LONG_WAIT_SECS`] (a day's budget), is
    /// answered with `x-should-retry: false`, which those SDKs obey.
    pub fn worth_retrying(&self) -> bool {
        self.retryable() && self.retry_after_secs().is_none_or(|s| s <= LONG_WAIT_SECS)
    }

    pub fn retryable(&self) -> bool {
        match self {
            GatewayError::Denied(d) => d.retryable,
            GatewayError::UnsupportedEndpoint { .. }
            | GatewayError::BadRequest(_)
            | GatewayError::MethodNotAllowed { .. } => false,
            GatewayError::UpstreamUnreachable(_)
            | GatewayError::UpstreamTimeout(_)
            | GatewayError::UpstreamFailed(_)
            | GatewayError::CircuitOpen { .. }
            | GatewayError::BreakerUnavailable
            | GatewayError::Overloaded(_)
            | GatewayError::Internal(_)
            | GatewayError::RequestTimeout(_) => true,
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
            | GatewayError::RequestTimeout(m)
            | GatewayError::UpstreamUnreachable(m)
            | GatewayError::UpstreamTimeout(m)
            | GatewayError::UpstreamFailed(m)
            | GatewayError::Overloaded(m)
            | GatewayError::Internal(m)
            | GatewayError::MethodNotAllowed { message: m, .. } => m.clone(),
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

    /// Whether the upstream itself failed (as opposed to a gateway decision).
    pub fn upstream_failed(&self) -> bool {
        matches!(
            self,
            GatewayError::UpstreamUnreachable(_)
                | GatewayError::UpstreamTimeout(_)
                | GatewayError::UpstreamFailed(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn only_refusals_that_clear_soon_are_worth_a_clients_retry() {
        use std::time::Duration;
        let loop_deny = Deny::new(DenyCode::LoopDetected, "x")
            .retry_after(Duration::from_secs(30))
            .never_retryable();
        let day = Deny::new(DenyCode::BudgetExceeded, "x").retry_after(Duration::from_secs(86_000));
        let minute = Deny::new(DenyCode::RateLimited, "x").retry_after(Duration::from_secs(61));
        for (e, worth) in [
            (GatewayError::Denied(loop_deny), false),
            (
                GatewayError::Denied(Deny::new(DenyCode::TaskStopped, "x")),
                false,
            ),
            (
                GatewayError::Denied(Deny::new(DenyCode::BlockedPhrase, "x")),
                false,
            ),
            (GatewayError::Denied(day), false),
            (GatewayError::Denied(minute), true),
            (GatewayError::Overloaded("x".into()), true),
            (
                GatewayError::CircuitOpen {
                    provider: "p".into(),
                    retry_after: Duration::from_secs(5),
                },
                true,
            ),
            (GatewayError::BadRequest("x".into()), false),
        ] {
            assert_eq!(e.worth_retrying(), worth, "{e}");
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
