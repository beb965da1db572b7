//! Time, injected: rules and limits read a [`Clock`], never the system time,
//! so tests drive them with a [`ManualClock`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Monotonic time since a fixed origin (the Unix epoch for [`SystemClock`]).
pub trait Clock: Send + Sync {
    fn now(&self) -> Duration;
}

/// The process's monotonic clock, anchored to the Unix epoch when the
/// process started: it never goes back (a wall-clock step does not move it),
/// and replicas sharing limits through a store read comparable times (their
/// wall clocks agree to NTP accuracy at start; drift after is tiny).
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
    epoch_offset: Duration,
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock {
            origin: Instant::now(),
            epoch_offset: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO),
        }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.epoch_offset + self.origin.elapsed()
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
}

impl ManualClock {
    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }

    pub fn set(&self, at: Duration) {
        self.nanos.store(at.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
}
