//! The Redis implementation of [`StateStore`].
//!
//! Layout (every key under `key_prefix`, every key with a TTL or a bound):
//! - `w:{key}` zset of slice ends, `wc:{key}` hash slice end -> cost, plus
//!   `_sum` and `l{lease}` -> `end:cost` for each lease not yet finished:
//!   one sliding window in slices, like the memory store's (at most ~600
//!   slices however busy), kept for the window plus a minute after its
//!   newest slice; `wo:{key}` zset open lease -> its slice end, so a lease
//!   whose instance died before finishing is forgotten when its slice ages
//!   out;
//! - `s:{key}` zset lease -> lease expiry: concurrency slots. A slot whose
//!   lease is not renewed (its instance died) is dropped by the next
//!   admission after the expiry; live leases are renewed in the background;
//! - `i:{key}` hash: an idempotency record, with the record's TTL;
//! - `r:{key}` hash: a versioned record (a task's loop ring
//!   `loop:<agent>/<task>`, watchdog count `watch:<agent>/<task>`, tool
//!   streak `streak:<agent>/<task>/<tool>`, an MCP session binding), with
//!   its TTL; changed only by compare-and-swap (`record_swap.lua`);
//! - `lease`: the lease id counter (one integer).
//!
//! Costs are clamped to [`MAX_COST`] before they are sent, and the scripts
//! cap every sum they write at [`MAX_SUM`] (`lua/ceiling.lua`): Lua keeps
//! numbers as doubles, so sums stay exact integers Redis can add to.
//!
//! Time is the caller's `now` (epoch-anchored [`SystemClock`]), so the
//! scripts judge exactly like the memory store, and the conformance suite
//! runs against both.
//!
//! Connection: one multiplexed connection (pipelined; no pool needed, it is
//! shared by every proxy thread), owned by a supervisor task on a small
//! runtime of its own: it connects with exponential backoff, pings every
//! 500 ms, drops a connection that stops answering and reconnects, and
//! renews slot leases. Proxy threads never wait for it: without a live
//! connection a call fails at once, and every call is bounded by `timeout`.
//!
//! [`SystemClock`]: loopgate_policy::SystemClock
//! [`MAX_SUM`]: loopgate_policy::store::MAX_SUM

use async_trait::async_trait;
use loopgate_policy::store::MAX_COST;
use loopgate_policy::{
    slice_of, AdmitOutcome, IdemBegin, IdemOutcome, IdemRecord, Lease, Refusal, SlotTake,
    StateStore, StoreError, WindowTake,
};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Script, Value};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How to reach Redis and how long to wait for it.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    pub url: String,
    pub key_prefix: String,
    /// Bound on every call from the request path.
    pub timeout: Duration,
    /// How long a concurrency slot outlives its instance.
    pub slot_lease: Duration,
}

/// What `/ready` and metrics say about the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreHealth {
    pub available: bool,
    pub reconnects: u64,
    pub last_error: Option<String>,
}

struct Scripts {
    admit: Script,
    settle: Script,
    idem_begin: Script,
    idem_finish: Script,
    record_swap: Script,
    finish: Script,
}

impl Scripts {
    fn new() -> Scripts {
        Scripts {
            admit: Script::new(concat!(
                include_str!("lua/ceiling.lua"),
                include_str!("lua/admit.lua")
            )),
            settle: Script::new(concat!(
                include_str!("lua/ceiling.lua"),
                include_str!("lua/lease.lua"),
                include_str!("lua/settle.lua")
            )),
            idem_begin: Script::new(include_str!("lua/idem_begin.lua")),
            idem_finish: Script::new(include_str!("lua/idem_finish.lua")),
            record_swap: Script::new(include_str!("lua/record_swap.lua")),
            finish: Script::new(concat!(
                include_str!("lua/ceiling.lua"),
                include_str!("lua/lease.lua"),
                include_str!("lua/finish.lua")
            )),
        }
    }
}

struct Inner {
    cfg: RedisConfig,
    conn: arc_swap::ArcSwapOption<MultiplexedConnection>,
    scripts: Scripts,
    /// Live leases holding slots: renewed until released.
    held: Mutex<HashMap<u64, Vec<String>>>,
    available: AtomicBool,
    reconnects: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// Set by a failed call so the supervisor checks the connection now.
    suspect: tokio::sync::Notify,
}

/// Shared state on Redis. Cheap to clone.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("key_prefix", &self.inner.cfg.key_prefix)
            .field("available", &self.inner.available.load(Ordering::Relaxed))
            .finish()
    }
}

const PING_EVERY: Duration = Duration::from_millis(500);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

impl RedisStore {
    /// Starts the supervisor (its own thread and runtime) and returns at
    /// once; the store is unavailable until the first connection is up.
    /// Errors only for a URL that cannot be parsed.
    pub fn start(cfg: RedisConfig) -> Result<RedisStore, String> {
        let client = Client::open(cfg.url.as_str()).map_err(|e| redacted(&e, &cfg.url))?;
        let store = RedisStore {
            inner: Arc::new(Inner {
                cfg,
                conn: arc_swap::ArcSwapOption::empty(),
                scripts: Scripts::new(),
                held: Mutex::new(HashMap::new()),
                available: AtomicBool::new(false),
                reconnects: AtomicU64::new(0),
                last_error: Mutex::new(None),
                suspect: tokio::sync::Notify::new(),
            }),
        };
        let inner = store.inner.clone();
        std::thread::Builder::new()
            .name("loopgate-redis".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("redis supervisor runtime");
                rt.block_on(supervise(inner, client));
            })
            .map_err(|e| format!("cannot start the redis supervisor: {e}"))?;
        Ok(store)
    }

    /// Waits (up to `within`) for the first connection; for start-up logs
    /// and tests.
    pub async fn wait_available(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if self.inner.available.load(Ordering::Acquire) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// Stops renewing every held slot, as if this instance had died (tests).
    #[doc(hidden)]
    pub fn forget_leases_for_tests(&self) {
        if let Ok(mut held) = self.inner.held.lock() {
            held.clear();
        }
    }

    pub fn health(&self) -> StoreHealth {
        StoreHealth {
            available: self.inner.available.load(Ordering::Acquire),
            reconnects: self.inner.reconnects.load(Ordering::Relaxed),
            last_error: self.inner.last_error.lock().ok().and_then(|e| e.clone()),
        }
    }

    /// The live connection, or an error at once.
    pub(crate) fn conn(&self) -> Result<MultiplexedConnection, StoreError> {
        match self.inner.conn.load_full() {
            Some(c) => Ok((*c).clone()),
            None => Err(StoreError("redis is not connected".into())),
        }
    }

    fn key(&self, kind: &str, key: &str) -> String {
        let p = &self.inner.cfg.key_prefix;
        let mut k = String::with_capacity(p.len() + kind.len() + key.len() + 1);
        k.push_str(p);
        k.push_str(kind);
        k.push(':');
        k.push_str(key);
        k
    }

    /// Runs `f` against the connection within the timeout; a failure marks
    /// the connection suspect.
    pub(crate) async fn call<T, F, Fut>(&self, what: &str, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.conn()?;
        let err = match tokio::time::timeout(self.inner.cfg.timeout, f(conn)).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => format!("{what}: {}", redacted(&e, &self.inner.cfg.url)),
            Err(_) => format!(
                "{what}: no answer within {} ms",
                self.inner.cfg.timeout.as_millis()
            ),
        };
        if let Ok(mut last) = self.inner.last_error.lock() {
            *last = Some(err.clone());
        }
        self.inner.suspect.notify_one();
        Err(StoreError(err))
    }
}

/// A Redis error as text, without the URL's password.
fn redacted(e: &redis::RedisError, url: &str) -> String {
    let text = e.to_string();
    match url.split_once('@') {
        Some((creds, _)) => match creds.rsplit_once(':') {
            Some((_, pw)) if !pw.is_empty() && !pw.starts_with("//") => text.replace(pw, "***"),
            _ => text,
        },
        None => text,
    }
}

async fn supervise(inner: Arc<Inner>, client: Client) {
    let mut backoff = BACKOFF_MIN;
    let conn_cfg = AsyncConnectionConfig::new()
        .set_connection_timeout(Duration::from_secs(1))
        .set_response_timeout(Duration::from_secs(1));
    let renew_every = (inner.cfg.slot_lease / 3).max(Duration::from_millis(50));
    let mut next_renew = tokio::time::Instant::now() + renew_every;
    loop {
        if inner.conn.load().is_none() {
            match connect(&inner, &client, &conn_cfg).await {
                Ok(c) => {
                    inner.conn.store(Some(Arc::new(c)));
                    inner.available.store(true, Ordering::Release);
                    inner.reconnects.fetch_add(1, Ordering::Relaxed);
                    log::info!("state store: connected to redis");
                    backoff = BACKOFF_MIN;
                }
                Err(e) => {
                    let e = redacted(&e, &inner.cfg.url);
                    log::warn!(
                        "state store: redis unavailable ({e}); retrying in {} ms",
                        backoff.as_millis()
                    );
                    if let Ok(mut last) = inner.last_error.lock() {
                        *last = Some(e);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(PING_EVERY) => {}
            _ = inner.suspect.notified() => {}
        }
        let Some(conn) = inner.conn.load_full() else {
            continue;
        };
        let mut c = (*conn).clone();
        let ping = tokio::time::timeout(
            Duration::from_secs(1),
            redis::cmd("PING").query_async::<String>(&mut c),
        )
        .await;
        if !matches!(ping, Ok(Ok(_))) {
            log::warn!("state store: redis stopped answering; reconnecting");
            inner.available.store(false, Ordering::Release);
            inner.conn.store(None);
            continue;
        }
        if tokio::time::Instant::now() >= next_renew {
            next_renew = tokio::time::Instant::now() + renew_every;
            renew(&inner, &mut c).await;
        }
    }
}

async fn connect(
    inner: &Inner,
    client: &Client,
    cfg: &AsyncConnectionConfig,
) -> redis::RedisResult<MultiplexedConnection> {
    let mut c = client
        .get_multiplexed_async_connection_with_config(cfg)
        .await?;
    // Load the scripts once per connection (a restarted Redis forgot them);
    // calls go by SHA and reload on NOSCRIPT anyway.
    let s = &inner.scripts;
    for script in [
        &s.admit,
        &s.settle,
        &s.idem_begin,
        &s.idem_finish,
        &s.record_swap,
        &s.finish,
    ] {
        script.prepare_invoke().load_async(&mut c).await?;
    }
    Ok(c)
}

/// Pushes the expiry of every slot a live lease holds forward.
async fn renew(inner: &Inner, c: &mut MultiplexedConnection) {
    let held: Vec<(u64, Vec<String>)> = match inner.held.lock() {
        Ok(h) => h.iter().map(|(k, v)| (*k, v.clone())).collect(),
        Err(_) => return,
    };
    if held.is_empty() {
        return;
    }
    let until = now_ms() + inner.cfg.slot_lease.as_millis() as u64;
    let mut pipe = redis::pipe();
    for (lease, keys) in &held {
        for k in keys {
            // XX: renew only a slot still held (never re-take a released one).
            pipe.cmd("ZADD")
                .arg(k)
                .arg("XX")
                .arg(until)
                .arg(*lease)
                .ignore();
        }
    }
    if let Err(e) = pipe.query_async::<()>(c).await {
        log::warn!("state store: renewing slot leases failed: {e}");
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn int(v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(StoreError(format!(
            "unexpected reply from redis: {other:?}"
        ))),
    }
}

fn bytes(v: &Value) -> Result<Vec<u8>, StoreError> {
    match v {
        Value::BulkString(b) => Ok(b.clone()),
        Value::SimpleString(s) => Ok(s.clone().into_bytes()),
        other => Err(StoreError(format!(
            "unexpected reply from redis: {other:?}"
        ))),
    }
}

fn text(v: &Value) -> Result<String, StoreError> {
    String::from_utf8(bytes(v)?).map_err(|_| StoreError("non-UTF-8 reply from redis".into()))
}

fn refusal(kind: i64, index: i64, retry_ms: i64) -> Result<Refusal, StoreError> {
    let index = usize::try_from(index).map_err(|_| StoreError("bad index from redis".into()))?;
    match kind {
        1 => Ok(Refusal::Window {
            index,
            retry_after: (retry_ms >= 0).then(|| Duration::from_millis(retry_ms as u64)),
        }),
        2 => Ok(Refusal::Slot { index }),
        k => Err(StoreError(format!(
            "unexpected refusal kind {k} from redis"
        ))),
    }
}

#[async_trait]
impl StateStore for RedisStore {
    async fn admit(
        &self,
        now: Duration,
        windows: &[WindowTake],
        slots: &[SlotTake],
    ) -> Result<AdmitOutcome, StoreError> {
        let mut inv = self.inner.scripts.admit.prepare_invoke();
        for w in windows {
            inv.key(self.key("w", &w.key))
                .key(self.key("wc", &w.key))
                .key(self.key("wo", &w.key));
        }
        for s in slots {
            inv.key(self.key("s", &s.key));
        }
        inv.key(format!("{}lease", self.inner.cfg.key_prefix));
        inv.arg(ms(now))
            .arg(windows.len())
            .arg(slots.len())
            .arg(ms(self.inner.cfg.slot_lease));
        for w in windows {
            inv.arg(w.limit)
                .arg(ms(w.window))
                .arg(ms(slice_of(w.window)))
                .arg(w.cost.min(MAX_COST))
                .arg(u8::from(w.enforce));
        }
        for s in slots {
            inv.arg(s.limit).arg(u8::from(s.enforce));
        }
        let reply: Vec<Value> = self
            .call(
                "admit",
                |mut c| async move { inv.invoke_async(&mut c).await },
            )
            .await?;
        let n: Vec<i64> = reply.iter().map(int).collect::<Result<_, _>>()?;
        match n.as_slice() {
            [0, kind, index, retry] => Ok(AdmitOutcome::Refused(refusal(*kind, *index, *retry)?)),
            [1, lease, wk, wi, wr, rest @ ..] if rest.len() == windows.len() => {
                let id = u64::try_from(*lease)
                    .map_err(|_| StoreError("bad lease id from redis".into()))?;
                let lease = Lease::new(
                    id,
                    windows.iter().map(|w| w.key.clone()).collect(),
                    slots.iter().map(|s| s.key.clone()).collect(),
                );
                if !slots.is_empty() {
                    if let Ok(mut held) = self.inner.held.lock() {
                        held.insert(id, slots.iter().map(|s| self.key("s", &s.key)).collect());
                    }
                }
                Ok(AdmitOutcome::Taken {
                    lease,
                    would_refuse: if *wk == 0 {
                        None
                    } else {
                        Some(refusal(*wk, *wi, *wr)?)
                    },
                    remaining: rest.iter().map(|r| (*r).max(0) as u64).collect(),
                })
            }
            other => Err(StoreError(format!(
                "unexpected admit reply from redis: {other:?}"
            ))),
        }
    }

    async fn settle(
        &self,
        _now: Duration,
        lease: &Lease,
        key: &str,
        actual: u64,
    ) -> Result<(), StoreError> {
        if !lease.holds_window(key) {
            return Ok(());
        }
        let mut inv = self.inner.scripts.settle.prepare_invoke();
        inv.key(self.key("wc", key))
            .arg(lease.id)
            .arg(actual.min(MAX_COST));
        self.call("settle", |mut c| async move {
            inv.invoke_async::<i64>(&mut c).await
        })
        .await
        .map(|_| ())
    }

    async fn finish(
        &self,
        _now: Duration,
        lease: &Lease,
        settle: &[(&str, u64)],
    ) -> Result<(), StoreError> {
        if lease.windows().is_empty() && lease.slots().is_empty() {
            return Ok(());
        }
        if let Ok(mut held) = self.inner.held.lock() {
            held.remove(&lease.id);
        }
        let mut inv = self.inner.scripts.finish.prepare_invoke();
        for k in lease.windows() {
            inv.key(self.key("wc", k)).key(self.key("wo", k));
        }
        for k in lease.slots() {
            inv.key(self.key("s", k));
        }
        inv.arg(lease.id).arg(lease.windows().len());
        for k in lease.windows() {
            // -1: keep the cost taken (only forget the lease).
            let actual = settle.iter().find(|(s, _)| *s == &**k).map(|(_, a)| *a);
            inv.arg(actual.map_or(-1, |a| i64::try_from(a.min(MAX_COST)).unwrap_or(0)));
        }
        self.call("finish", |mut c| async move {
            inv.invoke_async::<i64>(&mut c).await
        })
        .await
        .map(|_| ())
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        if lease.slots().is_empty() {
            return Ok(());
        }
        if let Ok(mut held) = self.inner.held.lock() {
            held.remove(&lease.id);
        }
        let mut pipe = redis::pipe();
        for k in lease.slots() {
            pipe.cmd("ZREM")
                .arg(self.key("s", k))
                .arg(lease.id)
                .ignore();
        }
        self.call("release", |mut c| async move {
            pipe.query_async::<()>(&mut c).await
        })
        .await
    }

    async fn record_get(
        &self,
        now: Duration,
        key: &str,
    ) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        let key = self.key("r", key);
        let reply: Vec<Value> = self
            .call("record", |mut c| async move {
                redis::cmd("HMGET")
                    .arg(key)
                    .arg("v")
                    .arg("d")
                    .arg("exp")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        match reply.as_slice() {
            [Value::Nil, ..] => Ok(None),
            [v, d, exp] => {
                let num = |v: &Value| -> Result<u64, StoreError> {
                    text(v)?
                        .parse()
                        .map_err(|_| StoreError("bad record in redis".into()))
                };
                if num(exp)? <= ms(now) {
                    return Ok(None);
                }
                Ok(Some((num(v)?, bytes(d)?)))
            }
            other => Err(StoreError(format!(
                "unexpected record reply from redis: {other:?}"
            ))),
        }
    }

    async fn record_swap(
        &self,
        now: Duration,
        key: &str,
        version: Option<u64>,
        value: Vec<u8>,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let mut inv = self.inner.scripts.record_swap.prepare_invoke();
        inv.key(self.key("r", key))
            .arg(ms(now))
            .arg(version.map(|v| v.to_string()).unwrap_or_default())
            .arg(value)
            .arg(ms(ttl).max(1));
        let swapped: i64 = self
            .call(
                "record",
                |mut c| async move { inv.invoke_async(&mut c).await },
            )
            .await?;
        Ok(swapped == 1)
    }

    async fn idem_begin(
        &self,
        now: Duration,
        key: &str,
        body_sha: [u8; 32],
        ttl: Duration,
        retry_failed: bool,
    ) -> Result<IdemBegin, StoreError> {
        let mut inv = self.inner.scripts.idem_begin.prepare_invoke();
        inv.key(self.key("i", key))
            .arg(hex::encode(body_sha))
            .arg(ms(now))
            .arg(ms(ttl).max(1))
            .arg(u8::from(retry_failed));
        let reply: Vec<Value> = self
            .call("idempotency", |mut c| async move {
                inv.invoke_async(&mut c).await
            })
            .await?;
        let state = reply
            .first()
            .map(text)
            .transpose()?
            .ok_or_else(|| StoreError("empty idempotency reply from redis".into()))?;
        Ok(match (state.as_str(), reply.as_slice()) {
            ("fresh", _) => IdemBegin::Fresh,
            ("mismatch", _) => IdemBegin::Mismatch,
            ("inflight", _) => IdemBegin::InFlight,
            ("failed", _) => IdemBegin::Ended(IdemOutcome::Failed),
            ("unrecorded", _) => IdemBegin::Ended(IdemOutcome::Unrecorded),
            ("done", [_, status, has_ct, ct, body]) => {
                IdemBegin::Ended(IdemOutcome::Done(IdemRecord {
                    status: text(status)?
                        .parse()
                        .map_err(|_| StoreError("bad recorded status in redis".into()))?,
                    content_type: (text(has_ct)? == "1").then(|| text(ct)).transpose()?,
                    body: bytes(body)?,
                }))
            }
            (s, _) => {
                return Err(StoreError(format!(
                    "unexpected idempotency state `{s}` in redis"
                )))
            }
        })
    }

    async fn idem_finish(
        &self,
        now: Duration,
        key: &str,
        outcome: Option<IdemOutcome>,
    ) -> Result<(), StoreError> {
        let mut inv = self.inner.scripts.idem_finish.prepare_invoke();
        inv.key(self.key("i", key));
        match &outcome {
            None => {
                inv.arg("forget").arg(ms(now));
            }
            Some(IdemOutcome::Failed) => {
                inv.arg("failed").arg(ms(now));
            }
            Some(IdemOutcome::Unrecorded) => {
                inv.arg("unrecorded").arg(ms(now));
            }
            Some(IdemOutcome::Done(r)) => {
                inv.arg("done")
                    .arg(ms(now))
                    .arg(r.status)
                    .arg(u8::from(r.content_type.is_some()))
                    .arg(r.content_type.as_deref().unwrap_or(""))
                    .arg(r.body.as_slice());
            }
        }
        self.call("idempotency", |mut c| async move {
            inv.invoke_async::<i64>(&mut c).await
        })
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use loopgate_policy::store::MAX_SUM;

    /// The scripts' ceiling is policy's: a store capping lower or higher
    /// than the memory store would judge differently.
    #[test]
    fn the_scripts_cap_sums_at_policys_ceiling() {
        let lua = include_str!("lua/ceiling.lua");
        assert!(
            lua.contains(&format!("local MAX_SUM = {MAX_SUM}\n")),
            "{lua}"
        );
    }
}
