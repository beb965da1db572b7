//! Loopgate's circuit breakers and agent-loop detection.
//!
//! This crate holds pure state machines with an injected clock: per-upstream
//! (and per-tenant) closed/open/half-open breakers, and the per-task
//! fingerprint rings that spot an agent repeating itself. Like `policy`, it
//! knows nothing of Pingora or sockets; the gateway feeds it outcomes from
//! its response and logging hooks and asks it for a gate in `upstream_peer`.
//!
//! The proxy core does not use it yet: breakers arrive with the resilience
//! work, loop detection with the agent guards.
