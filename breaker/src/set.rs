//! All breakers of a gateway, by key (a provider, or provider x agent with
//! `isolate_by: agent`), with each key's routing health. Keys come from the
//! config, so the map is bounded by providers x agents.
//!
//! A poisoned lock means the state cannot be known: every call then returns
//! `Err`, and the gateway denies (fail closed).

use crate::circuit::{
    Breaker, BreakerConfig, Outcome, Rejected, Snapshot, State, Ticket, Transition,
};
use crate::health::Health;
// ahash, not SipHash: these maps are looked up on every request, and keys
// agents influence (task ids) still get a randomly keyed, DoS-resistant hash.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

#[derive(Debug)]
struct Entry {
    breaker: Breaker,
    health: Health,
}

/// The breaker state could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown;

#[derive(Debug, Default)]
pub struct BreakerSet {
    inner: Mutex<HashMap<String, Entry>>,
}

pub type Acquired = (Result<Ticket, Rejected>, Option<Transition>);

impl BreakerSet {
    pub fn new() -> BreakerSet {
        BreakerSet::default()
    }

    fn lock(&self) -> Result<MutexGuard<'_, HashMap<String, Entry>>, Unknown> {
        self.inner.lock().map_err(|_| Unknown)
    }

    fn entry<'a>(
        map: &'a mut HashMap<String, Entry>,
        key: &str,
        cfg: &BreakerConfig,
        now: Duration,
    ) -> &'a mut Entry {
        if !map.contains_key(key) {
            map.insert(
                key.to_string(),
                Entry {
                    breaker: Breaker::new(cfg.clone(), now),
                    health: Health::default(),
                },
            );
        }
        let e = map.get_mut(key).expect("inserted above");
        if e.breaker.config() != cfg {
            e.breaker.reconfigure(cfg.clone());
        }
        e
    }

    /// Asks `key`'s breaker to let one live request through.
    pub fn acquire(
        &self,
        key: &str,
        cfg: &BreakerConfig,
        now: Duration,
    ) -> Result<Acquired, Unknown> {
        let mut map = self.lock()?;
        Ok(Self::entry(&mut map, key, cfg, now)
            .breaker
            .try_acquire(now))
    }

    /// The state and routing share factor of `key`, without taking a ticket.
    pub fn peek(
        &self,
        key: &str,
        now: Duration,
    ) -> Result<Option<(State, f64, Option<f64>)>, Unknown> {
        let map = self.lock()?;
        Ok(map.get(key).map(|e| {
            (
                e.breaker.state_at(now),
                e.health.error_rate(),
                e.health.latency_ms(),
            )
        }))
    }

    /// How long `key`'s breaker stays open from `now`; `None` when it is
    /// closed, half-open or unknown. Takes no ticket and changes nothing.
    pub fn open_for(&self, key: &str, now: Duration) -> Result<Option<Duration>, Unknown> {
        let map = self.lock()?;
        Ok(map
            .get(key)
            .and_then(|e| e.breaker.open_until_at(now))
            .map(|until| until.saturating_sub(now)))
    }

    /// Health factor for routing, given the best latency among peers.
    pub fn factor(&self, key: &str, best_latency_ms: Option<f64>) -> Result<f64, Unknown> {
        let map = self.lock()?;
        Ok(map
            .get(key)
            .map_or(1.0, |e| e.health.factor(best_latency_ms)))
    }

    /// Reports a ticket's outcome (and, on success, the latency to first byte).
    pub fn record(
        &self,
        key: &str,
        ticket: Ticket,
        outcome: Outcome,
        latency: Option<Duration>,
        now: Duration,
    ) -> Result<Option<Transition>, Unknown> {
        let mut map = self.lock()?;
        let Some(e) = map.get_mut(key) else {
            return Ok(None);
        };
        match outcome {
            Outcome::Success => e.health.success(latency.unwrap_or_default()),
            Outcome::Failure(_) => e.health.failure(),
        }
        Ok(e.breaker.record(now, ticket, outcome))
    }

    pub fn abandon(&self, key: &str, ticket: Ticket) {
        if let Ok(mut map) = self.lock() {
            if let Some(e) = map.get_mut(key) {
                e.breaker.abandon(ticket);
            }
        }
    }

    pub fn hold_open(
        &self,
        key: &str,
        cfg: &BreakerConfig,
        now: Duration,
        duration: Duration,
        reason: &str,
    ) -> Result<Option<Transition>, Unknown> {
        let mut map = self.lock()?;
        Ok(Self::entry(&mut map, key, cfg, now)
            .breaker
            .hold_open(now, duration, reason))
    }

    /// With active probes: the half-open keys whose probe should be sent now.
    pub fn due_probes(&self, now: Duration) -> Vec<(String, Ticket, Option<Transition>)> {
        let Ok(mut map) = self.lock() else {
            return Vec::new();
        };
        map.iter_mut()
            .filter(|(_, e)| e.breaker.config().active_probe)
            .filter_map(|(k, e)| {
                let (t, tr) = e.breaker.start_probe(now);
                t.map(|t| (k.clone(), t, tr))
            })
            .collect()
    }

    pub fn reset(&self, key: &str, now: Duration) -> Result<Option<Transition>, Unknown> {
        let mut map = self.lock()?;
        Ok(map.get_mut(key).and_then(|e| {
            e.health = Health::default();
            e.breaker.reset(now)
        }))
    }

    /// The keys open at `now`, with the time each stays open until (to
    /// share with other instances).
    pub fn open_until(&self, now: Duration) -> Vec<(String, Duration)> {
        let Ok(map) = self.lock() else {
            return Vec::new();
        };
        map.iter()
            .filter_map(|(k, e)| e.breaker.open_until_at(now).map(|u| (k.clone(), u)))
            .collect()
    }

    /// Opens `key` until `until` because another instance opened it: a
    /// breaker already open at least that long is left alone. A key this
    /// instance has not used yet starts with the default config, replaced
    /// by the route's on first use.
    pub fn adopt_open(
        &self,
        key: &str,
        until: Duration,
        now: Duration,
    ) -> Result<Option<Transition>, Unknown> {
        if until <= now {
            return Ok(None);
        }
        let mut map = self.lock()?;
        if !map.contains_key(key) {
            map.insert(
                key.to_string(),
                Entry {
                    breaker: Breaker::new(BreakerConfig::default(), now),
                    health: Health::default(),
                },
            );
        }
        let e = map.get_mut(key).expect("inserted above");
        Ok(e.breaker
            .hold_open(now, until - now, "opened by another instance"))
    }

    /// Every breaker's snapshot, sorted by key.
    pub fn snapshots(&self, now: Duration) -> Result<Vec<(String, Snapshot)>, Unknown> {
        let mut map = self.lock()?;
        let mut v: Vec<(String, Snapshot)> = map
            .iter_mut()
            .map(|(k, e)| (k.clone(), e.breaker.snapshot(now)))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::circuit::FailureKind;

    #[test]
    fn keys_are_independent() {
        let set = BreakerSet::new();
        let cfg = BreakerConfig {
            consecutive_failures: 1,
            ..BreakerConfig::default()
        };
        let now = Duration::from_secs(1);
        let (t, _) = set.acquire("p:agent-a", &cfg, now).unwrap();
        let tr = set
            .record(
                "p:agent-a",
                t.unwrap(),
                Outcome::Failure(FailureKind::ServerError),
                None,
                now,
            )
            .unwrap()
            .unwrap();
        assert_eq!(tr.to, State::Open);
        assert!(set.acquire("p:agent-a", &cfg, now).unwrap().0.is_err());
        assert!(set.acquire("p:agent-b", &cfg, now).unwrap().0.is_ok());
        let snaps = set.snapshots(now).unwrap();
        assert_eq!(snaps[0].0, "p:agent-a");
        assert_eq!(snaps[0].1.state, State::Open);
        assert_eq!(
            set.reset("p:agent-a", now).unwrap().unwrap().to,
            State::Closed
        );
    }
}

#[cfg(test)]
mod transition_tests {
    use super::*;
    use crate::circuit::FailureKind;

    #[test]
    fn acquire_reports_open_to_half_open() {
        let set = BreakerSet::new();
        let cfg = BreakerConfig {
            consecutive_failures: 1,
            open_for: Duration::from_secs(2),
            ..BreakerConfig::default()
        };
        let (t, _) = set.acquire("p", &cfg, Duration::ZERO).unwrap();
        set.record(
            "p",
            t.unwrap(),
            Outcome::Failure(FailureKind::ServerError),
            None,
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(
            set.peek("p", Duration::from_secs(3)).unwrap().unwrap().0,
            State::HalfOpen
        );
        let (_, tr) = set.acquire("p", &cfg, Duration::from_secs(3)).unwrap();
        assert_eq!(
            tr.map(|t| (t.from, t.to)),
            Some((State::Open, State::HalfOpen))
        );
    }
}
