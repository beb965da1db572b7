//! The shared state the request path consults besides the config
//! snapshot: the state store, the clock, metrics, the in-process guard
//! state and the circuit breakers. One borrow of the gateway's own fields, handed to
//! admission and to the exchange features alike.

use crate::metrics::Metrics;
use loopgate_breaker::{BreakerSet, FailureStreaks};
use loopgate_policy::{Clock, StateStore};

pub struct Env<'a> {
    pub store: &'a dyn StateStore,
    pub clock: &'a dyn Clock,
    pub metrics: &'a Metrics,
    pub streaks: &'a FailureStreaks,
    pub breakers: &'a BreakerSet,
}
