//! The shared-state settings (`state:`): memory or Redis, and the bounds
//! on task and session state per agent.

use super::runtime::{at_least_one, Errs};
use super::spec;
use crate::secret::Secret;
use std::time::Duration;

/// How much per-task state one agent may hold (`state.tasks_per_agent`,
/// `state.sessions_per_agent`): each agent's own, so one agent's fresh ids
/// never push out another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskBounds {
    pub tasks_per_agent: usize,
    pub sessions_per_agent: usize,
}

impl Default for TaskBounds {
    fn default() -> Self {
        TaskBounds {
            tasks_per_agent: loopgate_policy::MAX_RECORDS,
            sessions_per_agent: loopgate_policy::MAX_SESSIONS,
        }
    }
}

/// Where shared state lives.
#[derive(Debug, Clone, PartialEq)]
pub enum StateSettings {
    Memory,
    Redis(RedisSettings),
}

#[derive(Debug, Clone, PartialEq)]
pub struct RedisSettings {
    pub url: Secret,
    pub key_prefix: String,
    pub timeout: Duration,
    pub on_unavailable: spec::OnUnavailable,
    pub replicas: u64,
    pub slot_lease: Duration,
    pub breaker_sync: Duration,
}

impl StateSettings {
    pub(super) fn redacted_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            StateSettings::Memory => json!({"backend": "memory"}),
            StateSettings::Redis(r) => json!({
                "backend": "redis",
                "url": redact_url(r.url.expose()),
                "key_prefix": r.key_prefix,
                "timeout_ms": r.timeout.as_millis() as u64,
                "on_unavailable": match r.on_unavailable {
                    spec::OnUnavailable::Deny => "deny",
                    spec::OnUnavailable::Local => "local",
                },
                "replicas": r.replicas,
                "slot_lease_ms": r.slot_lease.as_millis() as u64,
                "breaker_sync_ms": r.breaker_sync.as_millis() as u64,
            }),
        }
    }
}

/// `redis://user:pw@host/0` -> `redis://user:***@host/0`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".into();
    };
    match rest.rsplit_once('@') {
        Some((creds, host)) => {
            let user = creds.split_once(':').map_or("", |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_string(),
    }
}

pub(super) fn build_state(
    errs: &mut Errs,
    s: Option<&spec::StateSpec>,
    env: &dyn Fn(&str) -> Option<String>,
) -> StateSettings {
    let Some(s) = s else {
        return StateSettings::Memory;
    };
    if s.backend == spec::StateBackend::Memory {
        for (set, field) in [
            (s.url.is_some(), "url"),
            (s.url_env.is_some(), "url_env"),
            (s.on_unavailable.is_some(), "on_unavailable"),
        ] {
            if set {
                errs.push(format!("state.{field}"), "only applies to backend: redis");
            }
        }
        return StateSettings::Memory;
    }
    let url = match (&s.url, &s.url_env) {
        (Some(u), None) => Some(u.clone()),
        (None, Some(var)) => errs.env_value("state.url_env", var, env),
        (Some(_), Some(_)) => {
            errs.push("state.url", "give url or url_env, not both");
            None
        }
        (None, None) => {
            errs.push("state.url", "backend: redis needs url (or url_env)");
            None
        }
    };
    if let Some(u) = &url {
        if !(u.starts_with("redis://") || u.starts_with("unix://")) {
            errs.push(
                if s.url.is_some() {
                    "state.url"
                } else {
                    "state.url_env"
                },
                format!("`{}` is not a redis:// URL", redact_url(u)),
            );
        }
    }
    let positive = |errs: &mut Errs, field: &str, v: Option<u64>, default: u64| {
        at_least_one(errs, &format!("state.{field}"), v, default)
    };
    let on_unavailable = s.on_unavailable.unwrap_or(spec::OnUnavailable::Deny);
    let replicas = match (on_unavailable, s.replicas) {
        (spec::OnUnavailable::Local, None) => {
            errs.push(
                "state.replicas",
                "on_unavailable: local needs replicas (each instance then admits 1/replicas of every limit)",
            );
            1
        }
        _ => positive(errs, "replicas", s.replicas, 1),
    };
    StateSettings::Redis(RedisSettings {
        url: Secret::new(url.unwrap_or_default()),
        key_prefix: s.key_prefix.clone().unwrap_or_else(|| "loopgate:".into()),
        timeout: Duration::from_millis(positive(errs, "timeout_ms", s.timeout_ms, 50)),
        on_unavailable,
        replicas,
        slot_lease: Duration::from_millis(positive(errs, "slot_lease_ms", s.slot_lease_ms, 30_000)),
        breaker_sync: Duration::from_millis(positive(
            errs,
            "breaker_sync_ms",
            s.breaker_sync_ms,
            250,
        )),
    })
}
