//! Spend prediction per task: from the cost of each step a task has taken
//! so far, predict what it will have spent later, so the watchdog can warn
//! (or act) before the budget stops the task rather than after.
//!
//! The model. An agent's task resends its growing context on every step,
//! so the cost of step `k` grows with `k`, and the task's total grows
//! faster than linearly. [`SpendFit`] fits the cost per step as a straight
//! line `c(k) = a + b·k` by ordinary least squares over every settled step
//! of the task (step numbers 1, 2, ...; costs in whatever unit the caller
//! counts: micro-dollars for money budgets). The predicted total at step
//! `m` is what was spent plus the fitted costs of the steps to come,
//! `Σ max(0, a + b·k)` for `k` in `n+1..=m` (closed form, no loop), so a
//! task whose context grows linearly is predicted exactly and a flat task
//! is predicted flat. A fit needs [`SpendFit::MIN_STEPS`] steps; before
//! that nothing is predicted (one or two steps say nothing about growth).
//!
//! The record is five numbers and the last step's time (see
//! [`SpendFit::encode`]); the gateway keeps it in its state store next to
//! the watchdog's (`spend:<agent>/<task>`), stepped with
//! [`crate::store::step_record`] when a step's cost is settled, so
//! replicas sharing a store fit a task together.

use std::time::Duration;

/// A task's fitted cost per step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpendFit {
    /// Settled steps.
    steps: u32,
    /// Their total cost.
    spent: u64,
    // Least-squares sums over (k, cost of step k).
    sum_y: f64,
    sum_ky: f64,
    sum_yy: f64,
    last_seen: Duration,
}

/// What the fit says about a task's budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Predicted total spend at step `at_step`.
    pub predicted: u64,
    pub at_step: u64,
    /// The first step the budget is predicted not to cover, when that
    /// falls within the horizon looked at.
    pub exhausted_at: Option<u64>,
    /// Whether the prediction crosses the budget.
    pub over: bool,
}

/// An agent's spend prediction: how far to look, and whether a predicted
/// overrun is the watchdog's yellow (a warning) or its red (its action).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forecast {
    pub horizon: Horizon,
    pub act: bool,
}

/// How far to look: the task's expected length when the agent's config
/// says it, else this many steps ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Horizon {
    pub expected_steps: Option<u64>,
    pub lookahead: u64,
}

impl SpendFit {
    /// Steps a fit needs before it predicts anything.
    pub const MIN_STEPS: u32 = 3;
    /// Bytes of [`SpendFit::encode`]'s output.
    pub const ENCODED_LEN: usize = 4 + 8 + 8 + 8 + 8 + 8;

    /// Settled steps so far.
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// Total cost of the settled steps.
    pub fn spent(&self) -> u64 {
        self.spent
    }

    /// Adds the next step's cost, settled at `now`. A task idle for `idle`
    /// starts over (a task id reused days later is another task).
    pub fn record(&mut self, cost: u64, now: Duration, idle: Duration) {
        if self.steps > 0 && now.saturating_sub(self.last_seen) >= idle {
            *self = SpendFit::default();
        }
        self.steps = self.steps.saturating_add(1);
        self.spent = self.spent.saturating_add(cost);
        let (k, y) = (f64::from(self.steps), cost as f64);
        self.sum_y += y;
        self.sum_ky += k * y;
        self.sum_yy += y * y;
        self.last_seen = now;
    }

    /// The fitted line `(a, b)`: cost of step `k` is `a + b·k`. `None`
    /// below [`SpendFit::MIN_STEPS`].
    ///
    /// A slope the steps do not support is not extrapolated: unless it
    /// passes a two-sided t-test at 95% (|b| above its standard error
    /// times Student's t for n-2 degrees of freedom), the line is flat at
    /// the mean cost. Three noisy steps of a flat task would otherwise
    /// draw a slope that, carried forty steps ahead, warns a task that
    /// will never overrun; a task whose context grows fits its slope
    /// closely and keeps it.
    pub fn line(&self) -> Option<(f64, f64)> {
        if self.steps < Self::MIN_STEPS {
            return None;
        }
        // The steps are 1..=n, so their sums have closed forms.
        let n = f64::from(self.steps);
        let mean_k = (n + 1.0) / 2.0;
        let mean_y = self.sum_y / n;
        // Centred sums: Σ(k-k̄)², Σ(k-k̄)(y-ȳ), Σ(y-ȳ)².
        let skk = n * (n * n - 1.0) / 12.0;
        let sky = self.sum_ky - n * mean_k * mean_y;
        let syy = (self.sum_yy - n * mean_y * mean_y).max(0.0);
        let b = sky / skk;
        let residual = (syy - b * sky).max(0.0);
        let se_b = (residual / (n - 2.0) / skk).sqrt();
        let b = if b.abs() > t95(self.steps - 2) * se_b {
            b
        } else {
            0.0
        };
        let a = mean_y - b * mean_k;
        (a.is_finite() && b.is_finite()).then_some((a, b))
    }

    /// Predicted cost of steps `n+1..=m` (zero for `m <= n`), each
    /// `max(0, a + b·k)`.
    fn still_to_spend(&self, (a, b): (f64, f64), m: u64) -> f64 {
        let n = u64::from(self.steps);
        if m <= n {
            return 0.0;
        }
        // The steps whose fitted cost is positive form one interval
        // (the line crosses zero at most once).
        let (mut lo, mut hi) = (n as f64 + 1.0, m as f64);
        if b > 0.0 {
            lo = lo.max((-a / b).floor() + 1.0);
        } else if b < 0.0 {
            hi = hi.min((-a / b).ceil() - 1.0);
        } else if a <= 0.0 {
            return 0.0;
        }
        if hi < lo {
            return 0.0;
        }
        let count = hi - lo + 1.0;
        let sum_k = (lo + hi) * count / 2.0;
        (a * count + b * sum_k).max(0.0)
    }

    /// The predicted total spend at step `m`.
    pub fn total_at(&self, m: u64) -> Option<u64> {
        let line = self.line()?;
        Some(saturate(self.spent as f64 + self.still_to_spend(line, m)))
    }

    /// The first step after the settled ones whose cost the budget is not
    /// predicted to cover, looking no further than step `limit`.
    pub fn exhausted_at(&self, budget: u64, limit: u64) -> Option<u64> {
        let line = self.line()?;
        let n = u64::from(self.steps);
        if self.spent > budget {
            return Some(n);
        }
        let room = (budget - self.spent) as f64;
        if limit <= n || self.still_to_spend(line, limit) <= room {
            return None;
        }
        // The total only grows with m: binary search for the first step
        // past the room.
        let (mut lo, mut hi) = (n + 1, limit);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.still_to_spend(line, mid) > room {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Some(lo)
    }

    /// Judges the task against `budget`: over when the total predicted at
    /// the horizon (the expected length, else `lookahead` steps ahead)
    /// exceeds it. `None` while the fit has too few steps.
    pub fn predict(&self, budget: u64, horizon: Horizon) -> Option<Prediction> {
        let n = u64::from(self.steps);
        let at_step = horizon
            .expected_steps
            .filter(|e| *e > n)
            .unwrap_or(n.saturating_add(horizon.lookahead.max(1)));
        let predicted = self.total_at(at_step)?;
        Some(Prediction {
            predicted,
            at_step,
            exhausted_at: self.exhausted_at(budget, at_step),
            over: predicted > budget,
        })
    }

    /// A fixed-size encoding for the state store.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::ENCODED_LEN);
        out.extend_from_slice(&self.steps.to_le_bytes());
        out.extend_from_slice(&self.spent.to_le_bytes());
        out.extend_from_slice(&self.sum_y.to_le_bytes());
        out.extend_from_slice(&self.sum_ky.to_le_bytes());
        out.extend_from_slice(&self.sum_yy.to_le_bytes());
        out.extend_from_slice(&(self.last_seen.as_millis() as u64).to_le_bytes());
        out
    }

    /// The inverse of [`SpendFit::encode`]; `None` for anything else (a
    /// record of another version is started over, never misread).
    pub fn decode(bytes: &[u8]) -> Option<SpendFit> {
        if bytes.len() != Self::ENCODED_LEN {
            return None;
        }
        let u32_at = |i: usize| bytes.get(i..i + 4)?.try_into().ok().map(u32::from_le_bytes);
        let u64_at = |i: usize| bytes.get(i..i + 8)?.try_into().ok().map(u64::from_le_bytes);
        let f64_at = |i: usize| bytes.get(i..i + 8)?.try_into().ok().map(f64::from_le_bytes);
        let fit = SpendFit {
            steps: u32_at(0)?,
            spent: u64_at(4)?,
            sum_y: f64_at(12)?,
            sum_ky: f64_at(20)?,
            sum_yy: f64_at(28)?,
            last_seen: Duration::from_millis(u64_at(36)?),
        };
        [fit.sum_y, fit.sum_ky, fit.sum_yy]
            .iter()
            .all(|x| x.is_finite())
            .then_some(fit)
    }
}

/// Student's t, two-sided 95%, for `dof` degrees of freedom (coarse
/// above 10: the value falls from 2.23 towards 1.96).
fn t95(dof: u32) -> f64 {
    const T: [f64; 10] = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23];
    match dof {
        0 => f64::INFINITY,
        1..=10 => T[dof as usize - 1],
        11..=20 => 2.2,
        21..=30 => 2.09,
        _ => 2.0,
    }
}

fn saturate(x: f64) -> u64 {
    if x >= u64::MAX as f64 {
        u64::MAX
    } else {
        x.max(0.0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_secs(3600);

    fn fit(costs: &[u64]) -> SpendFit {
        let mut f = SpendFit::default();
        for (i, c) in costs.iter().enumerate() {
            f.record(*c, Duration::from_secs(i as u64), IDLE);
        }
        f
    }

    #[test]
    fn a_linearly_growing_step_cost_is_fitted_exactly() {
        // Step k costs 100 + 50k: 150, 200, 250, 300.
        let f = fit(&[150, 200, 250, 300]);
        let (a, b) = f.line().unwrap();
        assert!(
            (a - 100.0).abs() < 1e-9 && (b - 50.0).abs() < 1e-9,
            "{a} {b}"
        );
        // Steps 5..=10 cost 350 + ... + 600 = 2850.
        assert_eq!(f.total_at(10), Some(900 + 2850));
        assert_eq!(f.total_at(4), Some(900));
    }

    #[test]
    fn nothing_is_predicted_from_too_few_steps() {
        let f = fit(&[150, 200]);
        assert_eq!(f.line(), None);
        let h = Horizon {
            expected_steps: None,
            lookahead: 5,
        };
        assert_eq!(f.predict(10, h), None);
    }

    #[test]
    fn a_growing_task_is_warned_steps_before_its_budget_runs_out() {
        // Context grows every step; budget 5000, looking 5 steps ahead.
        let h = Horizon {
            expected_steps: None,
            lookahead: 5,
        };
        let budget = 5000;
        let mut f = SpendFit::default();
        let mut spent = 0;
        let mut warned_at = None;
        let mut stopped_at = None;
        for k in 1..100u64 {
            let cost = 100 + 50 * k;
            // Admission of step k: the budget stops it when it cannot fit.
            if spent + cost > budget {
                stopped_at = Some(k);
                break;
            }
            if let Some(p) = f.predict(budget, h) {
                if p.over && warned_at.is_none() {
                    warned_at = Some(k);
                    assert!(p.exhausted_at.is_some());
                }
            }
            spent += cost;
            f.record(cost, Duration::from_secs(k), IDLE);
        }
        let (w, s) = (warned_at.unwrap(), stopped_at.unwrap());
        assert!(s - w >= 3, "warned at step {w}, stopped at {s}");
    }

    #[test]
    fn a_noisy_growing_task_keeps_its_slope() {
        // 100 + 50k, give or take 20.
        let costs: Vec<u64> = (1..=6u64).map(|k| 80 + 50 * k + (k * 13 % 41)).collect();
        let (_, b) = fit(&costs).line().unwrap();
        assert!((b - 50.0).abs() < 15.0, "{b}");
    }

    #[test]
    fn a_flat_task_under_budget_is_never_warned() {
        let h = Horizon {
            expected_steps: Some(40),
            lookahead: 5,
        };
        let mut f = SpendFit::default();
        for k in 1..=40u64 {
            // Noisy but flat around 100; 40 steps spend ~4000 of 5000.
            let cost = 95 + (k * 7 % 11);
            if let Some(p) = f.predict(5000, h) {
                assert!(!p.over, "step {k}: {p:?}");
                assert_eq!(p.exhausted_at, None);
            }
            f.record(cost, Duration::from_secs(k), IDLE);
        }
    }

    #[test]
    fn the_expected_length_is_the_horizon_when_configured() {
        let f = fit(&[100, 100, 100]);
        let h = Horizon {
            expected_steps: Some(50),
            lookahead: 5,
        };
        let p = f.predict(4000, h).unwrap();
        assert_eq!((p.at_step, p.predicted, p.over), (50, 5000, true));
        // 4000 covers step 40 exactly; step 41 is the first it does not.
        assert_eq!(p.exhausted_at, Some(41));
        // A task already past its expected length looks ahead instead.
        let h = Horizon {
            expected_steps: Some(2),
            lookahead: 5,
        };
        assert_eq!(f.predict(4000, h).unwrap().at_step, 8);
    }

    #[test]
    fn a_falling_cost_is_never_predicted_below_zero() {
        // 300, 200, 100: the line reaches zero at step 4.
        let f = fit(&[300, 200, 100]);
        assert_eq!(f.total_at(1000), Some(600));
        assert_eq!(f.exhausted_at(600, 1000), None);
    }

    #[test]
    fn an_idle_task_starts_over_and_the_record_round_trips() {
        let mut f = fit(&[10, 20, 30]);
        assert_eq!(SpendFit::decode(&f.encode()), Some(f));
        assert_eq!(f.encode().len(), SpendFit::ENCODED_LEN);
        assert_eq!(SpendFit::decode(&[0; 3]), None);
        f.record(5, Duration::from_secs(10_000), IDLE);
        assert_eq!((f.steps(), f.spent()), (1, 5));
    }

    #[test]
    fn huge_costs_saturate_instead_of_overflowing() {
        let f = fit(&[u64::MAX / 2, u64::MAX / 2, u64::MAX / 2]);
        assert_eq!(f.total_at(u64::MAX), Some(u64::MAX));
        assert!(f.exhausted_at(1000, u64::MAX).is_some());
    }
}
