//! Tool isolation: per task and tool, the same failing answer again and
//! again isolates the tool for that task for a while, so the task stops
//! hammering it (through this route or another).
//!
//! A [`Streak`] is one task's record for one tool: the last failure's
//! signature, how many times in a row it came, until when the tool is
//! isolated and when the task last heard from the tool. [`Streak::step`]
//! is the pure step an answer makes; the gateway keeps the record in its
//! state store (`streak:<agent>/<task>/<tool>`, encoded, see
//! [`Streak::encode`]), so replicas sharing a store count a task's
//! failures together, and admission reads it to refuse an isolated tool.
//!
//! A streak idle for [`IDLE`] (and not isolated) is forgotten: the step
//! starts it over, and the store drops the record after [`Streak::ttl`].

use std::time::Duration;

/// A streak not touched for this long is forgotten (once its isolation,
/// if any, has ended).
pub const IDLE: Duration = Duration::from_secs(3600);

/// One task's failure streak with one tool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Streak {
    /// What the failures in the row looked like (same signature = same
    /// failing answer); meaningful while `count > 0`.
    signature: u64,
    count: u32,
    isolated_until: Option<Duration>,
    last_seen: Duration,
}

impl Streak {
    /// Bytes of [`Streak::encode`]'s output.
    pub const ENCODED_LEN: usize = 8 + 4 + 8 + 8;

    /// `Some(retry_after)` while the tool is isolated for the task.
    pub fn isolated(&self, now: Duration) -> Option<Duration> {
        self.isolated_until
            .filter(|until| *until > now)
            .map(|until| until - now)
    }

    /// Failures of the same kind in a row so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Steps the streak `current` (`None`: the task has none) by one
    /// answer at `now`: `Some(signature)` for a failure, `None` for a
    /// success. `threshold` same failures in a row isolate the tool for
    /// `cooldown`. Returns the streak to write (`None`: nothing changed
    /// worth writing, so a success of a task without a streak costs no
    /// write) and whether this answer isolated the tool.
    pub fn step(
        current: Option<Streak>,
        failure: Option<u64>,
        threshold: u32,
        cooldown: Duration,
        now: Duration,
    ) -> (Option<Streak>, bool) {
        let live =
            current.filter(|s| now.saturating_sub(s.last_seen) < IDLE || s.isolated(now).is_some());
        let Some(sig) = failure else {
            // A success breaks the row; an isolation stays as it is.
            return match live {
                Some(mut s) if s.count > 0 => {
                    s.count = 0;
                    s.last_seen = now;
                    (Some(s), false)
                }
                _ => (None, false),
            };
        };
        let mut s = live.unwrap_or_default();
        s.last_seen = now;
        if s.count > 0 && s.signature == sig {
            s.count += 1;
        } else {
            s.signature = sig;
            s.count = 1;
        }
        if s.count >= threshold {
            s.count = 0;
            s.isolated_until = Some(now + cooldown);
            return (Some(s), true);
        }
        (Some(s), false)
    }

    /// How long a store keeps a streak written under `cooldown`: while it
    /// may still count (idle time) and at least through its isolation.
    pub fn ttl(cooldown: Duration) -> Duration {
        IDLE.max(cooldown)
    }

    /// Fixed little-endian layout: signature (u64), count (u32),
    /// isolated-until (u64 ns + 1, 0 for none), last-seen (u64 ns).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::ENCODED_LEN);
        out.extend_from_slice(&self.signature.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        let until = self.isolated_until.map_or(0, |d| d.as_nanos() as u64 + 1);
        out.extend_from_slice(&until.to_le_bytes());
        out.extend_from_slice(&(self.last_seen.as_nanos() as u64).to_le_bytes());
        out
    }

    /// `None` for bytes that are not an encoded streak.
    pub fn decode(b: &[u8]) -> Option<Streak> {
        if b.len() != Self::ENCODED_LEN {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let until = u64_at(12);
        Some(Streak {
            signature: u64_at(0),
            count: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            isolated_until: (until > 0).then(|| Duration::from_nanos(until - 1)),
            last_seen: Duration::from_nanos(u64_at(20)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{step_record, MemoryStore, StateStore};
    use crate::test_support::ready;
    use crate::ManualClock;
    use proptest::prelude::*;

    const S: Duration = Duration::from_secs(1);

    /// Streaks by key, as a store would hold them (without its bounds).
    #[derive(Default)]
    struct Streaks(std::collections::HashMap<String, Streak>);

    impl Streaks {
        fn record(
            &mut self,
            key: &str,
            failure: Option<u64>,
            threshold: u32,
            cooldown: Duration,
            now: Duration,
        ) -> bool {
            let (next, isolated) =
                Streak::step(self.0.get(key).copied(), failure, threshold, cooldown, now);
            if let Some(s) = next {
                self.0.insert(key.to_string(), s);
            }
            isolated
        }

        fn isolated(&self, key: &str, now: Duration) -> Option<Duration> {
            self.0.get(key).and_then(|s| s.isolated(now))
        }
    }

    #[test]
    fn the_same_failure_three_times_isolates_until_the_cooldown_ends() {
        let mut f = Streaks::default();
        assert!(!f.record("t/tool", Some(500), 3, 30 * S, S));
        assert!(!f.record("t/tool", Some(500), 3, 30 * S, S));
        assert_eq!(f.isolated("t/tool", S), None);
        assert!(f.record("t/tool", Some(500), 3, 30 * S, 2 * S));
        assert_eq!(f.isolated("t/tool", 12 * S), Some(20 * S));
        assert_eq!(f.isolated("t/other", 12 * S), None);
        assert_eq!(f.isolated("t/tool", 32 * S), None);
        // After the isolation the row starts from nothing.
        assert!(!f.record("t/tool", Some(500), 3, 30 * S, 33 * S));
        assert_eq!(f.0["t/tool"].count(), 1);
    }

    #[test]
    fn different_failures_or_a_success_break_the_streak() {
        let mut f = Streaks::default();
        f.record("k", Some(500), 3, S, S);
        f.record("k", Some(502), 3, S, S);
        assert!(!f.record("k", Some(500), 3, S, S));
        f.record("k", None, 3, S, S);
        f.record("k", Some(500), 3, S, S);
        assert!(!f.record("k", Some(500), 3, S, S));
        assert!(f.record("k", Some(500), 3, S, S));
    }

    #[test]
    fn a_success_without_a_streak_writes_nothing() {
        assert_eq!(Streak::step(None, None, 3, S, S), (None, false));
        let (one, _) = Streak::step(None, Some(500), 3, S, S);
        // A success after a failure resets the row ...
        let (reset, _) = Streak::step(one, None, 3, S, 2 * S);
        assert_eq!(reset.map(|s| s.count()), Some(0));
        // ... and another success has nothing left to change.
        assert_eq!(Streak::step(reset, None, 3, S, 3 * S), (None, false));
        // Nor does one during an isolation: it stays.
        let (held, isolated) = Streak::step(None, Some(500), 1, 60 * S, S);
        assert!(isolated);
        assert_eq!(Streak::step(held, None, 1, 60 * S, 2 * S), (None, false));
        assert_eq!(held.unwrap().isolated(2 * S), Some(59 * S));
    }

    #[test]
    fn idle_streaks_go_but_an_isolation_outlives_the_idle_time() {
        let hour = 3600 * S;
        let mut f = Streaks::default();
        f.record("ag/idle", Some(1), 3, S, S);
        f.record("ag/idle", Some(1), 3, S, S);
        f.record("ag/held", Some(1), 1, 3 * hour, S);
        // Idle for an hour: the row is forgotten, this failure is the first.
        assert!(!f.record("ag/idle", Some(1), 3, S, S + hour));
        assert_eq!(f.0["ag/idle"].count(), 1);
        // The isolation still holds past the idle time.
        assert_eq!(f.isolated("ag/held", 2 * hour), Some(hour + S));
        assert_eq!(Streak::ttl(S), IDLE);
        assert_eq!(Streak::ttl(3 * hour), 3 * hour);
    }

    #[test]
    fn bytes_that_are_not_a_streak_decode_to_none() {
        let good = Streak::default().encode();
        assert_eq!(good.len(), Streak::ENCODED_LEN);
        assert_eq!(Streak::decode(&good), Some(Streak::default()));
        assert_eq!(Streak::decode(&good[1..]), None);
        assert_eq!(Streak::decode(&[good, vec![0]].concat()), None);
    }

    proptest! {
        /// An encoded streak judges every answer as the one it came from.
        #[test]
        fn an_encoded_streak_judges_as_the_one_it_came_from(
            answers in proptest::collection::vec((prop::option::of(0u64..3), 0u64..5000), 1..40),
        ) {
            let (mut kept, mut moved): (Option<Streak>, Option<Vec<u8>>) = (None, None);
            let mut now = Duration::ZERO;
            for (failure, ms) in answers {
                now += Duration::from_millis(ms) * 1000;
                let (a, ia) = Streak::step(kept, failure, 3, 30 * S, now);
                let (b, ib) = Streak::step(moved.as_deref().and_then(Streak::decode), failure, 3, 30 * S, now);
                prop_assert_eq!(a, b);
                prop_assert_eq!(ia, ib);
                if let Some(a) = a {
                    kept = Some(a);
                    moved = b.map(|b| b.encode());
                }
            }
        }
    }

    /// Streaks written through the memory store, as the gateway writes
    /// them: bounded per agent, another agent's flood takes nothing.
    #[test]
    fn streaks_in_the_memory_store_stay_within_each_agents_bound() {
        let store = MemoryStore::with_record_capacity(1000);
        let clock = ManualClock::default();
        clock.set(S);
        let record = |key: &str, threshold| {
            let step = |s, now| {
                let (next, isolated) = Streak::step(s, Some(500), threshold, 30 * S, now);
                (next.map(|s| s.encode()), isolated)
            };
            let key = format!("streak:{key}");
            ready(step_record(
                &store,
                &clock,
                &key,
                Streak::ttl(30 * S),
                Streak::decode,
                step,
            ))
            .unwrap()
        };
        let isolated = |key: &str| {
            let r = ready(store.record_get(S, &format!("streak:{key}"))).unwrap();
            r.and_then(|(_, b)| Streak::decode(&b))
                .and_then(|s| s.isolated(S))
        };
        record("victim/t/tool", 1);
        for i in 0..20_000u64 {
            record(&format!("ag/t{i}/tool"), 2);
        }
        assert_eq!(store.records_len().unwrap(), 1001);
        assert!(record("ag/t19999/tool", 2), "the most recent are kept");
        assert_eq!(isolated("ag/t19999/tool"), Some(30 * S));
        assert_eq!(isolated("ag/t0/tool"), None, "the least recent went");
        // Another agent's flood left this agent's isolation in place.
        assert_eq!(isolated("victim/t/tool"), Some(30 * S));
    }
}
