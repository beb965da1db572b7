//! The shared state the request path consults besides the config
//! snapshot: the state store (limits, idempotency, and every task guard's
//! records), the clock, metrics and the circuit breakers. One borrow of
//! the gateway's own fields, handed to admission and to the exchange
//! features alike.

use crate::metrics::Metrics;
use loopgate_breaker::BreakerSet;
use loopgate_policy::{Clock, StateStore};

pub struct Env<'a> {
    pub store: &'a dyn StateStore,
    pub clock: &'a dyn Clock,
    pub metrics: &'a Metrics,
    pub breakers: &'a BreakerSet,
}
