//! What a failed hook or upstream exchange means: the gateway's own error
//! kinds (carried through Pingora as error types, with the
//! [`GatewayError`] to answer as their cause), and the mapping of
//! Pingora's transport errors to the error Loopgate answers with.

use crate::error::GatewayError;
use pingora::{Error, ErrorSource, ErrorType};

/// An upstream answer (5xx, 429, unreadable) discarded for a fallback.
pub const FALLBACK: ErrorType = ErrorType::Custom("fallback");

/// The gateway failed to build what it sends (an upstream request, a
/// response header): its own fault, never the provider's, so no breaker
/// counts it and no other target is tried.
pub const GATEWAY_FAULT: ErrorType = ErrorType::Custom("gateway_fault");

/// An upstream answer the gateway could not read, on the last attempt:
/// answered 502.
pub const UNREADABLE: ErrorType = ErrorType::Custom("unreadable_answer");

/// A stream cut because it outgrew its token budget.
pub const BUDGET_CUT: ErrorType = ErrorType::Custom("budget_cut");

/// The provider exceeded its total timeout.
pub const TOTAL_TIMEOUT: ErrorType = ErrorType::Custom("total_timeout");

/// A body streamed upstream missed its deadline (`BodyDeadline`): the
/// agent's slowness, answered 408, never the provider's failure.
pub const LATE_BODY: ErrorType = ErrorType::Custom("late_body");

/// No attempt was made or is left (circuit open, budget spent, no target).
pub const REFUSED: ErrorType = ErrorType::Custom("not_forwarded");

/// A Pingora error of type `etype` whose cause is the answer.
pub fn answer(etype: ErrorType, e: GatewayError) -> Box<Error> {
    let why = e.code();
    Error::because(etype, why, e)
}

/// Turns a hook's own failure into [`GATEWAY_FAULT`] (answered 500
/// `internal_error`), unless it already says what it is.
pub fn gateway_fault(request_id: &str, what: &str, e: Box<Error>) -> Box<Error> {
    if [&GATEWAY_FAULT, &FALLBACK, &UNREADABLE].contains(&e.etype())
        || GatewayError::cause_of(&e).is_some()
    {
        return e;
    }
    log::warn!("request {request_id}: could not build {what}: {e}");
    answer(
        GATEWAY_FAULT,
        GatewayError::Internal(format!("could not build {what}")),
    )
}

/// Whether a connect failure was the gateway's own: Pingora reports a local
/// socket it could not create or bind (out of descriptors, ephemeral ports,
/// buffers) as `SocketError`/`BindError`, wrapped in `InternalError` by its
/// connector. The provider was never reached, so it is not its failure.
pub fn local_shortage(e: &Error) -> bool {
    let local = |t: &ErrorType| matches!(t, ErrorType::SocketError | ErrorType::BindError);
    local(e.etype())
        || (e.etype() == &ErrorType::InternalError
            && e.cause
                .as_ref()
                .and_then(|c| {
                    // Boxed errors become causes boxed once more.
                    c.downcast_ref::<Box<Error>>()
                        .map(|b| &**b)
                        .or_else(|| c.downcast_ref::<Error>())
                })
                .is_some_and(|c| local(c.etype())))
}

/// Maps a Pingora transport error to the error Loopgate answers with.
pub fn map_transport_error(e: &Error, provider: &str) -> GatewayError {
    use ErrorType::*;
    if local_shortage(e) {
        return GatewayError::Overloaded(
            "the gateway has no free connection to the provider right now (out of local sockets); retry shortly".into(),
        );
    }
    if *e.esource() == ErrorSource::Downstream && e.etype() == &ReadTimedout {
        // The agent's body stopped short of its deadline (see
        // `BodyDeadline`): Pingora's read of it timed out.
        return GatewayError::RequestTimeout("the request body did not arrive in time".into());
    }
    match e.etype() {
        ConnectTimedout | ConnectRefused | ConnectNoRoute | TLSWantX509Lookup
        | TLSHandshakeFailure | TLSHandshakeTimedout | InvalidCert | HandshakeError
        | ConnectError | ConnectProxyFailure => GatewayError::UpstreamUnreachable(format!(
            "could not connect to provider `{provider}` ({})",
            e.etype().as_str()
        )),
        ReadTimedout | WriteTimedout => {
            GatewayError::UpstreamTimeout(format!("provider `{provider}` did not answer in time"))
        }
        _ => match e.esource() {
            ErrorSource::Downstream => GatewayError::BadRequest(format!(
                "request could not be read ({})",
                e.etype().as_str()
            )),
            ErrorSource::Upstream => GatewayError::UpstreamFailed(format!(
                "the exchange with provider `{provider}` failed ({})",
                e.etype().as_str()
            )),
            ErrorSource::Internal | ErrorSource::Unset => {
                GatewayError::Internal(format!("gateway error ({})", e.etype().as_str()))
            }
        },
    }
}

/// The agent's side broke (it went away, or could not be written to).
pub fn dead_client(e: &Error) -> bool {
    *e.esource() == ErrorSource::Downstream
        && matches!(
            e.etype(),
            ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_socket_shortages_are_told_from_provider_failures() {
        let emfile = || std::io::Error::from_raw_os_error(24);
        // As Pingora's connector reports a socket it could not create.
        let socket = Error::because(ErrorType::SocketError, "failed to create socket", emfile());
        let wrapped = Error::because(ErrorType::InternalError, "Fail to connect to x", socket);
        assert!(local_shortage(&wrapped));
        // Out of ephemeral ports.
        let ports = Error::because(ErrorType::BindError, "Fail to connect to x", emfile());
        assert!(local_shortage(&ports));
        // The provider's side: refused, timed out, unreachable.
        for t in [
            ErrorType::ConnectRefused,
            ErrorType::ConnectTimedout,
            ErrorType::ConnectNoRoute,
            ErrorType::ConnectError,
        ] {
            assert!(!local_shortage(&Error::new(t)));
        }
        // Some other internal error is not a socket shortage.
        let other = Error::because(
            ErrorType::InternalError,
            "x",
            Error::new(ErrorType::ConnectError),
        );
        assert!(!local_shortage(&other));
        assert!(!local_shortage(&Error::new(ErrorType::InternalError)));
        // The mapping every hook answers with follows the same line.
        assert_eq!(
            map_transport_error(&wrapped, "p").code(),
            "gateway_overloaded"
        );
        assert_eq!(
            map_transport_error(&ports, "p").code(),
            "gateway_overloaded"
        );
        let refused = Error::new(ErrorType::ConnectRefused);
        assert_eq!(
            map_transport_error(&refused, "p").code(),
            "upstream_unreachable"
        );
    }

    #[test]
    fn the_answer_travels_as_the_cause_through_wrapping() {
        let e = answer(BUDGET_CUT, GatewayError::Internal("x".into()));
        assert_eq!(
            GatewayError::cause_of(&e).map(|g| g.code()),
            Some("internal_error")
        );
        let wrapped = Error::because(ErrorType::InternalError, "ctx", e);
        assert_eq!(
            GatewayError::cause_of(&wrapped).map(|g| g.code()),
            Some("internal_error")
        );
        assert!(GatewayError::cause_of(&Error::new(ErrorType::ConnectRefused)).is_none());
        // A fault that already names its answer keeps it.
        let known = answer(REFUSED, GatewayError::BreakerUnavailable);
        let kept = gateway_fault("r", "x", known);
        assert_eq!(kept.etype(), &REFUSED);
    }
}
