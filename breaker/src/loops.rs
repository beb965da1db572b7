//! Agent-loop detection: per task, a bounded ring of request fingerprints;
//! a request that would complete a repeated cycle is refused, and the task
//! cools down with a doubling back-off.
//!
//! A fingerprint is SHA-256 over a canonical form of what makes a call the
//! same call: endpoint, model, the last `last_turns` messages, tools and
//! tool arguments (they live in the messages). Noise is removed first: any
//! key named in `ignore_fields` at any depth (ids, timestamps, retry
//! counters), key order (objects are serialised sorted) and whitespace
//! (JSON layout, and runs of whitespace inside strings).
//!
//! A loop is the ring's tail being one block of 1..=window/repeats
//! fingerprints repeated `repeats` times in a row, counting the incoming
//! request (the look-ahead: the request that would complete the third
//! repeat is the one refused, so the provider sees only the allowed ones).
//! Two calls of the same search tool in a 12-step task are two repeats, not
//! three, and the steps between them break the run.
//!
//! A task's ring, trips and cool-down are a [`TaskState`]: a pure step
//! with the time passed in, encoded to bytes. The gateway keeps one per
//! task in its state store (`loop:<agent>/<task>`), so replicas sharing a
//! store judge a task on one ring; nothing here holds tasks itself.

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::time::Duration;

pub type Fingerprint = [u8; 32];

#[derive(Debug, Clone, PartialEq)]
pub struct LoopConfig {
    pub window: usize,
    pub repeats: usize,
    pub last_turns: usize,
    pub ignore_fields: Vec<String>,
    pub cooldown: Duration,
    pub max_cooldown: Duration,
    /// Clean requests in a row that clear a task's trip history.
    pub clear_after: u32,
    /// Idle tasks are forgotten after this long.
    pub idle_ttl: Duration,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            window: 10,
            repeats: 3,
            last_turns: 2,
            ignore_fields: [
                "user",
                "metadata",
                "request_id",
                "timestamp",
                "created",
                "retry",
                "retry_count",
                "seed",
                "stream",
                "stream_options",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            cooldown: Duration::from_secs(30),
            max_cooldown: Duration::from_secs(600),
            clear_after: 5,
            idle_ttl: Duration::from_secs(3600),
        }
    }
}

/// The fingerprint of a request to `endpoint` with JSON `body`.
///
/// The canonical form is written straight into the hasher, never built as
/// a second JSON tree: it is the serialisation of `{"endpoint": endpoint,
/// ...body}` with ignored keys dropped at every depth, keys sorted, runs of
/// whitespace in strings collapsed and only the last `last_turns` messages.
pub fn fingerprint(endpoint: &str, body: &Value, cfg: &LoopConfig) -> Fingerprint {
    let ignored = |k: &str| cfg.ignore_fields.iter().any(|f| f == k);
    let endpoint = Value::String(endpoint.to_string());
    // Top level: the body's keys plus `endpoint` (a body key of that name
    // wins), sorted as serde_json's map sorts them.
    let mut top: Vec<(&str, &Value)> = Vec::new();
    if !ignored("endpoint") {
        top.push(("endpoint", &endpoint));
    }
    if let Value::Object(map) = body {
        for (k, v) in map {
            if ignored(k) {
                continue;
            }
            if k == "endpoint" {
                top.retain(|(key, _)| *key != "endpoint");
            }
            top.push((k.as_str(), v));
        }
    }
    top.sort_by(|a, b| a.0.cmp(b.0));
    let mut h = Canonical {
        hash: Sha256::new(),
        text: String::new(),
    };
    h.object(top.into_iter(), |h, k, v| match (k, v) {
        ("messages", Value::Array(msgs)) => {
            let skip = msgs.len().saturating_sub(cfg.last_turns);
            h.array(&msgs[skip..], &ignored);
        }
        _ => h.value(v, &ignored),
    });
    h.hash.finalize().into()
}

/// Writes canonical JSON into a running SHA-256.
struct Canonical {
    hash: Sha256,
    /// Reused for whitespace-collapsed strings.
    text: String,
}

impl Canonical {
    fn put(&mut self, bytes: &[u8]) {
        self.hash.update(bytes);
    }

    /// A JSON string as serde_json escapes it.
    fn string(&mut self, s: &str) {
        let _ = serde_json::to_writer(&mut self.hash, s);
    }

    fn value(&mut self, v: &Value, ignored: &impl Fn(&str) -> bool) {
        match v {
            // serde_json's map iterates in key order (no preserve_order).
            Value::Object(map) => self.object(
                map.iter()
                    .filter(|(k, _)| !ignored(k))
                    .map(|(k, v)| (k.as_str(), v)),
                |h, _, v| h.value(v, ignored),
            ),
            Value::Array(a) => self.array(a, ignored),
            Value::String(s) => {
                let mut text = std::mem::take(&mut self.text);
                text.clear();
                for (i, word) in s.split_whitespace().enumerate() {
                    if i > 0 {
                        text.push(' ');
                    }
                    text.push_str(word);
                }
                self.string(&text);
                self.text = text;
            }
            other => {
                let _ = serde_json::to_writer(&mut self.hash, other);
            }
        }
    }

    /// An object of `entries` (already in key order, ignored keys already
    /// dropped), each value written by `value`.
    fn object<'v>(
        &mut self,
        entries: impl Iterator<Item = (&'v str, &'v Value)>,
        mut value: impl FnMut(&mut Self, &str, &Value),
    ) {
        self.put(b"{");
        for (i, (k, v)) in entries.enumerate() {
            if i > 0 {
                self.put(b",");
            }
            self.string(k);
            self.put(b":");
            value(self, k, v);
        }
        self.put(b"}");
    }

    fn array(&mut self, a: &[Value], ignored: &impl Fn(&str) -> bool) {
        self.put(b"[");
        for (i, v) in a.iter().enumerate() {
            if i > 0 {
                self.put(b",");
            }
            self.value(v, ignored);
        }
        self.put(b"]");
    }
}

/// Whether the ring's tail, with `next` appended, is a block repeated
/// `repeats` times. Returns the block length.
pub fn detect(
    ring: &VecDeque<Fingerprint>,
    next: &Fingerprint,
    window: usize,
    repeats: usize,
) -> Option<usize> {
    let mut seq: Vec<&Fingerprint> = ring.iter().collect();
    seq.push(next);
    let start = seq.len().saturating_sub(window);
    let seq = &seq[start..];
    let repeats = repeats.max(2);
    for len in 1..=seq.len() / repeats {
        let tail = &seq[seq.len() - len * repeats..];
        let block = &tail[..len];
        if tail.chunks(len).all(|c| c == block) {
            return Some(len);
        }
    }
    None
}

/// What the guard decided for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum LoopVerdict {
    Allow,
    /// The task is cooling down from an earlier trip.
    CoolingDown {
        retry_after: Duration,
    },
    /// This request completes a loop: the task trips now.
    Tripped(Trip),
}

/// Evidence of a trip, for the snapshot file.
#[derive(Debug, Clone, PartialEq)]
pub struct Trip {
    pub block_len: usize,
    pub trail: Vec<String>,
    pub trips: u32,
    pub cooldown: Duration,
}

/// One task's loop state: what [`TaskState::step`] reads and writes. It
/// travels through the state store as bytes ([`TaskState::encode`]), so
/// every replica judges a task on the same ring.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TaskState {
    ring: VecDeque<Fingerprint>,
    blocked_until: Option<Duration>,
    trips: u32,
    clean: u32,
    last_seen: Duration,
}

impl TaskState {
    /// Judges the task's next request, fingerprint `fp`, at `now`.
    pub fn step(&mut self, fp: Fingerprint, cfg: &LoopConfig, now: Duration) -> LoopVerdict {
        if now.saturating_sub(self.last_seen) >= cfg.idle_ttl {
            *self = TaskState::default();
        }
        self.last_seen = now;
        if let Some(until) = self.blocked_until {
            if now < until {
                return LoopVerdict::CoolingDown {
                    retry_after: until - now,
                };
            }
            // Cool-down over: this is the trial request.
            self.blocked_until = None;
            self.ring.clear();
        }
        if let Some(block_len) = detect(&self.ring, &fp, cfg.window, cfg.repeats) {
            self.trips += 1;
            self.clean = 0;
            let factor = 1u32.checked_shl(self.trips - 1).unwrap_or(u32::MAX);
            let cooldown = cfg
                .cooldown
                .checked_mul(factor)
                .unwrap_or(cfg.max_cooldown)
                .min(cfg.max_cooldown);
            self.blocked_until = Some(now + cooldown);
            let mut trail: Vec<String> = self.ring.iter().map(hex8).collect();
            trail.push(hex8(&fp));
            return LoopVerdict::Tripped(Trip {
                block_len,
                trail,
                trips: self.trips,
                cooldown,
            });
        }
        while self.ring.len() >= cfg.window.max(1) {
            self.ring.pop_front();
        }
        self.ring.push_back(fp);
        self.clean += 1;
        if self.clean >= cfg.clear_after {
            self.trips = 0;
        }
        LoopVerdict::Allow
    }

    /// Fixed little-endian layout: trips, clean (u32), blocked-until
    /// (u64 ns + 1, 0 for none), last-seen (u64 ns), then the ring.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + 32 * self.ring.len());
        out.extend_from_slice(&self.trips.to_le_bytes());
        out.extend_from_slice(&self.clean.to_le_bytes());
        let blocked = self.blocked_until.map_or(0, |d| d.as_nanos() as u64 + 1);
        out.extend_from_slice(&blocked.to_le_bytes());
        out.extend_from_slice(&(self.last_seen.as_nanos() as u64).to_le_bytes());
        for fp in &self.ring {
            out.extend_from_slice(fp);
        }
        out
    }

    /// `None` for bytes that are not an encoded state.
    pub fn decode(b: &[u8]) -> Option<TaskState> {
        if b.len() < 24 || !(b.len() - 24).is_multiple_of(32) {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let blocked = u64_at(8);
        Some(TaskState {
            trips: u32_at(0),
            clean: u32_at(4),
            blocked_until: (blocked > 0).then(|| Duration::from_nanos(blocked - 1)),
            last_seen: Duration::from_nanos(u64_at(16)),
            ring: b[24..]
                .chunks_exact(32)
                .map(|c| c.try_into().expect("32 bytes"))
                .collect(),
        })
    }
}

fn hex8(fp: &Fingerprint) -> String {
    fp[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The fingerprint as first written: build the canonical tree, then
    /// serialise it. `fingerprint` must hash exactly the same bytes (rings
    /// shared through Redis hold fingerprints from every instance).
    fn reference(endpoint: &str, body: &Value, cfg: &LoopConfig) -> Fingerprint {
        fn canonicalize(v: Value, ignore: &[String]) -> Value {
            match v {
                Value::Object(map) => Value::Object(
                    map.into_iter()
                        .filter(|(k, _)| !ignore.iter().any(|f| f == k))
                        .map(|(k, v)| (k, canonicalize(v, ignore)))
                        .collect(),
                ),
                Value::Array(a) => {
                    Value::Array(a.into_iter().map(|v| canonicalize(v, ignore)).collect())
                }
                Value::String(s) => {
                    Value::String(s.split_whitespace().collect::<Vec<_>>().join(" "))
                }
                other => other,
            }
        }
        let mut meaningful = serde_json::Map::new();
        meaningful.insert("endpoint".into(), Value::String(endpoint.into()));
        if let Value::Object(map) = body {
            for (k, v) in map {
                if cfg.ignore_fields.iter().any(|f| f == k) {
                    continue;
                }
                let v = match (k.as_str(), v) {
                    ("messages", Value::Array(msgs)) => {
                        let skip = msgs.len().saturating_sub(cfg.last_turns);
                        Value::Array(msgs[skip..].to_vec())
                    }
                    _ => v.clone(),
                };
                meaningful.insert(k.clone(), v);
            }
        }
        let canonical = canonicalize(Value::Object(meaningful), &cfg.ignore_fields);
        Sha256::digest(serde_json::to_vec(&canonical).unwrap()).into()
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let key = prop::sample::select(vec![
            "model", "messages", "user", "content", "role", "endpoint", "a b", "é\"q", "seed",
            "tools",
        ]);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (-1e6f64..1e6).prop_map(|f| json!(f)),
            "[ a-z\\t\\n\"\\\\é]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((key.clone(), inner), 0..6).prop_map(|kv| {
                    Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn streamed_fingerprint_hashes_the_reference_bytes(body in json_value(), turns in 0usize..4) {
            let cfg = LoopConfig { last_turns: turns, ..LoopConfig::default() };
            prop_assert_eq!(
                fingerprint("/v1/chat/completions", &body, &cfg),
                reference("/v1/chat/completions", &body, &cfg)
            );
        }
    }

    #[test]
    fn endpoint_key_rules_match_the_reference() {
        let mut cfg = LoopConfig::default();
        let body = json!({"endpoint": "x", "model": "m"});
        assert_eq!(fingerprint("/e", &body, &cfg), reference("/e", &body, &cfg));
        cfg.ignore_fields.push("endpoint".into());
        assert_eq!(fingerprint("/e", &body, &cfg), reference("/e", &body, &cfg));
        let not_object = json!([1, 2]);
        assert_eq!(
            fingerprint("/e", &not_object, &cfg),
            reference("/e", &not_object, &cfg)
        );
    }

    const S: Duration = Duration::from_secs(1);

    fn fp(v: Value) -> Fingerprint {
        fingerprint("/v1/chat/completions", &v, &LoopConfig::default())
    }

    #[test]
    fn noise_key_order_and_whitespace_do_not_change_the_fingerprint() {
        let a = fp(
            json!({"model": "m", "messages": [{"role": "user", "content": "find  the\norder"}], "user": "u1", "metadata": {"ts": 1}}),
        );
        let b = fp(
            json!({"messages": [{"content": " find the order ", "role": "user", "request_id": "r9"}], "model": "m", "user": "u2", "stream": true}),
        );
        assert_eq!(a, b);
        let c = fp(
            json!({"model": "m", "messages": [{"role": "user", "content": "find the invoice"}]}),
        );
        assert_ne!(a, c);
        let d = fp(
            json!({"model": "other", "messages": [{"role": "user", "content": "find the order"}]}),
        );
        assert_ne!(a, d);
    }

    #[test]
    fn only_the_last_turns_count_and_tool_arguments_matter() {
        let call = |args: &str| json!({"role": "assistant", "tool_calls": [{"function": {"name": "search", "arguments": args}}]});
        let a = fp(
            json!({"model": "m", "messages": [{"role": "user", "content": "long history 1"}, call("{\"q\":\"x\"}"), {"role": "tool", "content": "none"}]}),
        );
        let b = fp(
            json!({"model": "m", "messages": [{"role": "user", "content": "other history"}, {"role": "user", "content": "more"}, call("{\"q\":\"x\"}"), {"role": "tool", "content": "none"}]}),
        );
        assert_eq!(
            a, b,
            "history before the last 2 turns is not part of the call"
        );
        let c = fp(
            json!({"model": "m", "messages": [call("{\"q\":\"y\"}"), {"role": "tool", "content": "none"}]}),
        );
        assert_ne!(a, c);
    }

    fn ring(ids: &[u8]) -> VecDeque<Fingerprint> {
        ids.iter().map(|i| [*i; 32]).collect()
    }

    #[test]
    fn detection() {
        assert_eq!(detect(&ring(&[1, 1]), &[1; 32], 10, 3), Some(1));
        assert_eq!(detect(&ring(&[1]), &[1; 32], 10, 3), None);
        assert_eq!(
            detect(&ring(&[1, 2, 1, 2, 1]), &[2; 32], 10, 3),
            Some(2),
            "A,B,A,B,A,B trips"
        );
        assert_eq!(
            detect(&ring(&[1, 2, 3, 1, 2, 3, 1, 2]), &[3; 32], 10, 3),
            Some(3)
        );
        assert_eq!(detect(&ring(&[1, 2, 1, 3, 1]), &[2; 32], 10, 3), None);
        // Outside the window does not count.
        assert_eq!(
            detect(&ring(&[1, 1, 2, 3, 4, 5, 6, 7, 8, 9]), &[1; 32], 10, 3),
            None
        );
    }

    /// Tasks' loop states by key, each stepped by the pure
    /// [`TaskState::step`] (as the store holds them, without its bounds).
    #[derive(Default)]
    struct Tasks(std::collections::HashMap<String, TaskState>);

    impl Tasks {
        fn check(
            &mut self,
            key: &str,
            fp: Fingerprint,
            cfg: &LoopConfig,
            now: Duration,
        ) -> LoopVerdict {
            self.0
                .entry(key.to_string())
                .or_default()
                .step(fp, cfg, now)
        }
    }

    /// Loop rings kept in a memory store as the gateway keeps them: a
    /// `loop:<agent>/<task>` record each, stepped by `step_record`.
    struct Stored {
        store: loopgate_policy::MemoryStore,
    }

    impl Stored {
        fn check(
            &self,
            key: &str,
            fp: Fingerprint,
            cfg: &LoopConfig,
            now: Duration,
        ) -> LoopVerdict {
            let clock = loopgate_policy::ManualClock::default();
            clock.set(now);
            let step = |task: Option<TaskState>, now| {
                let mut task = task.unwrap_or_default();
                let verdict = task.step(fp, cfg, now);
                (Some(task.encode()), verdict)
            };
            let ttl = cfg.idle_ttl.max(cfg.max_cooldown);
            let key = format!("loop:{key}");
            let stepped = loopgate_policy::step_record(
                &self.store,
                &clock,
                &key,
                ttl,
                TaskState::decode,
                step,
            );
            ready(stepped).expect("the memory store answers")
        }

        fn len(&self) -> usize {
            self.store.records_len().unwrap()
        }
    }

    /// The output of `f`, ready at its first poll (the memory store never
    /// waits).
    fn ready<F: std::future::Future>(f: F) -> F::Output {
        use std::task::{Context, Poll, Waker};
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("the future waited"),
        }
    }

    #[test]
    fn stored_rings_stay_within_the_agents_bound_in_constant_time_per_task() {
        const CAPACITY: usize = 100_000;
        let g = Stored {
            store: loopgate_policy::MemoryStore::with_record_capacity(CAPACITY),
        };
        let cfg = LoopConfig::default();
        let t0 = std::time::Instant::now();
        for i in 0..(3 * CAPACITY) as u32 {
            g.check(&format!("agent/task-{i}"), [1; 32], &cfg, S);
        }
        // Printed, not judged: a full map costs no more per new task than an
        // empty one (the old map scanned every task once full).
        println!(
            "loop guard: {} new tasks in {:?}",
            3 * CAPACITY,
            t0.elapsed()
        );
        assert_eq!(g.len(), CAPACITY);
        // The most recent task kept its ring: its second repeat is counted.
        let last = format!("agent/task-{}", 3 * CAPACITY - 1);
        g.check(&last, [1; 32], &cfg, S);
        assert!(matches!(
            g.check(&last, [1; 32], &cfg, S),
            LoopVerdict::Tripped(_)
        ));
    }

    #[test]
    fn idle_tasks_are_dropped_lazily_and_start_over() {
        let g = Stored {
            store: loopgate_policy::MemoryStore::with_record_capacity(10),
        };
        let cfg = LoopConfig::default();
        let ttl = cfg.idle_ttl.max(cfg.max_cooldown);
        for i in 0..5 {
            g.check(&format!("ag/t{i}"), [1; 32], &cfg, S);
        }
        g.check("ag/late", [1; 32], &cfg, ttl + S);
        assert_eq!(g.len(), 1);
        // Idle past idle_ttl, a ring is forgotten even where it is still
        // kept: two repeats before the gap and one after are no loop.
        let mut t = TaskState::default();
        t.step([1; 32], &cfg, S);
        t.step([1; 32], &cfg, 2 * S);
        assert_eq!(
            t.step([1; 32], &cfg, cfg.idle_ttl + 2 * S),
            LoopVerdict::Allow
        );
    }

    #[test]
    fn a_twelve_step_task_calling_one_tool_twice_is_not_a_loop() {
        let mut g = Tasks::default();
        let cfg = LoopConfig::default();
        let steps = [1u8, 2, 3, 4, 5, 4, 6, 7, 8, 9, 10, 11];
        for (i, s) in steps.iter().enumerate() {
            assert_eq!(
                g.check("t", [*s; 32], &cfg, S * i as u32),
                LoopVerdict::Allow,
                "step {i}"
            );
        }
    }

    #[test]
    fn trips_on_the_third_repeat_then_cools_down_with_backoff_and_recovers() {
        let mut g = Tasks::default();
        let cfg = LoopConfig::default();
        assert_eq!(g.check("t", [7; 32], &cfg, S), LoopVerdict::Allow);
        assert_eq!(g.check("t", [7; 32], &cfg, 2 * S), LoopVerdict::Allow);
        let LoopVerdict::Tripped(trip) = g.check("t", [7; 32], &cfg, 3 * S) else {
            panic!()
        };
        assert_eq!(
            (trip.block_len, trip.trips, trip.cooldown, trip.trail.len()),
            (1, 1, 30 * S, 3)
        );
        assert_eq!(
            g.check("t", [8; 32], &cfg, 10 * S),
            LoopVerdict::CoolingDown {
                retry_after: 23 * S
            }
        );
        // Other tasks are unaffected.
        assert_eq!(g.check("u", [7; 32], &cfg, 10 * S), LoopVerdict::Allow);
        // After the cool-down a trial request passes; looping again doubles it.
        assert_eq!(g.check("t", [7; 32], &cfg, 33 * S), LoopVerdict::Allow);
        assert_eq!(g.check("t", [7; 32], &cfg, 34 * S), LoopVerdict::Allow);
        let LoopVerdict::Tripped(trip) = g.check("t", [7; 32], &cfg, 35 * S) else {
            panic!()
        };
        assert_eq!((trip.trips, trip.cooldown), (2, 60 * S));
        // After that cool-down, clear_after clean requests reset the back-off.
        for i in 0..5u8 {
            assert_eq!(
                g.check("t", [20 + i; 32], &cfg, 100 * S),
                LoopVerdict::Allow
            );
        }
        for _ in 0..2 {
            g.check("t", [9; 32], &cfg, 101 * S);
        }
        let LoopVerdict::Tripped(trip) = g.check("t", [9; 32], &cfg, 102 * S) else {
            panic!()
        };
        assert_eq!((trip.trips, trip.cooldown), (1, 30 * S));
    }

    #[test]
    fn task_state_survives_encoding() {
        let cfg = LoopConfig::default();
        let mut t = TaskState::default();
        for (i, fp) in [[1u8; 32], [2; 32], [1; 32], [2; 32]]
            .into_iter()
            .enumerate()
        {
            t.step(fp, &cfg, S * i as u32);
        }
        let mut back = TaskState::decode(&t.encode()).unwrap();
        assert_eq!(back, t);
        // The decoded state judges the same: the next [1],[2] completes the loop.
        back.step([1; 32], &cfg, 10 * S);
        assert!(matches!(
            back.step([2; 32], &cfg, 11 * S),
            LoopVerdict::Tripped(_)
        ));
        assert_eq!(TaskState::decode(b"short"), None);
        assert_eq!(TaskState::decode(&[0u8; 25]), None);
    }

    #[test]
    fn backoff_is_capped() {
        let mut g = Tasks::default();
        let cfg = LoopConfig {
            cooldown: 30 * S,
            max_cooldown: 100 * S,
            ..LoopConfig::default()
        };
        let mut now = Duration::ZERO;
        let mut last = Duration::ZERO;
        for _ in 0..5 {
            for _ in 0..2 {
                g.check("t", [1; 32], &cfg, now);
            }
            if let LoopVerdict::Tripped(t) = g.check("t", [1; 32], &cfg, now) {
                last = t.cooldown;
                now += t.cooldown;
            }
        }
        assert_eq!(last, 100 * S);
    }
}
