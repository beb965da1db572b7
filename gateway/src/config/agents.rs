//! An agent's guards and the settings behind them: budgets, forwarded
//! headers, the loop guard, the watchdog, blocked phrases, dry run and
//! required headers (`agents:` and the `policy:` defaults).

use super::runtime::{list, Errs};
use super::spec;
use loopgate_breaker::LoopConfig;
use loopgate_policy::{
    Budgets, DenyCode, PatternList, PhraseMatcher, RedAction, Thresholds, WatchdogConfig,
};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// An agent's guards (the budgets live in its `AgentRules`).
#[derive(Debug, Clone, Default)]
pub struct Guards {
    pub loops: Option<LoopConfig>,
    pub snapshot_dir: Option<std::path::PathBuf>,
    pub watchdog: Option<WatchdogConfig>,
}

pub(super) fn build_budgets(errs: &mut Errs, at: &str, b: Option<&spec::BudgetsSpec>) -> Budgets {
    let d = Budgets::default();
    let Some(b) = b else { return d };
    let field = |f: &str| format!("{at}.budgets.{f}");
    for (f, v) in [
        ("task_tokens", b.task_tokens),
        ("daily_tokens", b.daily_tokens),
        ("task_ttl_ms", b.task_ttl_ms),
        ("default_max_tokens", b.default_max_tokens),
    ] {
        if v == Some(0) {
            errs.push(field(f), "must be at least 1");
        }
    }
    Budgets {
        task_tokens: b.task_tokens,
        task_ttl: b.task_ttl_ms.map_or(d.task_ttl, Duration::from_millis),
        daily_tokens: b.daily_tokens,
        default_max_tokens: b.default_max_tokens.unwrap_or(d.default_max_tokens),
    }
}

/// Agent headers that change what the upstream does on the gateway's
/// credential or that speak for the gateway: stripped from every request,
/// unless an agent's `forward_headers` allows one of the first group.
/// - re-scope the shared provider key: `openai-organization`,
///   `openai-project`; enable provider features: `anthropic-beta` (the MCP
///   connector among them), `anthropic-version` is set by the SDKs and kept;
/// - change the method a framework runs: `x-http-method-override` and its
///   spellings (a DELETE under a GET grant);
/// - speak for the client's address, which only the gateway knows:
///   `x-forwarded-*`, `forwarded`, `x-real-ip` and the CDN variants.
pub const SCOPING_HEADERS: [&str; 3] = ["openai-organization", "openai-project", "anthropic-beta"];
pub const NEVER_FORWARDED: [&str; 11] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "forwarded",
    "x-real-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "x-client-ip",
];

pub(super) fn build_forward_headers(
    errs: &mut Errs,
    at: &str,
    names: &[String],
) -> Vec<http::HeaderName> {
    let mut out = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let lower = n.to_ascii_lowercase();
        if !SCOPING_HEADERS.contains(&lower.as_str()) {
            errs.push(
                format!("{at}[{i}]"),
                format!(
                    "`{n}` cannot be forwarded; allowed: {}",
                    SCOPING_HEADERS.join(", ")
                ),
            );
            continue;
        }
        if let Ok(h) = http::HeaderName::from_bytes(lower.as_bytes()) {
            out.push(h);
        }
    }
    out
}

pub(super) fn build_loops(
    errs: &mut Errs,
    at: &str,
    l: &spec::LoopGuardSpec,
) -> Option<LoopConfig> {
    if l.enabled == Some(false) {
        return None;
    }
    let d = LoopConfig::default();
    let window = l.window.unwrap_or(d.window);
    let repeats = l.repeats.unwrap_or(d.repeats);
    if !(2..=1000).contains(&window) {
        errs.push(
            format!("{at}.loop_guard.window"),
            "must be between 2 and 1000",
        );
    }
    if repeats < 2 || repeats > window {
        errs.push(
            format!("{at}.loop_guard.repeats"),
            "must be at least 2 and at most `window`",
        );
    }
    let last_turns = l.last_turns.unwrap_or(d.last_turns).max(1);
    if last_turns > loopgate_breaker::MAX_LAST_TURNS {
        // Each is held as a digest while a body is read.
        errs.push(
            format!("{at}.loop_guard.last_turns"),
            "must be at most 1000",
        );
    }
    let cooldown = Duration::from_millis(l.cooldown_ms.unwrap_or(d.cooldown.as_millis() as u64));
    let max_cooldown = Duration::from_millis(
        l.max_cooldown_ms
            .unwrap_or(d.max_cooldown.as_millis() as u64)
            .max(1),
    );
    if cooldown.is_zero() || max_cooldown < cooldown {
        errs.push(
            format!("{at}.loop_guard.cooldown_ms"),
            "must be at least 1 and at most max_cooldown_ms",
        );
    }
    Some(LoopConfig {
        window,
        repeats,
        last_turns,
        ignore_fields: l.ignore_fields.clone().unwrap_or(d.ignore_fields),
        cooldown,
        max_cooldown,
        clear_after: l.clear_after.unwrap_or(d.clear_after).max(1),
        idle_ttl: d.idle_ttl,
    })
}

pub(super) fn thresholds(errs: &mut Errs, at: &str, t: &spec::ThresholdsSpec) -> Thresholds {
    if t.budget_used.is_some_and(|b| !(b > 0.0 && b <= 1.0)) {
        errs.push(format!("{at}.budget_used"), "must be a share in (0, 1]");
    }
    Thresholds {
        calls_per_minute: t.calls_per_minute,
        steps: t.steps,
        latency_ms: t.latency_ms,
        budget_used: t.budget_used,
    }
}

pub(super) fn build_watchdog(
    errs: &mut Errs,
    at: &str,
    w: &spec::WatchdogSpec,
    models: &PatternList,
) -> Option<WatchdogConfig> {
    let action = match (w.action, &w.degrade_to) {
        (spec::RedActionSpec::Stop, _) => RedAction::Stop,
        (spec::RedActionSpec::Degrade, Some(m)) => {
            if !models.allows(m) {
                errs.push(
                    format!("{at}.watchdog.degrade_to"),
                    format!("the agent may not use `{m}`"),
                );
            }
            RedAction::Degrade(m.clone())
        }
        (spec::RedActionSpec::Degrade, None) => {
            errs.push(
                format!("{at}.watchdog.degrade_to"),
                "required with action: degrade",
            );
            return None;
        }
    };
    Some(WatchdogConfig {
        yellow: thresholds(errs, &format!("{at}.watchdog.yellow"), &w.yellow),
        red: thresholds(errs, &format!("{at}.watchdog.red"), &w.red),
        action,
        idle_ttl: Duration::from_secs(3600),
    })
}

pub(super) fn compile_phrases(
    errs: &mut Errs,
    path: &str,
    phrases: &[String],
) -> Option<Arc<PhraseMatcher>> {
    match PhraseMatcher::new(phrases) {
        Ok(m) => Some(Arc::new(m)),
        Err(why) => {
            errs.push(path, why);
            None
        }
    }
}

pub(super) fn parse_dry_run(
    errs: &mut Errs,
    path: &str,
    codes: Option<&[String]>,
) -> HashSet<DenyCode> {
    let mut set = HashSet::new();
    for (j, c) in codes.unwrap_or_default().iter().enumerate() {
        match DenyCode::parse(c).filter(|c| c.dry_runnable()) {
            Some(code) => {
                set.insert(code);
            }
            None => errs.push(
                format!("{path}[{j}]"),
                format!(
                    "`{c}` is not a rule that can run in dry-run (one of: {})",
                    list(
                        DenyCode::ALL
                            .iter()
                            .filter(|c| c.dry_runnable())
                            .map(|c| c.as_str())
                    )
                ),
            ),
        }
    }
    set
}

pub(super) fn parse_headers(
    errs: &mut Errs,
    path: &str,
    headers: Option<&[String]>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (j, h) in headers.unwrap_or_default().iter().enumerate() {
        match http::HeaderName::from_bytes(h.as_bytes()) {
            Ok(name) => out.push(name.as_str().to_string()),
            Err(_) => errs.push(
                format!("{path}[{j}]"),
                format!("`{h}` is not a valid header name"),
            ),
        }
    }
    out
}
