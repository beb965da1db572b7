//! The task watchdog: per task (agent and `x-agent-task-id`), calls per
//! minute, total steps, an EMA of latency (alpha 0.3) and the share of the
//! task budget used. Green passes; yellow passes with a warning; red applies
//! the configured action (degrade to a cheaper model, or stop the task).

use crate::store::StoreError;
use std::collections::VecDeque;
// ahash, not SipHash: these maps are looked up on every request, and keys
// agents influence (task ids) still get a randomly keyed, DoS-resistant hash.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
use std::sync::Mutex;
use std::time::Duration;

const ALPHA: f64 = 0.3;
const MINUTE: Duration = Duration::from_secs(60);
/// Most tasks watched at once; idle ones go first.
const MAX_TASKS: usize = 100_000;

/// Limits for one level; any one reached puts the task at that level.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Thresholds {
    pub calls_per_minute: Option<u32>,
    pub steps: Option<u64>,
    pub latency_ms: Option<f64>,
    pub budget_used: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RedAction {
    /// Rewrite the request to this cheaper model.
    Degrade(String),
    Stop,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WatchdogConfig {
    pub yellow: Thresholds,
    pub red: Thresholds,
    pub action: RedAction,
    pub idle_ttl: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Green,
    Yellow,
    Red,
}

/// What the watchdog saw of a task when it judged a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub level: Level,
    pub calls_last_minute: u32,
    pub steps: u64,
    pub latency_ema_ms: Option<f64>,
    pub budget_used: Option<f64>,
    /// Which threshold set the level (for logs), e.g. `steps >= 100`.
    pub reason: Option<String>,
}

#[derive(Debug, Default)]
struct Task {
    calls: VecDeque<Duration>,
    steps: u64,
    ema_ms: Option<f64>,
    budget_used: Option<f64>,
    last_seen: Duration,
}

#[derive(Debug, Default)]
pub struct Watchdog {
    tasks: Mutex<HashMap<String, Task>>,
}

fn reached(
    t: &Thresholds,
    calls: u32,
    steps: u64,
    ema: Option<f64>,
    used: Option<f64>,
) -> Option<String> {
    if let Some(c) = t.calls_per_minute.filter(|c| calls >= *c) {
        return Some(format!("calls per minute {calls} >= {c}"));
    }
    if let Some(s) = t.steps.filter(|s| steps >= *s) {
        return Some(format!("steps {steps} >= {s}"));
    }
    if let (Some(l), Some(e)) = (t.latency_ms, ema) {
        if e >= l {
            return Some(format!("latency EMA {e:.0} ms >= {l:.0} ms"));
        }
    }
    if let (Some(b), Some(u)) = (t.budget_used, used) {
        if u >= b {
            return Some(format!(
                "budget used {:.0}% >= {:.0}%",
                u * 100.0,
                b * 100.0
            ));
        }
    }
    None
}

impl Watchdog {
    pub fn new() -> Watchdog {
        Watchdog::default()
    }

    /// Counts one call of task `key` at `now` and judges it. `Err`: the
    /// state could not be read (the caller denies).
    pub fn call(
        &self,
        key: &str,
        cfg: &WatchdogConfig,
        now: Duration,
    ) -> Result<Reading, StoreError> {
        let mut tasks = self
            .tasks
            .lock()
            .map_err(|_| StoreError("watchdog state poisoned".into()))?;
        if tasks.len() >= MAX_TASKS && !tasks.contains_key(key) {
            tasks.retain(|_, t| now.saturating_sub(t.last_seen) < cfg.idle_ttl);
            if tasks.len() >= MAX_TASKS {
                if let Some(k) = tasks
                    .iter()
                    .min_by_key(|(_, t)| t.last_seen)
                    .map(|(k, _)| k.clone())
                {
                    tasks.remove(&k);
                }
            }
        }
        let t = tasks.entry(key.to_string()).or_default();
        if t.steps > 0 && now.saturating_sub(t.last_seen) >= cfg.idle_ttl {
            *t = Task::default();
        }
        t.last_seen = now;
        while t.calls.front().is_some_and(|c| *c + MINUTE <= now) {
            t.calls.pop_front();
        }
        t.calls.push_back(now);
        t.steps += 1;
        let calls = t.calls.len() as u32;
        let (red, yellow) = (
            reached(&cfg.red, calls, t.steps, t.ema_ms, t.budget_used),
            reached(&cfg.yellow, calls, t.steps, t.ema_ms, t.budget_used),
        );
        let (level, reason) = match (red, yellow) {
            (Some(r), _) => (Level::Red, Some(r)),
            (None, Some(y)) => (Level::Yellow, Some(y)),
            (None, None) => (Level::Green, None),
        };
        Ok(Reading {
            level,
            calls_last_minute: calls,
            steps: t.steps,
            latency_ema_ms: t.ema_ms,
            budget_used: t.budget_used,
            reason,
        })
    }

    /// Records a finished call's latency into the task's EMA.
    pub fn latency(&self, key: &str, latency: Duration) {
        if let Ok(mut tasks) = self.tasks.lock() {
            if let Some(t) = tasks.get_mut(key) {
                let ms = latency.as_secs_f64() * 1000.0;
                t.ema_ms = Some(t.ema_ms.map_or(ms, |e| e + ALPHA * (ms - e)));
            }
        }
    }

    /// Records the share of the task budget used, as of the last admission.
    pub fn budget_used(&self, key: &str, used: f64) {
        if let Ok(mut tasks) = self.tasks.lock() {
            if let Some(t) = tasks.get_mut(key) {
                t.budget_used = Some(used);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn cfg() -> WatchdogConfig {
        WatchdogConfig {
            yellow: Thresholds {
                calls_per_minute: Some(3),
                steps: Some(10),
                latency_ms: Some(500.0),
                budget_used: Some(0.5),
            },
            red: Thresholds {
                calls_per_minute: Some(5),
                steps: Some(20),
                budget_used: Some(0.9),
                ..Thresholds::default()
            },
            action: RedAction::Stop,
            idle_ttl: 3600 * S,
        }
    }

    #[test]
    fn calls_per_minute_walk_through_the_levels_and_age_out() {
        let w = Watchdog::new();
        let levels: Vec<Level> = (0..5)
            .map(|_| w.call("t", &cfg(), S).unwrap().level)
            .collect();
        assert_eq!(
            levels,
            [
                Level::Green,
                Level::Green,
                Level::Yellow,
                Level::Yellow,
                Level::Red
            ]
        );
        let r = w.call("t", &cfg(), 62 * S).unwrap();
        assert_eq!(
            (r.level, r.calls_last_minute, r.steps),
            (Level::Green, 1, 6)
        );
    }

    #[test]
    fn steps_latency_and_budget_count_too() {
        let w = Watchdog::new();
        for i in 0..9 {
            assert_eq!(w.call("t", &cfg(), S * 60 * i).unwrap().level, Level::Green);
        }
        assert_eq!(
            w.call("t", &cfg(), 600 * S).unwrap().level,
            Level::Yellow,
            "10 steps"
        );
        let w = Watchdog::new();
        w.call("u", &cfg(), S).unwrap();
        w.latency("u", Duration::from_millis(100));
        w.latency("u", Duration::from_millis(1500)); // EMA 100 + 0.3 * 1400 = 520
        let r = w.call("u", &cfg(), 100 * S).unwrap();
        assert_eq!(r.level, Level::Yellow);
        assert!((r.latency_ema_ms.unwrap() - 520.0).abs() < 1e-9);
        w.budget_used("u", 0.95);
        let r = w.call("u", &cfg(), 200 * S).unwrap();
        assert_eq!(r.level, Level::Red);
        assert_eq!(r.reason.as_deref(), Some("budget used 95% >= 90%"));
    }
}
