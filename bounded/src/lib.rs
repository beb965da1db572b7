//! A bounded map of per-key state for keys that clients choose (task ids
//! from `x-agent-task-id`): it never holds more than its capacity, a new
//! key in a full shard pushes out that shard's least recently used entry,
//! and idle entries go lazily, a few per call, from the least recent end.
//! Every operation is O(1) (amortised for idle expiry); nothing scans the
//! map on the request path.
//!
//! The map is split into [`SHARDS`] shards by a randomly keyed hash of the
//! key, each behind its own mutex, so one busy task does not serialise the
//! others. Agents cannot aim keys at one shard: the hash key is drawn per
//! map. The LRU order is per shard; with keys spread evenly, the entry a
//! full shard pushes out is among the least recent of the whole map. Maps
//! smaller than `SHARDS * MIN_PER_SHARD` keep one shard (exact LRU).
//!
//! Memory per entry, besides the value: the key's heap bytes, a `String`
//! (24 bytes) and two list pointers (16) in one heap node, and about 24
//! bytes of hash table (a 16-byte slot and a control byte per bucket, at
//! 50 to 87% load). See each user's doc for its total.

use lru::LruCache;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// Shards of a large map.
pub const SHARDS: usize = 16;
/// A map gets [`SHARDS`] shards only when each holds at least this many.
const MIN_PER_SHARD: usize = 1024;
/// Most idle entries one call drops: work per call stays O(1), and since a
/// call adds at most one entry, idle ones still drain.
pub const EXPIRE_PER_CALL: usize = 8;

/// A shard's mutex was poisoned (a thread panicked holding it): the state
/// cannot be trusted, the caller reports it (and denies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Poisoned;

/// At most `capacity` entries keyed by string, least recently used first
/// out.
pub struct BoundedMap<V> {
    /// Picks the shard. Independent of the shards' own table hashers, so
    /// the keys of one shard still spread over its table.
    route: ahash::RandomState,
    shards: Box<[Mutex<Shard<V>>]>,
    capacity: usize,
}

impl<V> std::fmt::Debug for BoundedMap<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundedMap")
            .field("shards", &self.shards.len())
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// One shard: an LRU list over a hash map, with its share of the capacity.
pub struct Shard<V> {
    // Unbounded to `lru` (its bounded form allocates the whole table up
    // front); `cap` is enforced here.
    map: LruCache<String, V, ahash::RandomState>,
    cap: usize,
}

impl<V> BoundedMap<V> {
    /// A map of at most `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> BoundedMap<V> {
        let capacity = capacity.max(1);
        let n = if capacity >= SHARDS * MIN_PER_SHARD {
            SHARDS
        } else {
            1
        };
        // The shares add up to `capacity` exactly.
        let shards = (0..n)
            .map(|i| {
                Mutex::new(Shard {
                    map: LruCache::unbounded_with_hasher(ahash::RandomState::new()),
                    cap: capacity / n + usize::from(i < capacity % n),
                })
            })
            .collect();
        BoundedMap {
            route: ahash::RandomState::new(),
            shards,
            capacity,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The shard that holds (or would hold) `key`, locked.
    pub fn shard(&self, key: &str) -> Result<MutexGuard<'_, Shard<V>>, Poisoned> {
        let i = if self.shards.len() == 1 {
            0
        } else {
            // The high bits: ahash mixes them as well as the low ones.
            ((self.route.hash_one(key) >> 32) as usize) % self.shards.len()
        };
        self.shards[i].lock().map_err(|_| Poisoned)
    }

    /// Entries in all shards, each locked in turn (for tests and metrics,
    /// not the request path).
    pub fn len(&self) -> Result<usize, Poisoned> {
        self.shards
            .iter()
            .try_fold(0, |n, s| Ok(n + s.lock().map_err(|_| Poisoned)?.len()))
    }

    pub fn is_empty(&self) -> Result<bool, Poisoned> {
        Ok(self.len()? == 0)
    }
}

/// Per-owner bounded maps, so that one owner's keys push out only its
/// own entries. A key's owner is its text up to the first `/` (the whole
/// key without one): the callers build keys as `<agent>/<task...>` (or
/// `<class>:<agent>/...`), where agent names come from the config and may
/// hold no `/`, so the number of owners is bounded by the config, never by
/// what an agent sends. Each owner gets a [`BoundedMap`] of `per_owner`
/// entries, made on its first key (no memory up front).
pub struct Partitioned<V> {
    per_owner: usize,
    owners: RwLock<HashMap<Box<str>, Arc<BoundedMap<V>>, ahash::RandomState>>,
}

impl<V> std::fmt::Debug for Partitioned<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partitioned")
            .field("per_owner", &self.per_owner)
            .finish_non_exhaustive()
    }
}

/// The owner part of a key: up to its first `/`.
pub fn owner_of(key: &str) -> &str {
    key.split_once('/').map_or(key, |(owner, _)| owner)
}

impl<V> Partitioned<V> {
    /// At most `per_owner` entries (at least 1) for each owner.
    pub fn new(per_owner: usize) -> Partitioned<V> {
        Partitioned {
            per_owner: per_owner.max(1),
            owners: RwLock::default(),
        }
    }

    pub fn per_owner(&self) -> usize {
        self.per_owner
    }

    /// The map of `key`'s owner, made if it has none yet.
    pub fn of(&self, key: &str) -> Result<Arc<BoundedMap<V>>, Poisoned> {
        let owner = owner_of(key);
        if let Some(m) = self.owners.read().map_err(|_| Poisoned)?.get(owner) {
            return Ok(m.clone());
        }
        let mut owners = self.owners.write().map_err(|_| Poisoned)?;
        Ok(owners
            .entry(owner.into())
            .or_insert_with(|| Arc::new(BoundedMap::new(self.per_owner)))
            .clone())
    }

    /// The map of `key`'s owner if it has one (reads make none).
    pub fn existing(&self, key: &str) -> Result<Option<Arc<BoundedMap<V>>>, Poisoned> {
        let owners = self.owners.read().map_err(|_| Poisoned)?;
        Ok(owners.get(owner_of(key)).cloned())
    }

    /// Entries of every owner (each shard locked in turn: not for the
    /// request path).
    pub fn len(&self) -> Result<usize, Poisoned> {
        let maps: Vec<_> = self
            .owners
            .read()
            .map_err(|_| Poisoned)?
            .values()
            .cloned()
            .collect();
        maps.iter().try_fold(0, |n, m| Ok(n + m.len()?))
    }

    pub fn is_empty(&self) -> Result<bool, Poisoned> {
        Ok(self.len()? == 0)
    }
}

impl<V> Shard<V> {
    /// Whether a new key fits without pushing another entry out.
    pub fn has_room(&self) -> bool {
        self.map.len() < self.cap
    }

    /// Drops least recently used entries while `idle` says they are, at
    /// most [`EXPIRE_PER_CALL`]. Returns how many went.
    pub fn expire(&mut self, mut idle: impl FnMut(&V) -> bool) -> usize {
        let mut dropped = 0;
        while dropped < EXPIRE_PER_CALL && self.map.peek_lru().is_some_and(|(_, v)| idle(v)) {
            self.map.pop_lru();
            dropped += 1;
        }
        dropped
    }

    /// `key`'s entry, made the most recent; made by `new` if absent, after
    /// the least recent entry goes if the shard is full.
    pub fn touch(&mut self, key: &str, new: impl FnOnce() -> V) -> &mut V {
        if self.map.len() >= self.cap && !self.map.contains(key) {
            self.map.pop_lru();
        }
        self.map.get_or_insert_mut_ref(key, new)
    }

    /// `key`'s entry, made the most recent.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.map.get_mut(key)
    }

    /// `key`'s entry, its place in the LRU order left as it is.
    pub fn peek_mut(&mut self, key: &str) -> Option<&mut V> {
        self.map.peek_mut(key)
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        self.map.pop(key)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// This shard's share of the capacity.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Keys and values from the least to the most recently used.
    pub fn iter_lru_first(&self) -> impl Iterator<Item = (&str, &V)> {
        self.map.iter().rev().map(|(k, v)| (k.as_str(), v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Instant;

    fn order<V: Copy>(s: &Shard<V>) -> Vec<(String, V)> {
        s.iter_lru_first()
            .map(|(k, v)| (k.to_string(), *v))
            .collect()
    }

    #[test]
    fn a_full_map_pushes_out_the_least_recently_used() {
        let m = BoundedMap::new(3);
        let mut s = m.shard("a").unwrap();
        for k in ["a", "b", "c"] {
            *s.touch(k, || 0) += 1;
        }
        *s.touch("a", || 0) += 1; // a is now the most recent
        *s.peek_mut("b").unwrap() += 10; // peeking does not reorder
        *s.touch("d", || 0) += 1; // pushes out b
        assert_eq!(
            order(&s),
            [("c".into(), 1), ("a".into(), 2), ("d".into(), 1)]
        );
        s.get_mut("c");
        *s.touch("e", || 0) += 1; // pushes out a
        assert_eq!(
            order(&s)
                .iter()
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>(),
            ["d", "c", "e"]
        );
    }

    #[test]
    fn idle_entries_go_from_the_tail_a_few_per_call() {
        let m = BoundedMap::new(100);
        let mut s = m.shard("x").unwrap();
        for t in 0..20u64 {
            s.touch(&format!("k{t}"), || t);
        }
        s.touch("k3", || 0); // recent again, value (last seen) stays 3
        assert_eq!(s.expire(|t| *t < 12), EXPIRE_PER_CALL);
        assert_eq!(s.len(), 20 - EXPIRE_PER_CALL);
        // k0..k2, k4..k8 went; k9 is next, then k10, k11, then k12 (not idle).
        assert_eq!(s.expire(|t| *t < 12), 3);
        assert_eq!(s.iter_lru_first().next().map(|(k, _)| k), Some("k12"));
        // k3 is idle but behind non-idle ones: it waits for its turn.
        assert!(s.iter_lru_first().any(|(k, _)| k == "k3"));
        assert_eq!(s.expire(|_| false), 0);
    }

    #[test]
    fn capacity_splits_exactly_over_shards() {
        for cap in [0, 1, 7, 16 * 1024 - 1, 16 * 1024, 100_000, 100_003] {
            let m: BoundedMap<()> = BoundedMap::new(cap);
            let total: usize = m.shards.iter().map(|s| s.lock().unwrap().cap()).sum();
            assert_eq!(total, cap.max(1), "capacity {cap}");
            assert_eq!(m.capacity(), cap.max(1));
        }
        assert_eq!(BoundedMap::<()>::new(100_000).shards.len(), SHARDS);
        assert_eq!(BoundedMap::<()>::new(1000).shards.len(), 1);
    }

    #[test]
    fn a_million_distinct_keys_never_exceed_the_capacity() {
        let m = BoundedMap::new(100_000);
        let t0 = Instant::now();
        for i in 0..1_000_000u32 {
            let key = format!("agent/task-{i}");
            m.shard(&key).unwrap().touch(&key, || i);
            if i % 50_000 == 0 {
                assert!(m.len().unwrap() <= 100_000);
            }
        }
        println!("bounded: 1,000,000 distinct keys in {:?}", t0.elapsed());
        let len = m.len().unwrap();
        assert!(len <= 100_000);
        // Each shard is full: the total is the capacity.
        assert_eq!(len, 100_000);
        // The most recent keys are the ones kept.
        let last = "agent/task-999999";
        assert_eq!(
            m.shard(last).unwrap().peek_mut(last).copied(),
            Some(999_999)
        );
    }

    #[test]
    fn one_owner_pushes_out_only_its_own_entries() {
        let p: Partitioned<u32> = Partitioned::new(100);
        for i in 0..50 {
            let k = format!("victim/task-{i}");
            p.of(&k).unwrap().shard(&k).unwrap().touch(&k, || i);
        }
        // A flood of fresh keys from another owner.
        for i in 0..100_000 {
            let k = format!("flooder/task-{i}");
            p.of(&k).unwrap().shard(&k).unwrap().touch(&k, || i);
        }
        for i in 0..50 {
            let k = format!("victim/task-{i}");
            let m = p.existing(&k).unwrap().unwrap();
            assert_eq!(m.shard(&k).unwrap().peek_mut(&k).copied(), Some(i));
        }
        assert_eq!(p.len().unwrap(), 150);
        assert_eq!(owner_of("loop:a/b/c"), "loop:a");
        assert_eq!(owner_of("plain"), "plain");
        assert!(p.existing("nobody/x").unwrap().is_none());
    }

    #[test]
    fn a_poisoned_shard_is_an_error_not_a_panic() {
        let m = std::sync::Arc::new(BoundedMap::<u32>::new(10));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _guard = m2.shard("k").unwrap();
            panic!("poison the shard");
        })
        .join();
        assert_eq!(m.shard("k").err(), Some(Poisoned));
        assert_eq!(m.len(), Err(Poisoned));
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Touch key with value (a time stamp).
        Touch(u8, u32),
        Get(u8),
        Peek(u8, u32),
        Remove(u8),
        /// Expire entries whose value is below this.
        Expire(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        let key = 0u8..12;
        prop_oneof![
            4 => (key.clone(), 0u32..100).prop_map(|(k, v)| Op::Touch(k, v)),
            1 => key.clone().prop_map(Op::Get),
            1 => (key.clone(), 0u32..100).prop_map(|(k, v)| Op::Peek(k, v)),
            1 => key.prop_map(Op::Remove),
            1 => (0u32..100).prop_map(Op::Expire),
        ]
    }

    /// The reference: a HashMap of values and a Vec of keys, least recent
    /// first.
    #[derive(Default)]
    struct Model {
        values: std::collections::HashMap<String, u32>,
        order: Vec<String>,
    }

    impl Model {
        fn move_to_back(&mut self, k: &str) {
            let i = self.order.iter().position(|o| o == k).unwrap();
            let k = self.order.remove(i);
            self.order.push(k);
        }
    }

    proptest! {
        #[test]
        fn behaves_like_a_map_and_an_ordering_vec(
            cap in 1usize..8,
            ops in prop::collection::vec(op(), 0..200),
        ) {
            let m = BoundedMap::new(cap);
            let mut model = Model::default();
            for op in ops {
                let mut s = m.shard("any").unwrap();
                match op {
                    Op::Touch(k, v) => {
                        let k = format!("k{k}");
                        if model.values.contains_key(&k) {
                            model.move_to_back(&k);
                        } else {
                            if model.order.len() >= cap {
                                let gone = model.order.remove(0);
                                model.values.remove(&gone);
                            }
                            model.order.push(k.clone());
                            model.values.insert(k.clone(), 0);
                        }
                        *model.values.get_mut(&k).unwrap() = v;
                        *s.touch(&k, || 0) = v;
                    }
                    Op::Get(k) => {
                        let k = format!("k{k}");
                        let want = model.values.get(&k).copied();
                        if want.is_some() {
                            model.move_to_back(&k);
                        }
                        prop_assert_eq!(s.get_mut(&k).copied(), want);
                    }
                    Op::Peek(k, v) => {
                        let k = format!("k{k}");
                        let got = s.peek_mut(&k).map(|x| { *x = v; });
                        let want = model.values.get_mut(&k).map(|x| { *x = v; });
                        prop_assert_eq!(got, want);
                    }
                    Op::Remove(k) => {
                        let k = format!("k{k}");
                        let want = model.values.remove(&k);
                        model.order.retain(|o| *o != k);
                        prop_assert_eq!(s.remove(&k), want);
                    }
                    Op::Expire(below) => {
                        let mut want = 0;
                        while want < EXPIRE_PER_CALL
                            && model.order.first().is_some_and(|k| model.values[k] < below)
                        {
                            let k = model.order.remove(0);
                            model.values.remove(&k);
                            want += 1;
                        }
                        prop_assert_eq!(s.expire(|v| *v < below), want);
                    }
                }
                let want: Vec<(String, u32)> = model
                    .order
                    .iter()
                    .map(|k| (k.clone(), model.values[k]))
                    .collect();
                prop_assert_eq!(order(&s), want);
                prop_assert!(s.len() <= cap);
            }
        }
    }
}
