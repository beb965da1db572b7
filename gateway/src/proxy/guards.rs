//! Agent guards at admission: the loop guard (with its snapshot files) and
//! the task watchdog. They deny with their own codes (`loop_detected`,
//! `task_stopped`), never with anything that looks like an upstream
//! timeout, so agents do not retry into them.

use super::env::Env;
use crate::access_log::rfc3339_millis;
use crate::config::runtime::Guards;
use crate::error::GatewayError;
use loopgate_breaker::{fingerprint, LoopConfig, LoopVerdict, TaskState, Trip};
use loopgate_policy::{AgentRules, Deny, DenyCode, Level, RedAction, WatchdogConfig};
use std::time::{SystemTime, UNIX_EPOCH};

/// Judges the task's next call for loops: `what` names the endpoint, tool
/// or MCP tool, `value` is the call reduced to its meaningful parts (a
/// model call's body; a tool call's method, normalised path, query and
/// body digest; an MCP call's tool and arguments), so model and tool calls
/// of one task share one ring. `Ok(Some(deny))` for a loop; `Err` when the
/// state cannot be read.
pub async fn check_loop(
    env: &Env<'_>,
    rules: &AgentRules,
    guards: &Guards,
    cfg: &LoopConfig,
    task_key: &str,
    what: &str,
    value: &serde_json::Value,
) -> Result<Option<Deny>, GatewayError> {
    let fp = fingerprint(what, value, cfg);
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
        LoopVerdict::Tripped(trip) => {
            log::warn!(
                "loop detected: agent `{}` task `{task_key}`: a cycle of {} request(s) repeated {} times; blocked for {} s (trip {})",
                rules.name,
                trip.block_len,
                cfg.repeats,
                trip.cooldown.as_secs(),
                trip.trips
            );
            env.metrics
                .loop_trips
                .with_label_values(&[&rules.name])
                .inc();
            if let Some(dir) = &guards.snapshot_dir {
                write_snapshot(dir.clone(), &rules.name, task_key, cfg, &trip);
            }
            Some(
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
                .never_retryable(),
            )
        }
    })
}

/// Runs the task's loop state one step in the state store: read, judge
/// (the pure [`TaskState::step`]), write back if nobody else wrote since
/// (a request of the same task on another replica); else read again.
async fn loop_step(
    env: &Env<'_>,
    task_key: &str,
    fp: loopgate_breaker::Fingerprint,
    cfg: &LoopConfig,
) -> Result<LoopVerdict, GatewayError> {
    let unavailable = |e: loopgate_policy::StoreError| {
        GatewayError::Denied(Deny::new(
            DenyCode::StateUnavailable,
            format!("loop state unavailable: {}", e.0),
        ))
    };
    let key = format!("loop:{task_key}");
    // Kept while the task may come back, and at least through a cool-down.
    let ttl = cfg.idle_ttl.max(cfg.max_cooldown);
    for _ in 0..8 {
        let now = env.clock.now();
        let (version, mut task) = match env.store.record_get(now, &key).await {
            Ok(Some((v, bytes))) => (Some(v), TaskState::decode(&bytes).unwrap_or_default()),
            Ok(None) => (None, TaskState::default()),
            Err(e) => return Err(unavailable(e)),
        };
        let verdict = task.step(fp, cfg, now);
        match env
            .store
            .record_swap(now, &key, version, task.encode(), ttl)
            .await
        {
            Ok(true) => return Ok(verdict),
            Ok(false) => continue, // another request of the task got there first
            Err(e) => return Err(unavailable(e)),
        }
    }
    Err(GatewayError::Denied(Deny::new(
        DenyCode::PolicyUnavailable,
        "loop state kept changing under this request",
    )))
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
        "state": {"trips": trip.trips, "blocked_for_ms": trip.cooldown.as_millis() as u64},
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

/// Counts the task's call and applies the watchdog's level.
pub fn watch(
    env: &Env<'_>,
    rules: &AgentRules,
    cfg: &WatchdogConfig,
    task_key: &str,
) -> Result<Watch, GatewayError> {
    let r = env
        .watchdog
        .call(task_key, cfg, env.clock.now())
        .map_err(|_| {
            GatewayError::Denied(Deny::new(
                DenyCode::PolicyUnavailable,
                "watchdog state unavailable",
            ))
        })?;
    let reason = r.reason.unwrap_or_default();
    let level = |l: &str| env.metrics.guard.with_label_values(&[&rules.name, l]).inc();
    Ok(match (r.level, &cfg.action) {
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
