//! Shared limit state behind one small interface.
//!
//! Everything several gateway replicas must agree on (request and token
//! windows and budgets, in-flight slots, idempotency records, and the
//! per-task records of the guards: loop rings, watchdog counts, tool
//! failure streaks, MCP session bindings) goes through [`StateStore`]. One
//! call, [`StateStore::admit`], checks and takes every limit that applies
//! to a request atomically: all of them or none, so a request refused by
//! its token limit does not use up a request slot, and a networked store
//! needs one round trip per admission. A record changes only through
//! [`step_record`]: a pure step over its decoded value, written back by
//! compare-and-swap. [`MemoryStore`] is the embedded default for a single
//! instance; it bounds each kind of record per agent.
//!
//! Windows are sliding windows kept in [`SLICES`] slices: a cost admitted at
//! time `t` counts until the end of its slice plus `window`, never less, so
//! within any interval of length `window` the admitted cost never exceeds
//! `limit` (the guarantee a log of every admission gives), while a window
//! holds at most `SLICES + 1` numbers however many requests it admits. The
//! price is that a cost leaves the window up to one slice (1/600 of the
//! window: 100 ms of a minute, 144 s of a day) after its exact time, and
//! `retry_after` says exactly when the store will admit the request. (A log
//! of every admission held a day's requests for a daily budget: ~32 bytes
//! each here, and every member in Redis.)

use crate::clock::Clock;
use async_trait::async_trait;
use loopgate_bounded::Partitioned;
use std::collections::VecDeque;
// ahash, not SipHash: these maps are looked up on every request, and keys
// agents influence (task ids) still get a randomly keyed, DoS-resistant hash.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Take `cost` from a sliding window of `limit` per `window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowTake {
    /// Shared, not copied: an agent's keys are built once, and the lease
    /// and the memory store keep them without a copy per request.
    pub key: Arc<str>,
    pub limit: u64,
    pub window: Duration,
    pub cost: u64,
    /// `false` in dry-run: taken even when over the limit, and reported.
    pub enforce: bool,
}

/// Take one of `limit` concurrency slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotTake {
    pub key: Arc<str>,
    pub limit: u64,
    pub enforce: bool,
}

/// Which limit refused, and when the same request could fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `windows[index]` is full; `retry_after` is `None` when the cost
    /// exceeds the limit itself and can never fit.
    Window {
        index: usize,
        retry_after: Option<Duration>,
    },
    /// `slots[index]` are all taken.
    Slot { index: usize },
}

/// What an admission holds until it is settled and released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub id: u64,
    /// Taken from a local fallback store while the shared one was away
    /// (`on_unavailable: local`): settle and release go back there.
    pub degraded: bool,
    windows: Vec<Arc<str>>,
    slots: Vec<Arc<str>>,
}

impl Lease {
    /// A lease holding nothing (no limits applied).
    pub fn empty() -> Lease {
        Lease {
            id: 0,
            degraded: false,
            windows: Vec::new(),
            slots: Vec::new(),
        }
    }

    /// A lease a store implementation hands out for `id`.
    pub fn new(id: u64, windows: Vec<Arc<str>>, slots: Vec<Arc<str>>) -> Lease {
        Lease {
            id,
            degraded: false,
            windows,
            slots,
        }
    }

    /// The window keys this lease took from.
    pub fn windows(&self) -> &[Arc<str>] {
        &self.windows
    }

    /// The concurrency slots this lease holds.
    pub fn slots(&self) -> &[Arc<str>] {
        &self.slots
    }

    pub fn holds_window(&self, key: &str) -> bool {
        self.windows.iter().any(|k| &**k == key)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmitOutcome {
    /// Everything was taken. `would_refuse` reports a dry-run limit that
    /// would have refused.
    Taken {
        lease: Lease,
        would_refuse: Option<Refusal>,
        /// Per window (same order as asked): what is left after this take.
        remaining: Vec<u64>,
    },
    /// An enforced limit refused; nothing was taken.
    Refused(Refusal),
}

/// The store could not answer; admission must deny (fail closed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "state store unavailable: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

/// A recorded tool response, replayed for a repeated idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdemRecord {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

/// How the first request with an idempotency key ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdemOutcome {
    /// Answered, and the answer is recorded.
    Done(IdemRecord),
    /// Sent, but no (complete) answer came: it may or may not have acted.
    Failed,
    /// Answered, but too large to record for replay.
    Unrecorded,
}

/// What `idem_begin` found for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdemBegin {
    /// First use (or a retry allowed after a failure): forward it.
    Fresh,
    InFlight,
    Ended(IdemOutcome),
    /// The key was used with another body.
    Mismatch,
}

#[async_trait]
pub trait StateStore: Send + Sync + fmt::Debug {
    /// Claims idempotency key `key` for a body with SHA-256 `body_sha`, for
    /// `ttl`. Atomic: of two concurrent duplicates exactly one is `Fresh`.
    /// With `retry_failed`, a key whose first request failed is claimed again.
    async fn idem_begin(
        &self,
        now: Duration,
        key: &str,
        body_sha: [u8; 32],
        ttl: Duration,
        retry_failed: bool,
    ) -> Result<IdemBegin, StoreError>;

    /// Records how the claimed request ended; `None` forgets the key (the
    /// request never reached the tool, so repeating it is safe).
    async fn idem_finish(
        &self,
        now: Duration,
        key: &str,
        outcome: Option<IdemOutcome>,
    ) -> Result<(), StoreError>;

    /// Checks every window and slot and takes them all, or none.
    async fn admit(
        &self,
        now: Duration,
        windows: &[WindowTake],
        slots: &[SlotTake],
    ) -> Result<AdmitOutcome, StoreError>;

    /// Replaces the cost the lease took from window `key` with `actual`
    /// (e.g. the tokens the provider reported instead of the estimate).
    async fn settle(
        &self,
        now: Duration,
        lease: &Lease,
        key: &str,
        actual: u64,
    ) -> Result<(), StoreError>;

    /// Returns the lease's concurrency slots. Call once per lease.
    async fn release(&self, lease: &Lease) -> Result<(), StoreError>;

    /// Ends an admission: settles each `(window key, actual cost)`, forgets
    /// the lease in every window it took from (after this, a settle of it
    /// changes nothing) and releases the slots. A networked store does it
    /// in one round trip. Call once per lease. (This default settles and
    /// releases; a store that keeps open leases overrides it to forget them.)
    async fn finish(
        &self,
        now: Duration,
        lease: &Lease,
        settle: &[(&str, u64)],
    ) -> Result<(), StoreError> {
        let mut result = Ok(());
        for (key, actual) in settle {
            if let Err(e) = self.settle(now, lease, key, *actual).await {
                result = Err(e);
            }
        }
        // The slots go back even when a settle failed.
        self.release(lease).await.and(result)
    }

    /// A small versioned record (a task's loop ring, watchdog count, tool
    /// streak; an MCP session binding): its version and bytes.
    /// Read-modify-write goes through [`StateStore::record_swap`] (see
    /// [`step_record`]), so the logic that changes a record lives in Rust,
    /// once, for every store.
    async fn record_get(
        &self,
        now: Duration,
        key: &str,
    ) -> Result<Option<(u64, Vec<u8>)>, StoreError>;

    /// Replaces the record if its version is still `version` (`None`: if it
    /// does not exist), keeping it for `ttl`. `false`: someone else changed
    /// it first; read again and retry.
    async fn record_swap(
        &self,
        now: Duration,
        key: &str,
        version: Option<u64>,
        value: Vec<u8>,
        ttl: Duration,
    ) -> Result<bool, StoreError>;
}

/// What each window `(key, window)` holds now, read through the one
/// primitive every store has: an admission of nothing, never refused,
/// finished at once (it leaves no cost and no open lease behind). For the
/// admin API, not the request path. Sums are exact below 2^52 (Redis
/// keeps numbers as doubles): 4.5 billion dollars in micro-dollars.
pub async fn window_sums(
    store: &dyn StateStore,
    now: Duration,
    windows: &[(Arc<str>, Duration)],
) -> Result<Vec<u64>, StoreError> {
    const CEILING: u64 = MAX_SUM;
    let takes: Vec<WindowTake> = windows
        .iter()
        .map(|(key, window)| WindowTake {
            key: key.clone(),
            limit: CEILING,
            window: *window,
            cost: 0,
            enforce: false,
        })
        .collect();
    if takes.is_empty() {
        return Ok(Vec::new());
    }
    match store.admit(now, &takes, &[]).await? {
        AdmitOutcome::Taken {
            lease, remaining, ..
        } => {
            store.finish(now, &lease, &[]).await?;
            Ok(remaining
                .iter()
                .map(|r| CEILING.saturating_sub(*r))
                .collect())
        }
        AdmitOutcome::Refused(_) => Err(StoreError("a read of the windows was refused".into())),
    }
}

/// Why [`step_record`] could not step a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepError {
    /// The store could not answer.
    Store(StoreError),
    /// Every try lost the race to another writer of the same record.
    Contended,
}

/// How many times [`step_record`] reads again after losing a race.
pub const STEP_TRIES: usize = 8;

/// Runs one step on a record (a task's loop ring, watchdog count, tool
/// streak) in `store`: read, step (a pure function of the decoded state,
/// `None` if there is none, and the time; it returns the new bytes,
/// `None` to leave the record alone, and a verdict), write back if nobody
/// else wrote since (a request of the same task on another replica); else
/// read again, at most [`STEP_TRIES`] times. Bytes that do not decode
/// count as no state. The one read-modify-write every record goes
/// through, whatever the store.
pub async fn step_record<T, V>(
    store: &dyn StateStore,
    clock: &dyn Clock,
    key: &str,
    ttl: Duration,
    decode: fn(&[u8]) -> Option<T>,
    mut step: impl FnMut(Option<T>, Duration) -> (Option<Vec<u8>>, V),
) -> Result<V, StepError> {
    for _ in 0..STEP_TRIES {
        let now = clock.now();
        let (version, state) = match store.record_get(now, key).await {
            Ok(Some((v, bytes))) => (Some(v), decode(&bytes)),
            Ok(None) => (None, None),
            Err(e) => return Err(StepError::Store(e)),
        };
        let (bytes, verdict) = step(state, now);
        let Some(bytes) = bytes else {
            return Ok(verdict);
        };
        match store.record_swap(now, key, version, bytes, ttl).await {
            Ok(true) => return Ok(verdict),
            Ok(false) => continue, // another writer got there first
            Err(e) => return Err(StepError::Store(e)),
        }
    }
    Err(StepError::Contended)
}

/// How many slices a window is kept in.
pub const SLICES: u32 = 600;

/// The most one admission takes from a window, and the most a settle sets
/// a lease's cost to (2^50: over a billion dollars in micro-dollars, over
/// a quadrillion tokens): larger costs are clamped to it. Costs come from
/// what agents ask (`max_tokens` up to 2^64-1) and what upstreams report,
/// so they are bounded where they enter a store: a window's sum stays an
/// exact integer on Redis (which keeps numbers as doubles, exact below
/// 2^53; a sum past 2^63 was written as `1.8e+19`, and every later
/// admission of that window failed "hash value is not an integer"), and
/// saturating sums in memory never wrap (a wrapped settle made recorded
/// spend go down). A cost this large never fits a real limit anyway.
pub const MAX_COST: u64 = 1 << 50;

/// What a window holds at most ([`window_sums`]' ceiling too): sums
/// saturate here in every store, so a sum stays exact on Redis however
/// many clamped costs it takes.
pub const MAX_SUM: u64 = 1 << 52;

// A clamped cost fits a sum, and a sum is exact as a double.
const _: () = assert!(MAX_COST < MAX_SUM && MAX_SUM < 1 << 53);

/// The slice width of a window of `window`: 1/[`SLICES`] of it in whole
/// milliseconds, at least one. Every store slices the same way, so they
/// judge alike (the conformance suite holds them to it).
pub fn slice_of(window: Duration) -> Duration {
    Duration::from_millis((window.as_millis() / u128::from(SLICES)).max(1) as u64)
}

/// When the slice holding `now` ends: slices are aligned to multiples of
/// their width since the clock's zero, so replicas slice alike.
pub fn slice_end(now: Duration, window: Duration) -> Duration {
    let width = slice_of(window).as_millis();
    let end = (now.as_millis() / width + 1) * width;
    Duration::from_millis(end as u64)
}

/// One sliding window: the cost admitted in each slice, oldest first, and
/// the leases not yet finished (which slice they took from, and how much),
/// so a settle can correct its own estimate.
#[derive(Debug, Default)]
struct WindowLog {
    slices: VecDeque<Slice>,
    sum: u64,
    open: HashMap<u64, (Duration, u64)>,
}

#[derive(Debug, Clone, Copy)]
struct Slice {
    end: Duration,
    cost: u64,
}

impl WindowLog {
    /// Drops the slices that no longer overlap `(now - window, now]`.
    fn expire(&mut self, now: Duration, window: Duration) {
        while let Some(s) = self.slices.front() {
            if s.end + window <= now {
                self.sum = self.sum.saturating_sub(s.cost);
                self.slices.pop_front();
            } else {
                break;
            }
        }
    }

    /// `None` if `cost` fits now; otherwise how long until it does (`None`
    /// inside when it never can).
    fn check(
        &self,
        now: Duration,
        window: Duration,
        limit: u64,
        cost: u64,
    ) -> Option<Option<Duration>> {
        if self.sum.saturating_add(cost) <= limit {
            return None;
        }
        if cost > limit {
            return Some(None);
        }
        let mut remaining = self.sum;
        for s in &self.slices {
            remaining = remaining.saturating_sub(s.cost);
            if remaining.saturating_add(cost) <= limit {
                return Some(Some((s.end + window).saturating_sub(now)));
            }
        }
        Some(Some(Duration::ZERO))
    }

    fn push(&mut self, now: Duration, window: Duration, cost: u64, lease: u64) {
        let end = slice_end(now, window);
        self.sum = add_cost(self.sum, cost);
        match self.slices.back_mut() {
            Some(last) if last.end == end => last.cost = add_cost(last.cost, cost),
            Some(last) if last.end > end => {
                // The window got shorter (a reload changed a task budget's
                // length): slices stay ordered by end, as Redis's zset keeps
                // them, so expiry and Retry-After still read them in order.
                match self.slices.binary_search_by_key(&end, |s| s.end) {
                    Ok(i) => self.slices[i].cost = add_cost(self.slices[i].cost, cost),
                    Err(i) => self.slices.insert(i, Slice { end, cost }),
                }
            }
            _ => self.slices.push_back(Slice { end, cost }),
        }
        self.open.insert(lease, (end, cost));
    }

    /// Sets the cost `lease` took to `actual` (a repeat changes nothing);
    /// once its slice has aged out there is nothing left to correct.
    fn settle(&mut self, lease: u64, actual: u64) {
        let Some((end, taken)) = self.open.get_mut(&lease) else {
            return;
        };
        if let Ok(i) = self.slices.binary_search_by_key(end, |s| s.end) {
            let slice = &mut self.slices[i];
            slice.cost = add_cost(slice.cost.saturating_sub(*taken), actual);
            self.sum = add_cost(self.sum.saturating_sub(*taken), actual);
        }
        *taken = actual;
    }

    /// Forgets a finished lease: a later settle of it changes nothing.
    fn close(&mut self, lease: u64) {
        self.open.remove(&lease);
    }

    /// Forgets open leases whose slice aged out (run by the sweep), so one
    /// that was never finished cannot pile up.
    fn forget_aged(&mut self, now: Duration, window: Duration) {
        self.open.retain(|_, (end, _)| *end + window > now);
    }

    fn is_empty(&self) -> bool {
        self.slices.is_empty() && self.open.is_empty()
    }
}

/// `sum + cost`, saturating at [`MAX_SUM`] (as the Redis store's scripts
/// do).
fn add_cost(sum: u64, cost: u64) -> u64 {
    sum.saturating_add(cost).min(MAX_SUM)
}

#[derive(Debug)]
struct IdemEntry {
    sha: [u8; 32],
    outcome: Option<IdemOutcome>,
    expires: Duration,
}

#[derive(Debug)]
struct Record {
    version: u64,
    value: Vec<u8>,
    expires: Duration,
}

#[derive(Debug, Default)]
struct Inner {
    windows: HashMap<Arc<str>, (WindowLog, Duration)>,
    slots: HashMap<Arc<str>, u64>,
    admissions: u64,
    idem: HashMap<String, IdemEntry>,
}

const SWEEP_EVERY: u64 = 1024;

/// Most records the memory store keeps for one owner (see
/// [`StateStore::record_get`]), by default: a key's owner is its text up
/// to the first `/`, so each kind of record of each agent (`loop:<agent>`
/// rings, `watch:<agent>` counts, `streak:<agent>` tool streaks) has its
/// own bound (`state.tasks_per_agent`). Past it the owner's least
/// recently written goes first, in O(1), never another owner's. About 450
/// bytes each with a default ring: some 45 MB for an agent at its bound.
pub const MAX_RECORDS: usize = 100_000;

/// Keys of MCP session bindings start with this: they are kept apart from
/// task records and never pushed out to make room; an owner (agent) holds
/// at most [`MAX_SESSIONS`] of them, and a new one past that is refused.
pub const SESSION_PREFIX: &str = "mcp-session:";

/// Most live MCP sessions one agent may hold in the memory store.
pub const MAX_SESSIONS: usize = 10_000;

/// The embedded, single-instance store.
#[derive(Debug)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    next_lease: AtomicU64,
    /// Records live apart from `inner`, sharded and bounded per owner:
    /// task ids are the agent's choice, so their number must not grow
    /// without limit nor cost a scan when it is high, and one agent's
    /// must not push out another's.
    records: Partitioned<Record>,
    /// MCP session bindings, per owner, never pushed out for room.
    sessions: Partitioned<Record>,
    /// Every write gets a fresh version, store-wide: a record pushed out
    /// and written again never reuses a version a reader still holds.
    record_version: AtomicU64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::with_record_capacity(MAX_RECORDS)
    }
}

fn records_poisoned() -> StoreError {
    StoreError("memory store records poisoned".into())
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// A store of at most `capacity` records (at least 1) per owner.
    pub fn with_record_capacity(capacity: usize) -> MemoryStore {
        MemoryStore::with_capacities(capacity, MAX_SESSIONS)
    }

    /// At most `records` task records and `sessions` session bindings per
    /// owner (each at least 1).
    pub fn with_capacities(records: usize, sessions: usize) -> MemoryStore {
        MemoryStore {
            inner: Mutex::default(),
            next_lease: AtomicU64::new(0),
            records: Partitioned::new(records),
            sessions: Partitioned::new(sessions),
            record_version: AtomicU64::new(0),
        }
    }

    /// Records kept now, sessions included (every shard locked in turn:
    /// not for the request path).
    pub fn records_len(&self) -> Result<usize, StoreError> {
        let n = self.records.len().map_err(|_| records_poisoned())?;
        Ok(n + self.sessions.len().map_err(|_| records_poisoned())?)
    }

    /// The owner map holding `key`: sessions apart from task records.
    fn records_of(&self, key: &str) -> &Partitioned<Record> {
        match key.starts_with(SESSION_PREFIX) {
            true => &self.sessions,
            false => &self.records,
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, StoreError> {
        self.inner
            .lock()
            .map_err(|_| StoreError("memory store lock poisoned".into()))
    }

    /// In-flight count for `key` (tests and metrics).
    pub fn in_flight(&self, key: &str) -> u64 {
        self.lock()
            .map(|i| i.slots.get(key).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

#[async_trait]
impl StateStore for MemoryStore {
    async fn admit(
        &self,
        now: Duration,
        windows: &[WindowTake],
        slots: &[SlotTake],
    ) -> Result<AdmitOutcome, StoreError> {
        let mut inner = self.lock()?;
        let mut would_refuse = None;
        for (index, w) in windows.iter().enumerate() {
            let (log, _) = inner
                .windows
                .entry(w.key.clone())
                .or_insert_with(|| (WindowLog::default(), w.window));
            log.expire(now, w.window);
            if let Some(retry_after) = log.check(now, w.window, w.limit, w.cost.min(MAX_COST)) {
                let refusal = Refusal::Window { index, retry_after };
                if w.enforce {
                    return Ok(AdmitOutcome::Refused(refusal));
                }
                would_refuse.get_or_insert(refusal);
            }
        }
        for (index, s) in slots.iter().enumerate() {
            let used = inner.slots.get(&*s.key).copied().unwrap_or(0);
            if used >= s.limit {
                let refusal = Refusal::Slot { index };
                if s.enforce {
                    return Ok(AdmitOutcome::Refused(refusal));
                }
                would_refuse.get_or_insert(refusal);
            }
        }
        let id = self.next_lease.fetch_add(1, Ordering::Relaxed) + 1;
        let mut remaining = Vec::with_capacity(windows.len());
        for w in windows {
            if let Some((log, window)) = inner.windows.get_mut(&*w.key) {
                *window = w.window;
                log.push(now, w.window, w.cost.min(MAX_COST), id);
                remaining.push(w.limit.saturating_sub(log.sum));
            }
        }
        // Now and then, drop windows whose entries all aged out, so per-task
        // keys do not pile up (amortised: one sweep per SWEEP_EVERY admissions).
        inner.admissions += 1;
        if inner.admissions % SWEEP_EVERY == 0 {
            inner.windows.retain(|_, (log, window)| {
                log.expire(now, *window);
                log.forget_aged(now, *window);
                !log.is_empty()
            });
            inner.idem.retain(|_, e| e.expires > now);
        }
        for s in slots {
            *inner.slots.entry(s.key.clone()).or_insert(0) += 1;
        }
        Ok(AdmitOutcome::Taken {
            lease: Lease::new(
                id,
                windows.iter().map(|w| w.key.clone()).collect(),
                slots.iter().map(|s| s.key.clone()).collect(),
            ),
            would_refuse,
            remaining,
        })
    }

    async fn settle(
        &self,
        now: Duration,
        lease: &Lease,
        key: &str,
        actual: u64,
    ) -> Result<(), StoreError> {
        if !lease.holds_window(key) {
            return Ok(());
        }
        let mut inner = self.lock()?;
        if let Some((log, window)) = inner.windows.get_mut(key) {
            let window = *window;
            log.settle(lease.id, actual.min(MAX_COST));
            log.expire(now, window);
        }
        Ok(())
    }

    async fn idem_begin(
        &self,
        now: Duration,
        key: &str,
        body_sha: [u8; 32],
        ttl: Duration,
        retry_failed: bool,
    ) -> Result<IdemBegin, StoreError> {
        let mut inner = self.lock()?;
        let fresh = IdemEntry {
            sha: body_sha,
            outcome: None,
            expires: now + ttl,
        };
        let Some(e) = inner.idem.get_mut(key).filter(|e| e.expires > now) else {
            inner.idem.insert(key.to_string(), fresh);
            return Ok(IdemBegin::Fresh);
        };
        if e.sha != body_sha {
            return Ok(IdemBegin::Mismatch);
        }
        Ok(match &e.outcome {
            None => IdemBegin::InFlight,
            Some(IdemOutcome::Failed) if retry_failed => {
                *e = fresh;
                IdemBegin::Fresh
            }
            Some(o) => IdemBegin::Ended(o.clone()),
        })
    }

    async fn idem_finish(
        &self,
        now: Duration,
        key: &str,
        outcome: Option<IdemOutcome>,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        match outcome {
            None => {
                inner.idem.remove(key);
            }
            Some(o) => {
                if let Some(e) = inner.idem.get_mut(key).filter(|e| e.expires > now) {
                    e.outcome = Some(o);
                }
            }
        }
        Ok(())
    }

    async fn record_get(
        &self,
        now: Duration,
        key: &str,
    ) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        let Some(owner) = self
            .records_of(key)
            .existing(key)
            .map_err(|_| records_poisoned())?
        else {
            return Ok(None);
        };
        let mut shard = owner.shard(key).map_err(|_| records_poisoned())?;
        let found = shard
            .peek_mut(key)
            .filter(|r| r.expires > now)
            .map(|r| (r.version, r.value.clone()));
        Ok(found)
    }

    async fn record_swap(
        &self,
        now: Duration,
        key: &str,
        version: Option<u64>,
        value: Vec<u8>,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let session = key.starts_with(SESSION_PREFIX);
        let owner = self
            .records_of(key)
            .of(key)
            .map_err(|_| records_poisoned())?;
        let mut shard = owner.shard(key).map_err(|_| records_poisoned())?;
        shard.expire(|r| r.expires <= now);
        let current = shard
            .peek_mut(key)
            .filter(|r| r.expires > now)
            .map(|r| r.version);
        if current != version {
            return Ok(false);
        }
        if session && current.is_none() && !shard.has_room() && shard.peek_mut(key).is_none() {
            // A live session is never pushed out to make room.
            return Ok(false);
        }
        let record = Record {
            version: self.record_version.fetch_add(1, Ordering::Relaxed) + 1,
            value,
            expires: now + ttl,
        };
        *shard.touch(key, || Record {
            version: 0,
            value: Vec::new(),
            expires: Duration::ZERO,
        }) = record;
        Ok(true)
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        if lease.slots.is_empty() {
            return Ok(());
        }
        release_slots(&mut *self.lock()?, lease);
        Ok(())
    }

    /// Settles, forgets the lease in every window it took from and frees
    /// its slots, under one lock.
    async fn finish(
        &self,
        now: Duration,
        lease: &Lease,
        settle: &[(&str, u64)],
    ) -> Result<(), StoreError> {
        if lease.windows.is_empty() && lease.slots.is_empty() {
            return Ok(());
        }
        let mut inner = self.lock()?;
        for key in &lease.windows {
            if let Some((log, window)) = inner.windows.get_mut(&**key) {
                if let Some((_, actual)) = settle.iter().find(|(k, _)| *k == &**key) {
                    log.settle(lease.id, (*actual).min(MAX_COST));
                }
                log.close(lease.id);
                let window = *window;
                log.expire(now, window);
            }
        }
        release_slots(&mut inner, lease);
        Ok(())
    }
}

fn release_slots(inner: &mut Inner, lease: &Lease) {
    for key in &lease.slots {
        if let Some(n) = inner.slots.get_mut(key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                inner.slots.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIN: Duration = Duration::from_secs(60);

    fn take(limit: u64, cost: u64) -> WindowTake {
        WindowTake {
            key: "a:rpm".into(),
            limit,
            window: MIN,
            cost,
            enforce: true,
        }
    }

    fn admit(s: &MemoryStore, now: Duration, w: &[WindowTake], sl: &[SlotTake]) -> AdmitOutcome {
        futures_lite_block_on(s.admit(now, w, sl)).unwrap()
    }

    /// A tiny executor so tests need no runtime for a store that never waits.
    fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn records_stay_within_their_capacity_and_versions_are_never_reused() {
        let s = MemoryStore::with_record_capacity(1000);
        let ttl = 3600 * Duration::from_secs(1);
        let t = Duration::from_secs(1);
        let swap = |now, key: &str, v: Option<u64>, value: &[u8]| {
            futures_lite_block_on(s.record_swap(now, key, v, value.to_vec(), ttl)).unwrap()
        };
        let get = |now, key: &str| futures_lite_block_on(s.record_get(now, key)).unwrap();
        assert!(swap(t, "loop:victim/task-0", None, b"v"));
        assert!(swap(t, "loop:ag/task-0", None, b"a"));
        let (v0, _) = get(t, "loop:ag/task-0").unwrap();
        for i in 1..50_000 {
            assert!(swap(t, &format!("loop:ag/task-{i}"), None, &[1]));
        }
        // Each owner within its own bound; the flood took nothing from
        // another owner.
        assert_eq!(s.records_len().unwrap(), 1001);
        assert!(get(t, "loop:victim/task-0").is_some());
        // task-0 was pushed out; written again, it gets a new version, so a
        // reader still holding the old one cannot overwrite it.
        assert_eq!(get(t, "loop:ag/task-0"), None);
        assert!(swap(t, "loop:ag/task-0", None, b"b"));
        assert!(!swap(t, "loop:ag/task-0", Some(v0), b"c"));
        // Expired records go lazily when others are written.
        let later = t + ttl;
        for i in 0..200 {
            swap(later, &format!("loop:ag/late-{i}"), None, &[2]);
        }
        assert_eq!(s.records_len().unwrap(), 201);
    }

    #[test]
    fn a_poisoned_record_shard_is_an_error_not_a_panic() {
        use crate::test_support::ready;
        let s = Arc::new(MemoryStore::new());
        let (t, ttl) = (Duration::from_secs(1), Duration::from_secs(60));
        let key = "watch:ag/t";
        assert!(ready(s.record_swap(t, key, None, b"a".to_vec(), ttl)).unwrap());
        let s2 = s.clone();
        let _ = std::thread::spawn(move || {
            let owner = s2.records.of(key).unwrap();
            let _held = owner.shard(key).unwrap();
            panic!("poison the shard");
        })
        .join();
        assert_eq!(ready(s.record_get(t, key)), Err(records_poisoned()));
        assert_eq!(
            ready(s.record_swap(t, key, None, b"b".to_vec(), ttl)),
            Err(records_poisoned())
        );
        assert!(s.records_len().is_err());
        // A step reports the store's error (the gateway's fail mode decides).
        let clock = crate::ManualClock::default();
        let step = |_: Option<Vec<u8>>, _| (Some(vec![1]), ());
        let decode = |b: &[u8]| Some(b.to_vec());
        assert_eq!(
            ready(step_record(&*s, &clock, key, ttl, decode, step)),
            Err(StepError::Store(records_poisoned()))
        );
        // Another owner's records are not affected.
        assert!(ready(s.record_swap(t, "watch:other/t", None, b"c".to_vec(), ttl)).unwrap());
    }

    #[test]
    fn sessions_are_bounded_per_agent_and_never_pushed_out() {
        let s = MemoryStore::with_capacities(1000, 3);
        let day = 24 * 3600 * Duration::from_secs(1);
        let t = Duration::from_secs(1);
        let swap = |now, key: &str| {
            futures_lite_block_on(s.record_swap(now, key, None, b"a".to_vec(), day)).unwrap()
        };
        let get = |now, key: &str| futures_lite_block_on(s.record_get(now, key)).unwrap();
        for i in 0..3 {
            assert!(swap(t, &format!("mcp-session:a/files:{i}")));
        }
        // The fourth is refused; none of the three goes for it.
        assert!(!swap(t, "mcp-session:a/files:3"));
        assert!(get(t, "mcp-session:a/files:3").is_none());
        for i in 0..3 {
            assert!(get(t, &format!("mcp-session:a/files:{i}")).is_some());
        }
        // Another agent has its own room, and task records never take it.
        assert!(swap(t, "mcp-session:b/files:0"));
        for i in 0..5000 {
            swap(t, &format!("loop:a/t-{i}"));
        }
        assert!(get(t, "mcp-session:a/files:0").is_some());
        // Once expired, a session's room is free again.
        assert!(swap(t + day, "mcp-session:a/files:3"));
    }

    #[test]
    fn window_refuses_at_the_limit_with_a_true_retry_after() {
        let s = MemoryStore::new();
        let t0 = Duration::from_secs(100);
        for i in 0..3 {
            assert!(matches!(
                admit(&s, t0 + Duration::from_secs(i * 10), &[take(3, 1)], &[]),
                AdmitOutcome::Taken { .. }
            ));
        }
        // Full: the first admission (t0, in the slice ending at t0 + 100 ms)
        // leaves the window at the end of its slice plus 60 s.
        let now = t0 + Duration::from_secs(25);
        let leaves = t0 + slice_of(MIN) + MIN;
        assert_eq!(
            admit(&s, now, &[take(3, 1)], &[]),
            AdmitOutcome::Refused(Refusal::Window {
                index: 0,
                retry_after: Some(leaves - now)
            })
        );
        assert!(matches!(
            admit(&s, leaves - Duration::from_nanos(1), &[take(3, 1)], &[]),
            AdmitOutcome::Refused(_)
        ));
        assert!(matches!(
            admit(&s, leaves, &[take(3, 1)], &[]),
            AdmitOutcome::Taken { .. }
        ));
    }

    #[test]
    fn slices_are_a_six_hundredth_of_the_window_aligned_to_the_clock() {
        assert_eq!(slice_of(MIN), Duration::from_millis(100));
        assert_eq!(
            slice_of(Duration::from_secs(86_400)),
            Duration::from_secs(144)
        );
        assert_eq!(
            slice_of(Duration::from_millis(10)),
            Duration::from_millis(1)
        );
        let t = Duration::from_millis(1_234);
        assert_eq!(slice_end(t, MIN), Duration::from_millis(1_300));
        assert_eq!(
            slice_end(Duration::from_millis(1_300), MIN),
            Duration::from_millis(1_400)
        );
    }

    /// A window whose length shrinks (a reload) keeps its slices in order:
    /// the long window's later slice expires after the short one's.
    #[test]
    fn a_shorter_window_keeps_slices_in_order() {
        let s = MemoryStore::new();
        let w = |window: Duration, cost| WindowTake {
            key: "a:budget:task:t".into(),
            limit: 10,
            window,
            cost,
            enforce: true,
        };
        let hour = Duration::from_secs(3600);
        let t = Duration::from_secs(1000);
        // Hour slices are 6 s: this one ends at 1002 s.
        assert!(matches!(
            admit(&s, t, &[w(hour, 4)], &[]),
            AdmitOutcome::Taken { .. }
        ));
        // Minute slices are 100 ms: this one ends at 1000.1 s, before it.
        assert!(matches!(
            admit(&s, t, &[w(MIN, 5)], &[]),
            AdmitOutcome::Taken { .. }
        ));
        {
            let inner = s.inner.lock().unwrap();
            let ends: Vec<_> = inner.windows["a:budget:task:t"]
                .0
                .slices
                .iter()
                .map(|x| x.end)
                .collect();
            assert_eq!(
                ends,
                [Duration::from_millis(1_000_100), Duration::from_secs(1002)]
            );
        }
        // A minute on, the 5 has left and the 4 (a minute past 1002 s) has not.
        let later = Duration::from_millis(1_060_100);
        assert!(matches!(
            admit(&s, later, &[w(MIN, 6)], &[]),
            AdmitOutcome::Taken { .. }
        ));
        assert_eq!(
            admit(&s, later, &[w(MIN, 1)], &[]),
            AdmitOutcome::Refused(Refusal::Window {
                index: 0,
                retry_after: Some(Duration::from_millis(1_900))
            })
        );
    }

    /// A daily budget over a busy day holds at most SLICES + 1 numbers, not
    /// one entry per request; finished leases leave nothing behind, and one
    /// never finished is forgotten once its slice ages out.
    #[test]
    fn a_busy_day_stays_small() {
        let s = MemoryStore::new();
        let day = Duration::from_secs(86_400);
        let w = WindowTake {
            key: "a:budget:day".into(),
            limit: u64::MAX,
            window: day,
            cost: 7,
            enforce: true,
        };
        let mut now = MIN;
        let mut unfinished = None;
        for i in 0..50_000u64 {
            now += Duration::from_secs(2);
            let AdmitOutcome::Taken { lease, .. } = admit(&s, now, std::slice::from_ref(&w), &[])
            else {
                panic!("refused");
            };
            if i == 10 {
                unfinished = Some(lease);
            } else {
                futures_lite_block_on(s.finish(now, &lease, &[("a:budget:day", 5)])).unwrap();
            }
        }
        {
            let inner = s.inner.lock().unwrap();
            let (log, _) = &inner.windows["a:budget:day"];
            assert!(
                log.slices.len() <= SLICES as usize + 1,
                "{}",
                log.slices.len()
            );
            // 50,000 requests over ~28 hours: a day of them is in the window.
            let in_day = day.as_secs() / 2;
            assert!(
                log.sum >= in_day * 5 && log.sum <= (in_day + 80) * 5,
                "{}",
                log.sum
            );
            assert!(log.open.is_empty(), "{:?}", log.open);
        }
        // Settling the unfinished lease, forgotten with its aged slice,
        // changes nothing.
        let before = s.inner.lock().unwrap().windows["a:budget:day"].0.sum;
        futures_lite_block_on(s.settle(now, unfinished.as_ref().unwrap(), "a:budget:day", 0))
            .unwrap();
        assert_eq!(
            s.inner.lock().unwrap().windows["a:budget:day"].0.sum,
            before
        );
    }

    #[test]
    fn a_cost_above_the_limit_never_fits() {
        let s = MemoryStore::new();
        assert_eq!(
            admit(&s, MIN, &[take(10, 11)], &[]),
            AdmitOutcome::Refused(Refusal::Window {
                index: 0,
                retry_after: None
            })
        );
    }

    #[test]
    fn all_or_nothing_across_limits() {
        let s = MemoryStore::new();
        let rpm = take(10, 1);
        let tpm = WindowTake {
            key: "a:tpm".into(),
            limit: 100,
            window: MIN,
            cost: 80,
            enforce: true,
        };
        assert!(matches!(
            admit(&s, MIN, &[rpm.clone(), tpm.clone()], &[]),
            AdmitOutcome::Taken { .. }
        ));
        // Token window refuses: the request window must not be charged.
        assert!(matches!(
            admit(&s, MIN, &[rpm.clone(), tpm.clone()], &[]),
            AdmitOutcome::Refused(Refusal::Window { index: 1, .. })
        ));
        let inner = s.inner.lock().unwrap();
        assert_eq!(inner.windows["a:rpm"].0.sum, 1);
    }

    #[test]
    fn slots_are_taken_and_released() {
        let s = MemoryStore::new();
        let slot = SlotTake {
            key: "a:inflight".into(),
            limit: 2,
            enforce: true,
        };
        let l1 = match admit(&s, MIN, &[], std::slice::from_ref(&slot)) {
            AdmitOutcome::Taken { lease, .. } => lease,
            o => panic!("{o:?}"),
        };
        let _l2 = admit(&s, MIN, &[], std::slice::from_ref(&slot));
        assert_eq!(
            admit(&s, MIN, &[], std::slice::from_ref(&slot)),
            AdmitOutcome::Refused(Refusal::Slot { index: 0 })
        );
        futures_lite_block_on(s.release(&l1)).unwrap();
        assert_eq!(s.in_flight("a:inflight"), 1);
        assert!(matches!(
            admit(&s, MIN, &[], &[slot]),
            AdmitOutcome::Taken { .. }
        ));
    }

    #[test]
    fn dry_run_takes_and_reports() {
        let s = MemoryStore::new();
        let mut w = take(1, 1);
        w.enforce = false;
        assert!(matches!(
            admit(&s, MIN, std::slice::from_ref(&w), &[]),
            AdmitOutcome::Taken {
                would_refuse: None,
                ..
            }
        ));
        match admit(&s, MIN, &[w], &[]) {
            AdmitOutcome::Taken {
                would_refuse: Some(Refusal::Window { index: 0, .. }),
                ..
            } => {}
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn settle_corrects_the_estimate() {
        let s = MemoryStore::new();
        let tpm = take(100, 90);
        let lease = match admit(&s, MIN, std::slice::from_ref(&tpm), &[]) {
            AdmitOutcome::Taken { lease, .. } => lease,
            o => panic!("{o:?}"),
        };
        assert!(matches!(
            admit(&s, MIN, &[take(100, 20)], &[]),
            AdmitOutcome::Refused(_)
        ));
        futures_lite_block_on(s.settle(MIN, &lease, "a:rpm", 30)).unwrap();
        assert!(matches!(
            admit(&s, MIN, &[take(100, 20)], &[]),
            AdmitOutcome::Taken { .. }
        ));
    }

    #[test]
    fn idempotency_keys_claim_replay_and_detect_reuse() {
        let s = MemoryStore::new();
        let ttl = Duration::from_secs(60);
        assert_eq!(
            futures_lite_block_on(s.idem_begin(MIN, "k", [1; 32], ttl, false)).unwrap(),
            IdemBegin::Fresh
        );
        assert_eq!(
            futures_lite_block_on(s.idem_begin(MIN, "k", [1; 32], ttl, false)).unwrap(),
            IdemBegin::InFlight
        );
        assert_eq!(
            futures_lite_block_on(s.idem_begin(MIN, "k", [2; 32], ttl, false)).unwrap(),
            IdemBegin::Mismatch
        );
        let rec = IdemRecord {
            status: 201,
            content_type: None,
            body: b"ok".to_vec(),
        };
        futures_lite_block_on(s.idem_finish(MIN, "k", Some(IdemOutcome::Done(rec.clone()))))
            .unwrap();
        assert_eq!(
            futures_lite_block_on(s.idem_begin(MIN, "k", [1; 32], ttl, false)).unwrap(),
            IdemBegin::Ended(IdemOutcome::Done(rec))
        );
        // Expired: fresh again.
        assert_eq!(
            futures_lite_block_on(s.idem_begin(MIN + ttl, "k", [1; 32], ttl, false)).unwrap(),
            IdemBegin::Fresh
        );
        // Failed: unknown unless retries are safe; never reached the tool: forgotten.
        futures_lite_block_on(s.idem_finish(MIN, "f", None)).unwrap();
        futures_lite_block_on(s.idem_begin(MIN, "f", [1; 32], ttl, false)).unwrap();
        futures_lite_block_on(s.idem_finish(MIN, "f", Some(IdemOutcome::Failed))).unwrap();
        assert_eq!(
            futures_lite_block_on(s.idem_begin(MIN, "f", [1; 32], ttl, false)).unwrap(),
            IdemBegin::Ended(IdemOutcome::Failed)
        );
        assert_eq!(
            futures_lite_block_on(s.idem_begin(MIN, "f", [1; 32], ttl, true)).unwrap(),
            IdemBegin::Fresh
        );
        futures_lite_block_on(s.idem_finish(MIN, "f", None)).unwrap();
        assert_eq!(
            futures_lite_block_on(s.idem_begin(MIN, "f", [1; 32], ttl, false)).unwrap(),
            IdemBegin::Fresh
        );
    }

    proptest! {
        /// Within any interval of one window, admitted cost never exceeds
        /// the limit (slices only ever keep a cost longer); and waiting the
        /// reported retry_after is enough and not more than needed.
        #[test]
        fn never_more_than_the_limit_in_any_window(
            steps in proptest::collection::vec((0u64..30_000, 1u64..5), 1..200),
            limit in 1u64..20,
        ) {
            let s = MemoryStore::new();
            let mut now = Duration::ZERO;
            let mut admitted: Vec<(Duration, u64)> = Vec::new();
            for (gap_ms, cost) in steps {
                now += Duration::from_millis(gap_ms);
                match admit(&s, now, &[take(limit, cost)], &[]) {
                    AdmitOutcome::Taken { .. } => admitted.push((now, cost)),
                    AdmitOutcome::Refused(Refusal::Window { retry_after: Some(after), .. }) => {
                        prop_assert!(after <= MIN + slice_of(MIN));
                        // A store with the same history admits it at now + after, not before.
                        let replay = || {
                            let probe = MemoryStore::new();
                            for (t, c) in &admitted { admit(&probe, *t, &[take(limit, *c)], &[]); }
                            probe
                        };
                        let ok = matches!(admit(&replay(), now + after, &[take(limit, cost)], &[]), AdmitOutcome::Taken { .. });
                        prop_assert!(ok, "retry_after {:?} was too early", after);
                        if after > Duration::ZERO {
                            let early = matches!(admit(&replay(), now + after - Duration::from_nanos(1), &[take(limit, cost)], &[]), AdmitOutcome::Refused(_));
                            prop_assert!(early, "retry_after {:?} was later than needed", after);
                        }
                    }
                    AdmitOutcome::Refused(r) => prop_assert!(cost > limit, "{:?}", r),
                }
            }
            for (i, (start, _)) in admitted.iter().enumerate() {
                let sum: u64 = admitted[i..].iter().take_while(|(t, _)| *t < *start + MIN).map(|(_, c)| c).sum();
                prop_assert!(sum <= limit, "{} in the window from {:?}", sum, start);
            }
        }
    }
}
