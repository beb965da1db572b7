//! One attempt at an upstream, and the request's fallback policy.
//!
//! An [`Attempt`] owns its breaker ticket: it ends exactly once, by
//! construction. [`Attempt::succeed`] and [`Attempt::fail`] take it by
//! value and record the outcome; an attempt dropped without either (the
//! gateway's own fault, a stale pooled connection, an agent that left
//! before the answer) gives its ticket back, uncounted. No call site has
//! to remember to.
//!
//! [`Fallback`] is the one place that decides whether a failed attempt may
//! be followed by another (tower's retry `Policy` is the model): nothing
//! went to the agent yet, the route's attempt and time budget has room,
//! and a target not yet tried has a breaker that would let it through.

use super::routing::{self, Picked};
use crate::config::runtime::Route;
use crate::error::GatewayError;
use crate::metrics::Metrics;
use loopgate_breaker::{BreakerSet, FailureKind, Outcome, State};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One attempt at an upstream: its target and breaker ticket.
#[derive(Debug)]
pub struct Attempt {
    pub picked: Picked,
    pub started: Instant,
    /// Time to the response header, once it arrived.
    pub ttfb: Option<Duration>,
    breakers: Arc<BreakerSet>,
    /// Recorded (success or failure): the drop gives nothing back.
    settled: bool,
}

impl Attempt {
    pub fn new(picked: Picked, started: Instant, breakers: Arc<BreakerSet>) -> Attempt {
        Attempt {
            picked,
            started,
            ttfb: None,
            breakers,
            settled: false,
        }
    }

    /// The upstream answered (and, if it streamed, finished).
    pub fn succeed(mut self, metrics: &Metrics, now: Duration) {
        self.record(Outcome::Success, metrics, now);
    }

    /// The upstream failed this way.
    pub fn fail(mut self, kind: FailureKind, metrics: &Metrics, now: Duration) {
        self.record(Outcome::Failure(kind), metrics, now);
    }

    fn record(&mut self, outcome: Outcome, metrics: &Metrics, now: Duration) {
        self.settled = true;
        let p = &self.picked;
        let latency = self.ttfb.filter(|_| outcome == Outcome::Success);
        if let Ok(Some(t)) = self
            .breakers
            .record(&p.key, p.ticket, outcome, latency, now)
        {
            metrics.transition(&p.key, &t);
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.settled {
            self.breakers.abandon(&self.picked.key, self.picked.ticket);
        }
    }
}

/// What one request tried, and the policy for trying again.
#[derive(Debug, Default)]
pub struct Fallback {
    /// Targets of the route already tried (or skipped).
    pub tried: Vec<usize>,
    pub attempts: u32,
    pub first_at: Option<Instant>,
    /// The last failure, answered if no attempt is left.
    pub last_failure: Option<GatewayError>,
    /// A stale pooled connection: try the same target again, uncounted.
    pub retry_same: Option<usize>,
    pub stale_retries: u8,
    /// The provider the request fell back from.
    pub from: Option<Arc<str>>,
}

/// Retries of one target after a stale pooled connection, at most.
const MAX_STALE_RETRIES: u8 = 2;

impl Fallback {
    /// Ends `attempt` as failed (if there is one) and remembers `error` as
    /// the answer should no other attempt follow.
    pub fn failed(
        &mut self,
        attempt: Option<Attempt>,
        kind: FailureKind,
        error: GatewayError,
        metrics: &Metrics,
        now: Duration,
    ) {
        if let Some(att) = attempt {
            self.from
                .get_or_insert_with(|| att.picked.provider.name.clone());
            log::debug!(
                "provider `{}` failed: {}",
                att.picked.provider.name,
                kind.as_str()
            );
            att.fail(kind, metrics, now);
        }
        self.last_failure = Some(error);
    }

    /// Whether a new (counted) attempt still fits the route's budget.
    pub fn budget_left(&self, route: &Route, now: Instant) -> bool {
        self.attempts < route.max_attempts
            && !(self.attempts > 0
                && self
                    .first_at
                    .is_some_and(|t| now.duration_since(t) >= route.max_total))
    }

    /// Whether a failed attempt may be followed by another: nothing went
    /// to the agent yet, the budget has room, and an untried target's
    /// breaker is not open.
    pub fn may_retry(
        &self,
        route: &Route,
        agent: &str,
        breakers: &BreakerSet,
        now: Duration,
        response_started: bool,
    ) -> bool {
        if response_started || !self.budget_left(route, Instant::now()) {
            return false;
        }
        (0..route.targets.len())
            .filter(|i| !self.tried.contains(i))
            .any(|i| {
                let key = routing::breaker_key(&route.targets[i].provider, agent);
                !matches!(
                    breakers.peek(&key, now),
                    Ok(Some((State::Open, _, _))) | Err(_)
                )
            })
    }

    /// A pooled connection the provider had closed: the same target again
    /// on a fresh one, not counted, a bounded number of times.
    pub fn retry_stale(&mut self, attempt: &mut Option<Attempt>) -> bool {
        if self.stale_retries >= MAX_STALE_RETRIES {
            return false;
        }
        if let Some(att) = attempt.take() {
            self.retry_same = Some(att.picked.target);
            // Dropped: its ticket goes back uncounted.
        }
        self.stale_retries += 1;
        true
    }

    /// Counts an attempt at `target` (a retry of the same one is not new).
    pub fn count(&mut self, target: usize) -> bool {
        if self.tried.contains(&target) {
            return false;
        }
        self.tried.push(target);
        self.attempts += 1;
        self.attempts > 1
    }
}
