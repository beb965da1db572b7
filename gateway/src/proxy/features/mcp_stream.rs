//! The MCP server's own stream (`GET /mcp/{server}`, server to client,
//! allowed since the 2025-06-18 revision): its idle policy.
//!
//! The official SDKs open it right after `initialize` and leave it silent
//! until the server has something to say, so silence is its normal state,
//! not a stalled provider. It therefore has a limit of its own
//! (`stream_idle_ms`, in place of `timeouts.read_ms`; every event the
//! server sends, comments and pings included, starts it again) and no
//! total timeout. Its breaker ticket is settled when the server answers
//! the GET (a 2xx is the server up), so what the stream does later never
//! counts, and a long-lived stream never holds a half-open probe:
//!
//! - silent for `stream_idle_ms`: ended cleanly (the last chunk, no error
//!   event; an SDK client opens a new one), logged as allowed;
//! - the agent left: Pingora sees the close and drops the upstream
//!   connection at once, counted by nothing.
//!
//! The wait for the stream's header is bounded by the idle limit too: a
//! peer has one read timeout in Pingora 0.9.1, set before connecting. And
//! while that header is awaited Pingora does not watch the agent's side,
//! so an agent that leaves before the server answers its GET holds the
//! upstream connection until the server answers or the limit passes (the
//! SDK servers answer a GET at once).

use super::{Admission, Feature};
use crate::proxy::ctx::Plan;
use std::time::Duration;

/// An admitted GET on an MCP server: the stream's idle limit, and whether
/// it ended by it.
#[derive(Debug)]
pub struct ServerStream {
    /// The upstream read timeout of this exchange.
    pub idle: Duration,
    /// The stream was silent for `idle` and is ended cleanly.
    idle_ended: bool,
}

impl ServerStream {
    /// An upstream read timed out after the answer started: the stream
    /// was idle (the only reads left are the body's). Marks it.
    pub fn idled(&mut self) {
        self.idle_ended = true;
    }

    /// Whether the stream ended by its idle limit (answered with a clean
    /// end of the body, not a failure).
    pub fn idle_ended(&self) -> bool {
        self.idle_ended
    }
}

impl Feature for ServerStream {
    fn arm(adm: &Admission) -> Option<Self> {
        match &adm.plan {
            Plan::Mcp(p) => p.call.stream_idle.map(|idle| ServerStream {
                idle,
                idle_ended: false,
            }),
            _ => None,
        }
    }
}
