//! Agent guards at admission: the loop guard (with its snapshot files),
//! the task watchdog and tool isolation, each keeping a task's state as a
//! record in the state store (`loop:<agent>/<task>`,
//! `watch:<agent>/<task>`, `streak:<agent>/<task>/<tool>`), stepped by
//! pure functions through the store's one read-modify-write, so replicas
//! sharing a store judge a task together. A record the store cannot
//! answer for is a `state_unavailable` refusal that admission's fail mode
//! decides on. They deny with their own codes (`loop_detected`,
//! `task_stopped`, `tool_isolated`), never with anything that looks like
//! an upstream timeout, so agents do not retry into them.

use super::env::Env;
use crate::access_log::rfc3339_millis;
use crate::config::runtime::Guards;
use crate::error::GatewayError;
use loopgate_breaker::{Fingerprint, LoopConfig, LoopVerdict, TaskState, Trip};
use loopgate_policy::predict::{Forecast, Prediction, SpendFit};
use loopgate_policy::watchdog::TaskState as WatchState;
use loopgate_policy::{
    AgentRules, Deny, DenyCode, Level, RedAction, StepError, Streak, WatchdogConfig,
};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Judges the task's next call for loops by its fingerprint, taken from
/// what names the endpoint, tool or MCP tool and the call reduced to its
/// meaningful parts (a model call's body, read as it was judged; a tool
/// call's method, normalised path, query and body digest; an MCP call's
/// tool and arguments), so model and tool calls of one task share one
/// ring. `Ok(Some(deny))` for a loop; `Err` when the state cannot be read.
pub async fn check_loop(
    env: &Env<'_>,
    rules: &AgentRules,
    guards: &Guards,
    cfg: &LoopConfig,
    task_key: &str,
    fp: Fingerprint,
) -> Result<Option<Deny>, GatewayError> {
    let verdict = loop_step(env, task_key, fp, cfg).await?;
    Ok(match verdict {
        LoopVerdict::Allow => None,
        LoopVerdict::CoolingDown { retry_after } => Some(
            Deny::new(
                DenyCode::LoopDetected,
                format!("task `{task_key}` is cooling down after a detected loop"),
            )
            .retry_after(retry_after)
            .never_retryable(),
        ),
        LoopVerdict::Stopped => Some(stopped_by_loop(task_key)),
        LoopVerdict::Tripped(trip) => {
            if trip.stopped {
                log::warn!(
                    "loop detected: agent `{}` task `{task_key}`: a cycle of {} request(s) repeated {} times after {} earlier trip(s); task stopped",
                    rules.name,
                    trip.block_len,
                    cfg.repeats,
                    trip.trips.saturating_sub(1),
                );
            } else {
                log::warn!(
                    "loop detected: agent `{}` task `{task_key}`: a cycle of {} request(s) repeated {} times; blocked for {} s (trip {})",
                    rules.name,
                    trip.block_len,
                    cfg.repeats,
                    trip.cooldown.as_secs(),
                    trip.trips
                );
            }
            env.metrics
                .loop_trips
                .with_label_values(&[&rules.name])
                .inc();
            if let Some(dir) = &guards.snapshot_dir {
                write_snapshot(dir.clone(), &rules.name, task_key, cfg, &trip);
            }
            Some(if trip.stopped {
                stopped_by_loop(task_key)
            } else {
                Deny::new(
                    DenyCode::LoopDetected,
                    format!(
                        "task `{task_key}` repeated a cycle of {} request(s) {} times; blocked for {} s",
                        trip.block_len,
                        cfg.repeats,
                        trip.cooldown.as_secs()
                    ),
                )
                .retry_after(trip.cooldown)
                .never_retryable()
            })
        }
    })
}

/// A task the loop guard stopped: refused until it has been idle for the
/// guard's idle time. Nothing but a new task clears it, so no retry can
/// help (`x-should-retry: false`).
fn stopped_by_loop(task_key: &str) -> Deny {
    Deny::new(
        DenyCode::TaskStopped,
        format!(
            "task `{task_key}` was stopped by the loop guard: it repeated its loop after a cool-down"
        ),
    )
    .never_retryable()
}

/// Runs the task's loop state one step in the state store (the pure
/// [`TaskState::step`]).
async fn loop_step(
    env: &Env<'_>,
    task_key: &str,
    fp: loopgate_breaker::Fingerprint,
    cfg: &LoopConfig,
) -> Result<LoopVerdict, GatewayError> {
    // Kept while the task may come back, and at least through a cool-down.
    let ttl = cfg.idle_ttl.max(cfg.max_cooldown);
    let step = |task: Option<TaskState>, now| {
        let mut task = task.unwrap_or_default();
        let verdict = task.step(fp, cfg, now);
        (Some(task.encode()), verdict)
    };
    let key = format!("loop:{task_key}");
    step_record(env, "loop", &key, ttl, TaskState::decode, step).await
}

/// Runs one step on a task's record in the state store (the store's one
/// read-modify-write, [`loopgate_policy::step_record`]), with the
/// refusals admission's fail mode understands: `state_unavailable` when
/// the store cannot answer, `policy_unavailable` when the record kept
/// changing under the request. `what` names the state in them.
async fn step_record<T, V>(
    env: &Env<'_>,
    what: &str,
    key: &str,
    ttl: Duration,
    decode: fn(&[u8]) -> Option<T>,
    step: impl FnMut(Option<T>, Duration) -> (Option<Vec<u8>>, V),
) -> Result<V, GatewayError> {
    let stepped = loopgate_policy::step_record(env.store, env.clock, key, ttl, decode, step).await;
    stepped.map_err(|e| match e {
        StepError::Store(e) => unavailable(what, e),
        StepError::Contended => GatewayError::Denied(Deny::new(
            DenyCode::PolicyUnavailable,
            format!("{what} state kept changing under this request"),
        )),
    })
}

/// A guard's record the store could not answer for.
fn unavailable(what: &str, e: loopgate_policy::StoreError) -> GatewayError {
    GatewayError::Denied(Deny::new(
        DenyCode::StateUnavailable,
        format!("{what} state unavailable: {}", e.0),
    ))
}

/// The store key of a task's failure streak with a tool
/// (`<agent>/<task>/<tool>`).
fn streak_key(streak: &str) -> String {
    format!("streak:{streak}")
}

/// How long a tool is still isolated for the task, if it is: a read of
/// the streak record, never a write.
pub async fn isolated(env: &Env<'_>, streak: &str) -> Result<Option<Duration>, GatewayError> {
    let read = |s: Option<Streak>, now| (None, s.and_then(|s| s.isolated(now)));
    // The TTL is never used: this step writes nothing.
    let ttl = Duration::ZERO;
    step_record(
        env,
        "tool isolation",
        &streak_key(streak),
        ttl,
        Streak::decode,
        read,
    )
    .await
}

/// Records a tool's answer in the task's streak: `Some(signature)` for a
/// failure (same signature = same failing answer), `None` for a success.
/// Returns whether this answer isolated the tool.
pub async fn record_streak(
    env: &Env<'_>,
    streak: &str,
    failure: Option<u64>,
    threshold: u32,
    cooldown: Duration,
) -> Result<bool, GatewayError> {
    let step = |s: Option<Streak>, now| {
        let (next, isolated) = Streak::step(s, failure, threshold, cooldown, now);
        (next.map(|s| s.encode()), isolated)
    };
    let (key, ttl) = (streak_key(streak), Streak::ttl(cooldown));
    step_record(env, "tool isolation", &key, ttl, Streak::decode, step).await
}

/// A predicted overrun, for the log and the refusal.
fn overrun(p: &Prediction, budget: u64) -> String {
    let usd = |micro: u64| micro as f64 / 1e6;
    let mut why = format!(
        "predicted spend ${:.4} by step {} > task budget ${:.4}",
        usd(p.predicted),
        p.at_step,
        usd(budget)
    );
    if let Some(step) = p.exhausted_at {
        why += &format!(" (runs out at step {step})");
    }
    why
}

/// The store key of a task's spend fit (see `policy::predict`).
fn spend_key(task_key: &str) -> String {
    format!("spend:{task_key}")
}

/// The task's predicted spend against its money budget `budget`
/// (micro-dollars), from the fit of its settled steps. `None` until the
/// fit has steps enough.
pub async fn forecast(
    env: &Env<'_>,
    task_key: &str,
    budget: u64,
    f: &Forecast,
) -> Result<Option<Prediction>, GatewayError> {
    let rec = env
        .store
        .record_get(env.clock.now(), &spend_key(task_key))
        .await
        .map_err(|e| unavailable("spend prediction", e))?;
    let fit = rec.and_then(|(_, bytes)| SpendFit::decode(&bytes));
    Ok(fit.and_then(|fit| fit.predict(budget, f.horizon)))
}

/// Adds a settled step's cost (micro-dollars) to the task's spend fit.
/// Best effort, like the latency reading: a store that cannot be reached
/// loses the step (the fit then predicts from the others).
pub async fn record_spend(env: &Env<'_>, task_key: &str, ttl: Duration, cost: u64) {
    let step = |fit: Option<SpendFit>, now| {
        let mut fit = fit.unwrap_or_default();
        fit.record(cost, now, ttl);
        (Some(fit.encode()), ())
    };
    let key = spend_key(task_key);
    if let Err(e) = step_record(env, "spend prediction", &key, ttl, SpendFit::decode, step).await {
        log::debug!("task `{task_key}`: spend not recorded: {e}");
    }
}

/// The store key of a task's watchdog state.
fn watch_key(task_key: &str) -> String {
    format!("watch:{task_key}")
}

/// Records a finished call's latency into the task's EMA, if the task is
/// watched (a task the watchdog never counted gets no record). Best
/// effort: a store that cannot be reached loses the reading.
pub async fn watch_latency(env: &Env<'_>, task_key: &str, ttl: Duration, took: Duration) {
    let step = |task: Option<WatchState>, _| {
        let bytes = task.map(|mut task| {
            task.latency(took);
            task.encode()
        });
        (bytes, ())
    };
    let key = watch_key(task_key);
    if let Err(e) = step_record(env, "watchdog", &key, ttl, WatchState::decode, step).await {
        log::debug!("task `{task_key}`: latency not recorded: {e}");
    }
}

/// Writes the trip's evidence as JSON, off the proxy thread (trips are rare).
fn write_snapshot(
    dir: std::path::PathBuf,
    agent: &str,
    task_key: &str,
    cfg: &LoopConfig,
    trip: &Trip,
) {
    let now = SystemTime::now();
    let ms = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let task = task_key.split_once('/').map_or(task_key, |(_, t)| t);
    let safe: String = task
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    let snapshot = serde_json::json!({
        "time": rfc3339_millis(now),
        "agent": agent,
        "task": task,
        "fingerprints": trip.trail,
        "cycle_length": trip.block_len,
        "thresholds": {"window": cfg.window, "repeats": cfg.repeats, "last_turns": cfg.last_turns},
        "state": if trip.stopped {
            serde_json::json!({"trips": trip.trips, "stopped": true})
        } else {
            serde_json::json!({"trips": trip.trips, "blocked_for_ms": trip.cooldown.as_millis() as u64})
        },
    });
    let path = dir.join(format!("{safe}-{ms}.json"));
    let _ = std::thread::Builder::new()
        .name("loopgate-snapshot".into())
        .spawn(move || {
            let text = serde_json::to_vec_pretty(&snapshot).unwrap_or_default();
            if let Err(e) = std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(&path, text))
            {
                log::error!("cannot write loop snapshot {}: {e}", path.display());
            }
        });
}

pub enum Watch {
    Green,
    Warn,
    Stop(Deny),
    Degrade(String),
}

/// What the watchdog measured of a call, besides the task's own record:
/// the share of the task budget used as of this admission, the share of
/// its model's context window the call's prompt fills, and the task's
/// spend prediction.
#[derive(Debug, Default, Clone, Copy)]
pub struct Observed {
    pub used: Option<f64>,
    pub context: Option<f64>,
    /// With the task's money budget (micro-dollars) it was made against.
    pub predicted: Option<(Prediction, u64)>,
}

/// Counts the task's call and applies the watchdog's level.
pub async fn watch(
    env: &Env<'_>,
    rules: &AgentRules,
    cfg: &WatchdogConfig,
    task_key: &str,
    seen: Observed,
) -> Result<Watch, GatewayError> {
    let Observed { used, context, .. } = seen;
    let step = |task: Option<WatchState>, now| {
        let mut task = task.unwrap_or_default();
        let reading = task.step(cfg, now, used, context);
        (Some(task.encode()), reading)
    };
    let key = watch_key(task_key);
    let r = step_record(
        env,
        "watchdog",
        &key,
        cfg.idle_ttl,
        WatchState::decode,
        step,
    )
    .await?;
    let (mut at, mut reason) = (r.level, r.reason.unwrap_or_default());
    if let (Some((p, budget)), Some(f)) = (seen.predicted.filter(|(p, _)| p.over), cfg.predict) {
        let why = overrun(&p, budget);
        log::warn!(
            "spend prediction: agent `{}` task `{task_key}`: {why}",
            rules.name
        );
        env.metrics
            .predicted_overruns
            .with_label_values(&[&rules.name])
            .inc();
        // The prediction raises the level to yellow (or red when the
        // agent acts on it); a level already higher stays.
        let by_prediction = if f.act { Level::Red } else { Level::Yellow };
        if by_prediction > at {
            (at, reason) = (by_prediction, why);
        }
    }
    let level = |l: &str| env.metrics.guard.with_label_values(&[&rules.name, l]).inc();
    Ok(match (at, &cfg.action) {
        (Level::Green, _) => Watch::Green,
        (Level::Yellow, _) => {
            log::warn!(
                "watchdog yellow: agent `{}` task `{task_key}`: {reason}",
                rules.name
            );
            level("warn");
            Watch::Warn
        }
        (Level::Red, RedAction::Stop) => {
            log::warn!(
                "watchdog red: agent `{}` task `{task_key}` stopped: {reason}",
                rules.name
            );
            level("stop");
            Watch::Stop(
                Deny::new(
                    DenyCode::TaskStopped,
                    format!("task `{task_key}` was stopped by the watchdog: {reason}"),
                )
                .never_retryable(),
            )
        }
        (Level::Red, RedAction::Degrade(to)) => {
            log::warn!(
                "watchdog red: agent `{}` task `{task_key}` degraded to `{to}`: {reason}",
                rules.name
            );
            level("degrade");
            Watch::Degrade(to.clone())
        }
    })
}
