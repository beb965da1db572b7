//! Bounds on request bodies held in memory while admission reads them.
//!
//! Admission reads a body whole before judging it, so a client that sends
//! slowly holds memory before any limit saw it: forty connections of one
//! agent each sending most of an 8 MB body once took the gateway from 16 MB
//! to 343 MB. Every byte read is counted here before it is kept, against the
//! agent's share and the gateway's total; a body that does not fit is
//! refused at once (429 for the agent's share: the agent is sending more
//! than it could have in flight; 503 for the total: the gateway is full).
//! A hold lives as long as the request (the body is replayed upstream from
//! memory) and gives its bytes back when dropped. While a body is judged,
//! what judging may allocate ([`JUDGING_PER_BODY_BYTE`]) is charged too.
//!
//! The charge comes before the memory: a body with a `Content-Length` is
//! charged whole (with the connection's read buffers, [`READ_BUFFERS`])
//! before its first byte is read, as that is what the gathering buffer is
//! sized to; a chunked one by the capacity its buffer grows to. Forty
//! connections of one agent each sending most of an 8 MiB body used to be
//! read piecewise until the share was full, the rest refused only then:
//! what they had read and dropped stayed with the allocator (+73 MB RSS
//! against a 16 MiB share). Now those past the share are refused before
//! anything of theirs is read.

use crate::connections::BodyDeadline;
use crate::error::GatewayError;
use loopgate_policy::{Deny, DenyCode};
use pingora_proxy::Session;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Bodies held at once by the whole gateway, by default
/// (`listen.connections.body_memory_bytes`).
pub const TOTAL_BYTES: u64 = 512 * 1024 * 1024;
/// Bodies an agent without `max_in_flight` may hold at once, in bodies of
/// its `max_body_bytes`.
pub const DEFAULT_BODIES_PER_AGENT: u64 = 16;
/// What a connection holds while its body arrives, besides the body:
/// Pingora's body read buffer (64 KiB, `BODY_BUFFER_SIZE`) and its replay
/// buffer (64 KiB, `BODY_BUF_LIMIT`). Charged from before the first read
/// until the body is whole, so connections that only trickle a body hold
/// no memory the share does not count; each body in the share has room
/// for it (see `admit::body_room`).
pub const READ_BUFFERS: u64 = 128 * 1024;

/// The gateway's count of buffered body bytes, in total and per agent.
#[derive(Debug, Default)]
pub struct BodyBuffers {
    total: AtomicU64,
    per_agent: Mutex<HashMap<Arc<str>, u64>>,
}

/// What one request reading its body holds; returned on drop.
#[derive(Debug)]
pub struct Held {
    buffers: Arc<BodyBuffers>,
    agent: Arc<str>,
    /// The agent's share: `max_body_bytes` times its in-flight limit.
    agent_cap: u64,
    total_cap: u64,
    bytes: u64,
}

/// An agent's room in the gateway's body memory: its share and the total.
/// A request makes its holds here: for its body, and for what it holds
/// beside it (a translated body, a translated answer being gathered).
#[derive(Debug, Clone)]
pub struct Room {
    buffers: Arc<BodyBuffers>,
    agent: Arc<str>,
    agent_cap: u64,
    total_cap: u64,
}

impl Room {
    /// An empty hold in this room.
    pub fn hold(&self) -> Held {
        self.buffers
            .hold(self.agent.clone(), self.agent_cap, self.total_cap)
    }
}

impl BodyBuffers {
    /// A hold for one request of `agent`, empty until it grows.
    pub fn hold(self: &Arc<Self>, agent: Arc<str>, agent_cap: u64, total_cap: u64) -> Held {
        Held {
            buffers: self.clone(),
            agent,
            agent_cap,
            total_cap,
            bytes: 0,
        }
    }

    /// The room of `agent`: its share `agent_cap`, within `total_cap`.
    pub fn room(self: &Arc<Self>, agent: Arc<str>, agent_cap: u64, total_cap: u64) -> Room {
        Room {
            buffers: self.clone(),
            agent,
            agent_cap,
            total_cap,
        }
    }

    #[cfg(test)]
    fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

impl Held {
    /// Counts `more` bytes before they are kept, or refuses them.
    pub fn grow(&mut self, more: u64) -> Result<(), GatewayError> {
        self.grow_within(more, self.agent_cap)
    }

    /// As [`Held::grow`], against an agent share of `agent_cap`.
    fn grow_within(&mut self, more: u64, agent_cap: u64) -> Result<(), GatewayError> {
        let b = &self.buffers;
        let total = b
            .total
            .fetch_add(more, Ordering::Relaxed)
            .saturating_add(more);
        if total > self.total_cap {
            b.total.fetch_sub(more, Ordering::Relaxed);
            return Err(GatewayError::Overloaded(
                "the gateway is holding as many request bodies as it may; retry shortly".into(),
            ));
        }
        let mut map = match b.per_agent.lock() {
            Ok(m) => m,
            Err(_) => {
                b.total.fetch_sub(more, Ordering::Relaxed);
                return Err(GatewayError::Internal("body accounting unavailable".into()));
            }
        };
        let mine = map.entry(self.agent.clone()).or_insert(0);
        if mine.saturating_add(more) > agent_cap {
            let held = *mine;
            if held == 0 {
                map.remove(&self.agent);
            }
            drop(map);
            b.total.fetch_sub(more, Ordering::Relaxed);
            return Err(Deny::new(
                DenyCode::TooManyInFlight,
                format!(
                    "this agent's connections already hold {held} bytes of request bodies; \
                     {more} more do not fit its share of {}",
                    self.agent_cap
                ),
            )
            .retry_after(Duration::from_secs(1))
            .into());
        }
        *mine += more;
        self.bytes += more;
        Ok(())
    }

    /// Charges `work`, what judging a body may allocate, against the
    /// gateway's total and an agent share that makes room for it (see
    /// [`BodyIntake::judging`]): work that could never fit is refused for
    /// good (413 `body_too_large`).
    pub fn judging(&mut self, work: u64) -> Result<(), GatewayError> {
        let room = self.work_room();
        if work > room.min(self.total_cap) {
            let mib = |b: u64| b.div_ceil(1 << 20);
            return Err(Deny::new(
                DenyCode::BodyTooLarge,
                format!(
                    "judging this body would hold ~{} MiB (a tree of its many small \
                     values, arrays or objects), more than this agent may ({} MiB)",
                    mib(work),
                    mib(room.min(self.total_cap))
                ),
            )
            .never_retryable()
            .into());
        }
        self.grow_within(work, room)
    }

    /// Counts `more` bytes a call holds beside its body (its translated
    /// body, a translated answer being gathered), in the room judging
    /// has. Refused: 503 `gateway_overloaded` (`what` says what did not
    /// fit), as for a body past the total.
    pub fn grow_beside(&mut self, more: u64, what: &str) -> Result<(), GatewayError> {
        self.grow_within(more, self.work_room()).map_err(|_| {
            GatewayError::Overloaded(format!(
                "the gateway has no memory left for {what} ({} KiB more) right now; retry shortly",
                more.div_ceil(1024)
            ))
        })
    }

    /// The agent share that work beside the bodies may fill.
    fn work_room(&self) -> u64 {
        self.agent_cap.saturating_mul(1 + JUDGING_PER_BODY_BYTE)
    }

    /// Gives back `less` of what this hold counts (at most all of it).
    pub fn shrink(&mut self, less: u64) {
        let less = less.min(self.bytes);
        if less == 0 {
            return;
        }
        self.bytes -= less;
        let b = &self.buffers;
        b.total.fetch_sub(less, Ordering::Relaxed);
        if let Ok(mut map) = b.per_agent.lock() {
            if let Some(mine) = map.get_mut(&self.agent) {
                *mine = mine.saturating_sub(less);
                if *mine == 0 {
                    map.remove(&self.agent);
                }
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shrink(self.bytes);
    }
}

/// How admission reads a request's body: the bytes it holds, whether a
/// refused body must be read off before the connection closes, and when
/// the body must have arrived.
#[derive(Debug, Default)]
pub struct BodyIntake {
    pub linger: bool,
    pub hold: Option<Held>,
    /// Set for every main request once its header is read.
    pub deadline: Option<BodyDeadline>,
    /// Bytes of a body Pingora streams upstream as it reads (one admission
    /// did not read), so far.
    pub streamed: u64,
}

impl BodyIntake {
    /// A body streamed upstream: counts `more` bytes of it and gives
    /// Pingora's next read of it what is left of the deadline. `Err` once
    /// the deadline has passed with the body still incomplete.
    pub fn stream(
        &mut self,
        session: &mut Session,
        more: usize,
        done: bool,
    ) -> Result<(), GatewayError> {
        let Some(d) = self.deadline else {
            return Ok(());
        };
        self.streamed += more as u64;
        if done {
            return Ok(());
        }
        match d.at(self.streamed).checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => {
                // Pingora's own timeout on the next read of the body: one
                // that never comes ends the exchange at the deadline too.
                session.downstream_session.set_read_timeout(Some(left));
                Ok(())
            }
            _ => Err(d.expired()),
        }
    }

    /// Counts `more` bytes; without a hold (no agent known yet) nothing is
    /// read, so nothing is counted.
    pub fn grow(&mut self, more: u64) -> Result<(), GatewayError> {
        match self.hold.as_mut() {
            Some(h) => h.grow(more),
            None => Ok(()),
        }
    }

    /// Charges `work`, what judging a body may allocate (a model call's:
    /// [`JUDGING_PER_BODY_BYTE`] per byte; an MCP body's: the bound of its
    /// `serde_json::Value` tree, `loopgate_policy::json::parse_cost`),
    /// against the gateway's total and an agent share that makes room for
    /// it (the bodies alone stay within the share itself, so no more of
    /// them are read than the agent may have in flight). Work that could
    /// never fit that room or the total is refused for good (413
    /// `body_too_large`), not as a retryable overload. Given back with
    /// [`BodyIntake::shrink`] once judging is done.
    pub fn judging(&mut self, work: u64) -> Result<u64, GatewayError> {
        if let Some(h) = self.hold.as_mut() {
            h.judging(work)?;
        }
        Ok(work)
    }

    /// Gives back `less` bytes counted by [`BodyIntake::grow`].
    pub fn shrink(&mut self, less: u64) {
        if let Some(h) = self.hold.as_mut() {
            h.shrink(less);
        }
    }
}

/// What judging a body may allocate besides the body, per byte of it:
/// serde's unescaped copy of an escaped string (the costliest: 0.75x,
/// `benches/judging`), the normalisation window, the loop guard's
/// fingerprint state. Charged like the body while judging runs, so the
/// agent's share and the gateway's total bound what bodies cost in
/// memory, not only their bytes.
pub const JUDGING_PER_BODY_BYTE: u64 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_judging_holds_is_charged_then_given_back() {
        let b = Arc::new(BodyBuffers::default());
        let mut a = b.hold("a".into(), 200, 250);
        let mut other = b.hold("b".into(), 200, 250);
        a.grow(100).unwrap();
        // Judging the body charges as much again: past the share for
        // bodies (100 more of body would not fit), within its room for
        // judging.
        assert_eq!(a.grow(101).unwrap_err().code(), "too_many_in_flight");
        a.grow_within(
            100 * JUDGING_PER_BODY_BYTE,
            200 * (1 + JUDGING_PER_BODY_BYTE),
        )
        .unwrap();
        assert_eq!(other.grow(51).unwrap_err().code(), "gateway_overloaded");
        a.shrink(100 * JUDGING_PER_BODY_BYTE);
        assert_eq!(b.total(), 100);
        other.grow(150).unwrap();
        // Never gives back more than it holds.
        a.shrink(1_000);
        assert_eq!(b.total(), 150);
        drop(other);
        assert_eq!(b.total(), 0);
    }

    #[test]
    fn an_agent_share_and_the_total_bound_what_is_held() {
        let b = Arc::new(BodyBuffers::default());
        let mut a1 = b.hold("a".into(), 100, 150);
        let mut a2 = b.hold("a".into(), 100, 150);
        let mut other = b.hold("b".into(), 100, 150);
        a1.grow(60).unwrap();
        assert_eq!(a2.grow(50).unwrap_err().code(), "too_many_in_flight");
        a2.grow(40).unwrap();
        // The total is full before b's share is.
        assert_eq!(other.grow(51).unwrap_err().code(), "gateway_overloaded");
        other.grow(50).unwrap();
        assert_eq!(b.total(), 150);
        drop(a1);
        assert_eq!(b.total(), 90);
        a2.grow(60).unwrap();
        drop((a2, other));
        assert_eq!(b.total(), 0);
        assert!(b.per_agent.lock().unwrap().is_empty());
    }
}
