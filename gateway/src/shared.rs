//! The gateway side of shared state: builds the store the config asks for
//! (memory, Redis, Redis with local fallback), exchanges open breakers with
//! the other instances in the background, and reports the store on `/ready`
//! and in metrics.

use crate::config::runtime::{RedisSettings, StateSettings, TaskBounds};
use crate::config::spec::OnUnavailable;
use crate::metrics::Metrics;
use loopgate_breaker::BreakerSet;
use loopgate_policy::{Clock, MemoryStore, StateStore};
use loopgate_state::{FallbackStore, RedisConfig, RedisStore, SharedFlags};
use std::sync::Arc;
use std::time::Duration;

/// Redis-backed state of this instance.
pub struct Shared {
    pub redis: RedisStore,
    pub flags: SharedFlags,
    pub settings: RedisSettings,
}

impl Shared {
    /// `(ready, json)` for `/ready`: with `on_unavailable: deny` an instance
    /// that cannot reach Redis can serve nothing but refusals, so it is not
    /// ready; with `local` it serves, degraded.
    pub fn readiness(&self) -> (bool, serde_json::Value) {
        let h = self.redis.health();
        let local = self.settings.on_unavailable == OnUnavailable::Local;
        let json = serde_json::json!({
            "backend": "redis",
            "available": h.available,
            "on_unavailable": if local { "local" } else { "deny" },
            "degraded": !h.available && local,
            "connects": h.reconnects,
            "last_error": h.last_error,
        });
        (h.available || local, json)
    }
}

/// The store requests go through, and the Redis side when there is one.
pub type Stores = (Arc<dyn StateStore>, Option<Arc<Shared>>);

/// The store for `settings`, and the Redis handle when there is one.
pub fn build(settings: &StateSettings, bounds: TaskBounds) -> Result<Stores, String> {
    let StateSettings::Redis(r) = settings else {
        let store = MemoryStore::with_capacities(bounds.tasks_per_agent, bounds.sessions_per_agent);
        return Ok((Arc::new(store), None));
    };
    let redis = RedisStore::start(RedisConfig {
        url: r.url.expose().to_string(),
        key_prefix: r.key_prefix.clone(),
        timeout: r.timeout,
        slot_lease: r.slot_lease,
    })?;
    let store: Arc<dyn StateStore> = match r.on_unavailable {
        OnUnavailable::Deny => Arc::new(redis.clone()),
        OnUnavailable::Local => Arc::new(FallbackStore::new(redis.clone(), r.replicas)),
    };
    let flags = SharedFlags::new(redis.clone(), &r.key_prefix);
    Ok((
        store,
        Some(Arc::new(Shared {
            redis,
            flags,
            settings: r.clone(),
        })),
    ))
}

/// Every `breaker_sync`: publishes this instance's open breakers and opens
/// the ones other instances opened, so an open breaker anywhere is open
/// everywhere within one period, without a Redis call on the request path.
pub fn spawn_breaker_sync(
    shared: Arc<Shared>,
    breakers: Arc<BreakerSet>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
) {
    let every = shared.settings.breaker_sync;
    std::thread::Builder::new()
        .name("loopgate-breaker-sync".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                log::error!("breaker sync: cannot start its runtime; breakers stay local");
                return;
            };
            rt.block_on(async move {
                loop {
                    tokio::time::sleep(every).await;
                    metrics
                        .state_available
                        .set(i64::from(shared.redis.health().available));
                    let now = clock.now();
                    let mine: Vec<(String, u64)> = breakers
                        .open_until(now)
                        .into_iter()
                        .map(|(k, u)| (k, u.as_millis() as u64))
                        .collect();
                    let all = match shared
                        .flags
                        .sync_breakers(now.as_millis() as u64, &mine)
                        .await
                    {
                        Ok(all) => all,
                        Err(e) => {
                            log::debug!("breaker sync: {e}");
                            continue;
                        }
                    };
                    for (key, until_ms) in all {
                        let until = Duration::from_millis(until_ms);
                        if let Ok(Some(t)) = breakers.adopt_open(&key, until, clock.now()) {
                            log::warn!("breaker `{key}`: {t}");
                            metrics.transition(&key, &t);
                        }
                    }
                }
            });
        })
        .ok();
}
