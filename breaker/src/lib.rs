//! Loopgate's circuit breakers and upstream health.
//!
//! Pure state machines: every call takes the current time (`now`, a
//! monotonic `Duration` from the gateway's injected clock), nothing here
//! reads a clock, opens a socket or knows Pingora. The gateway asks a
//! breaker for a [`Ticket`] before contacting an upstream and reports the
//! [`Outcome`] once per ticket.
//!
//! Agent-loop detection joins this crate with the agent guards: the
//! fingerprint and the pure step of a task's loop state ([`TaskState`]),
//! which the gateway keeps in its state store.

pub mod circuit;
pub mod health;
pub mod loops;
pub mod set;

pub use circuit::{
    Breaker, BreakerConfig, FailureKind, Outcome, Rejected, Snapshot, State, Ticket, Transition,
};
pub use health::Health;
pub use loops::{
    fingerprint, Fingerprint, Fingerprinter, LoopConfig, LoopVerdict, TaskState, Trip,
    MAX_LAST_TURNS,
};
pub use set::BreakerSet;
