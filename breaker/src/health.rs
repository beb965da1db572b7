//! Upstream health for weighted routing: exponentially weighted error rate
//! and latency. A failure lowers a target's share quickly; recovery raises
//! it slowly, so a flapping target does not get its full share back at the
//! first success.

use std::time::Duration;

/// How fast the error rate rises on a failure and decays on a success.
const ALPHA_FAILURE: f64 = 0.3;
const ALPHA_SUCCESS: f64 = 0.05;
const ALPHA_LATENCY: f64 = 0.2;
/// A target never drops below this share of its weight while its breaker is
/// closed, so it keeps getting enough traffic to show it recovered.
const MIN_FACTOR: f64 = 0.05;

#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    error_rate: f64,
    latency_ms: Option<f64>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            error_rate: 0.0,
            latency_ms: None,
        }
    }
}

impl Health {
    pub fn success(&mut self, latency: Duration) {
        self.error_rate *= 1.0 - ALPHA_SUCCESS;
        let ms = latency.as_secs_f64() * 1000.0;
        self.latency_ms = Some(match self.latency_ms {
            None => ms,
            Some(l) => l + ALPHA_LATENCY * (ms - l),
        });
    }

    pub fn failure(&mut self) {
        self.error_rate += ALPHA_FAILURE * (1.0 - self.error_rate);
    }

    pub fn error_rate(&self) -> f64 {
        self.error_rate
    }

    pub fn latency_ms(&self) -> Option<f64> {
        self.latency_ms
    }

    /// The share multiplier for a target, relative to the fastest latency
    /// among its peers (`best_latency_ms`).
    pub fn factor(&self, best_latency_ms: Option<f64>) -> f64 {
        let errors = (1.0 - self.error_rate).powi(2);
        let speed = match (best_latency_ms, self.latency_ms) {
            (Some(best), Some(mine)) if mine > 0.0 => (best.max(1.0) / mine.max(1.0)).min(1.0),
            _ => 1.0,
        };
        (errors * speed.sqrt()).max(MIN_FACTOR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_drop_fast_and_recover_slowly() {
        let mut h = Health::default();
        assert_eq!(h.factor(None), 1.0);
        for _ in 0..3 {
            h.failure();
        }
        let low = h.factor(None);
        assert!(low < 0.2, "{low}");
        h.success(Duration::from_millis(10));
        let after_one = h.factor(Some(10.0));
        assert!(
            after_one < 0.3,
            "one success does not restore the share: {after_one}"
        );
        for _ in 0..100 {
            h.success(Duration::from_millis(10));
        }
        assert!(h.factor(Some(10.0)) > 0.95);
    }

    #[test]
    fn slower_targets_get_less_but_never_nothing() {
        let mut fast = Health::default();
        let mut slow = Health::default();
        fast.success(Duration::from_millis(100));
        slow.success(Duration::from_millis(400));
        assert_eq!(fast.factor(Some(100.0)), 1.0);
        assert!((slow.factor(Some(100.0)) - 0.5).abs() < 1e-9);
        let mut dead = Health::default();
        for _ in 0..50 {
            dead.failure();
        }
        assert_eq!(dead.factor(None), MIN_FACTOR);
    }
}
