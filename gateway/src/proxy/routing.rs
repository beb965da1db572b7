//! Choosing the target of each attempt: weighted by configured weight and
//! health for the first attempt, then the route's fallback order, skipping
//! targets already tried and those whose breaker refuses.

use crate::config::runtime::{Provider, Route};
use loopgate_breaker::{set::Unknown, BreakerSet, Ticket, Transition};
use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

/// The breaker key of `provider` for `agent`.
pub fn breaker_key(provider: &Provider, agent: &str) -> Arc<str> {
    if provider.isolate_by_agent {
        Arc::from(format!("{}/{}", provider.name, agent))
    } else {
        // Shared, not copied: a request clones this key several times.
        provider.name.clone()
    }
}

/// When every target of `route` has an open breaker for `agent` now: the
/// soonest reopening and its provider. Admission refuses such a call
/// before any task state is made for it (a refused call must not grow the
/// guards' state); the upstream choice stays the authority for the rest.
pub fn all_open(
    breakers: &BreakerSet,
    route: &Route,
    agent: &str,
    now: Duration,
) -> Result<Option<(Duration, Arc<str>)>, Unknown> {
    let mut soonest: Option<(Duration, Arc<str>)> = None;
    for t in &route.targets {
        let Some(open) = breakers.open_for(&breaker_key(&t.provider, agent), now)? else {
            return Ok(None);
        };
        if soonest.as_ref().is_none_or(|(d, _)| open < *d) {
            soonest = Some((open, t.provider.name.clone()));
        }
    }
    Ok(soonest)
}

/// A target picked for one attempt, with its breaker ticket.
#[derive(Debug)]
pub struct Picked {
    pub target: usize,
    pub provider: Arc<Provider>,
    pub key: Arc<str>,
    pub ticket: Ticket,
}

#[derive(Debug)]
pub enum Choice {
    Go(Picked),
    /// Every remaining target's breaker refused; the soonest retry.
    AllOpen {
        retry_after: Duration,
        provider: String,
    },
    /// Nothing left to try.
    Exhausted,
}

/// Picks the target for the next attempt, never one in `tried` (tried
/// already, or one the request may not go to). `transitions` collects
/// breaker state changes (open -> half-open) that acquiring caused, for
/// logging.
pub fn choose(
    breakers: &BreakerSet,
    route: &Route,
    agent: &str,
    tried: &[usize],
    first_attempt: bool,
    now: Duration,
    transitions: &mut Vec<(String, Transition)>,
) -> Result<Choice, Unknown> {
    let n = route.targets.len();
    // The first attempt on a route with several targets goes by weight and
    // health; after that, and on one-target routes (no list is built for
    // those), targets are tried in order.
    let first = if first_attempt && n > 1 {
        let left: Vec<usize> = (0..n).filter(|i| !tried.contains(i)).collect();
        weighted_pick(breakers, route, agent, &left, now)?
    } else {
        None
    };
    let order = first
        .into_iter()
        .chain((0..n).filter(|i| Some(*i) != first && !tried.contains(i)));
    let mut soonest: Option<(Duration, String)> = None;
    for i in order {
        let provider = &route.targets[i].provider;
        let key = breaker_key(provider, agent);
        let (acquired, transition) = breakers.acquire(&key, &provider.breaker, now)?;
        if let Some(t) = transition {
            transitions.push((key.to_string(), t));
        }
        match acquired {
            Ok(ticket) => {
                return Ok(Choice::Go(Picked {
                    target: i,
                    provider: provider.clone(),
                    key,
                    ticket,
                }))
            }
            Err(rejected) => {
                if soonest
                    .as_ref()
                    .is_none_or(|(d, _)| rejected.retry_after < *d)
                {
                    soonest = Some((rejected.retry_after, provider.name.to_string()));
                }
            }
        }
    }
    Ok(match soonest {
        Some((retry_after, provider)) => Choice::AllOpen {
            retry_after,
            provider,
        },
        None => Choice::Exhausted,
    })
}

/// Weighted random choice among targets whose breaker is not open, each
/// weight scaled by the target's health (error rate and latency).
fn weighted_pick(
    breakers: &BreakerSet,
    route: &Route,
    agent: &str,
    candidates: &[usize],
    now: Duration,
) -> Result<Option<usize>, Unknown> {
    let mut usable = Vec::with_capacity(candidates.len());
    let mut best_latency: Option<f64> = None;
    for &i in candidates {
        let key = breaker_key(&route.targets[i].provider, agent);
        let peek = breakers.peek(&key, now)?;
        if peek
            .as_ref()
            .is_some_and(|(s, _, _)| *s == loopgate_breaker::State::Open)
        {
            continue;
        }
        if let Some(l) = peek.and_then(|(_, _, l)| l) {
            best_latency = Some(best_latency.map_or(l, |b: f64| b.min(l)));
        }
        usable.push((i, key));
    }
    let mut weights = Vec::with_capacity(usable.len());
    for (i, key) in &usable {
        let w = route.targets[*i].weight as f64 * breakers.factor(key, best_latency)?;
        weights.push((*i, w));
    }
    Ok(pick_by_weight(&weights, random_unit()))
}

/// `r` in [0, 1) selects proportionally to the weights.
pub fn pick_by_weight(weights: &[(usize, f64)], r: f64) -> Option<usize> {
    let total: f64 = weights.iter().map(|(_, w)| w).sum();
    if weights.is_empty() || total <= 0.0 {
        return weights.first().map(|(i, _)| *i);
    }
    let mut x = r * total;
    for (i, w) in weights {
        if x < *w {
            return Some(*i);
        }
        x -= w;
    }
    weights.last().map(|(i, _)| *i)
}

thread_local! {
    static RNG: Cell<u64> = Cell::new({
        let mut h = RandomState::new().build_hasher();
        h.write_u64(0x5eed);
        h.finish() | 1
    });
}

/// A uniform number in [0, 1) from a per-thread xorshift generator: cheap,
/// lock-free, and good enough to spread load.
fn random_unit() -> f64 {
    RNG.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_give_proportional_shares() {
        let w = [(0, 3.0), (1, 1.0)];
        let n = 10_000;
        let first = (0..n)
            .filter(|k| pick_by_weight(&w, *k as f64 / n as f64) == Some(0))
            .count();
        assert_eq!(first, 7_500);
        assert_eq!(pick_by_weight(&[], 0.5), None);
        assert_eq!(pick_by_weight(&[(4, 0.0)], 0.5), Some(4));
    }

    #[test]
    fn random_unit_stays_in_range_and_spreads() {
        let xs: Vec<f64> = (0..10_000).map(|_| random_unit()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let low = xs.iter().filter(|x| **x < 0.5).count();
        assert!((4_500..5_500).contains(&low), "{low}");
    }
}
