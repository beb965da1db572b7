//! `on_unavailable: local`: Redis when it answers, the embedded memory
//! store when it does not.
//!
//! While Redis is away each instance admits on its own, with every limit
//! divided by the configured replica count so that the fleet as a whole
//! stays near the shared limit. Leases remember where they were taken
//! (`Lease::degraded`), so settle and release go back to the same store.
//! Nothing is ever allowed by error: the local store is exact for what it
//! sees.

use crate::RedisStore;
use async_trait::async_trait;
use loopgate_policy::{
    AdmitOutcome, IdemBegin, IdemOutcome, Lease, MemoryStore, SlotTake, StateStore, StoreError,
    WindowTake,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Debug)]
pub struct FallbackStore {
    primary: RedisStore,
    local: MemoryStore,
    replicas: u64,
    degraded: AtomicU64,
}

impl FallbackStore {
    pub fn new(primary: RedisStore, replicas: u64) -> FallbackStore {
        FallbackStore {
            primary,
            local: MemoryStore::new(),
            replicas: replicas.max(1),
            degraded: AtomicU64::new(0),
        }
    }

    /// Requests admitted by the local store so far.
    pub fn degraded_admissions(&self) -> u64 {
        self.degraded.load(Ordering::Relaxed)
    }

    fn share(&self, limit: u64) -> u64 {
        // Never round a limit of 1 down to 0: each instance keeps at least 1.
        limit.div_ceil(self.replicas).max(1)
    }

    fn note(&self, e: &StoreError) {
        if self
            .degraded
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(1000)
        {
            log::warn!("{e}; admitting on this instance's local limits");
        }
    }
}

#[async_trait]
impl StateStore for FallbackStore {
    async fn admit(
        &self,
        now: Duration,
        windows: &[WindowTake],
        slots: &[SlotTake],
    ) -> Result<AdmitOutcome, StoreError> {
        let e = match self.primary.admit(now, windows, slots).await {
            Ok(out) => return Ok(out),
            Err(e) => e,
        };
        self.note(&e);
        let windows: Vec<WindowTake> = windows
            .iter()
            .map(|w| WindowTake {
                limit: self.share(w.limit),
                ..w.clone()
            })
            .collect();
        let slots: Vec<SlotTake> = slots
            .iter()
            .map(|s| SlotTake {
                limit: self.share(s.limit),
                ..s.clone()
            })
            .collect();
        Ok(match self.local.admit(now, &windows, &slots).await? {
            AdmitOutcome::Taken {
                mut lease,
                would_refuse,
                remaining,
            } => {
                lease.degraded = true;
                AdmitOutcome::Taken {
                    lease,
                    would_refuse,
                    remaining,
                }
            }
            refused => refused,
        })
    }

    async fn settle(
        &self,
        now: Duration,
        lease: &Lease,
        key: &str,
        actual: u64,
    ) -> Result<(), StoreError> {
        if lease.degraded {
            self.local.settle(now, lease, key, actual).await
        } else {
            self.primary.settle(now, lease, key, actual).await
        }
    }

    async fn finish(
        &self,
        now: Duration,
        lease: &Lease,
        settle: &[(&str, u64)],
    ) -> Result<(), StoreError> {
        if lease.degraded {
            self.local.finish(now, lease, settle).await
        } else {
            self.primary.finish(now, lease, settle).await
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        if lease.degraded {
            self.local.release(lease).await
        } else {
            self.primary.release(lease).await
        }
    }

    async fn idem_begin(
        &self,
        now: Duration,
        key: &str,
        body_sha: [u8; 32],
        ttl: Duration,
        retry_failed: bool,
    ) -> Result<IdemBegin, StoreError> {
        match self
            .primary
            .idem_begin(now, key, body_sha, ttl, retry_failed)
            .await
        {
            Ok(b) => Ok(b),
            Err(e) => {
                self.note(&e);
                self.local
                    .idem_begin(now, key, body_sha, ttl, retry_failed)
                    .await
            }
        }
    }

    async fn record_get(
        &self,
        now: Duration,
        key: &str,
    ) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        match self.primary.record_get(now, key).await {
            Ok(r) => Ok(r),
            Err(e) => {
                self.note(&e);
                self.local.record_get(now, key).await
            }
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
        // The version came from wherever record_get answered; a swap that
        // cannot reach Redis goes local too (a version mismatch there is
        // a lost race: the caller reads again).
        match self
            .primary
            .record_swap(now, key, version, value.clone(), ttl)
            .await
        {
            Ok(r) => Ok(r),
            Err(_) => self.local.record_swap(now, key, version, value, ttl).await,
        }
    }

    async fn idem_finish(
        &self,
        now: Duration,
        key: &str,
        outcome: Option<IdemOutcome>,
    ) -> Result<(), StoreError> {
        let local = self.local.idem_finish(now, key, outcome.clone()).await;
        match self.primary.idem_finish(now, key, outcome).await {
            Ok(()) => Ok(()),
            Err(_) => local,
        }
    }
}
