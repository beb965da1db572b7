//! Agents (`agents:` and the `policy:` defaults they start from): each
//! agent's name, key, rules and limits, its guards and the settings behind
//! them (budgets, forwarded headers, the loop guard, the watchdog, blocked
//! phrases, dry run, required headers), and its tool and MCP grants
//! (validated in `tools` and `mcp`).

use super::mcp::{build_mcp_grants, McpAccess};
use super::runtime::{check_body_limit, check_positive, list, patterns, Errs};
use super::spec;
use super::tools::{build_tool_grants, ToolGrant};
use loopgate_breaker::LoopConfig;
use loopgate_policy::price::usd_to_micros;
use loopgate_policy::{
    AgentKeys, AgentRules, Budgets, DenyCode, Endpoint, KeyDigest, KeyIndex, Limits, Mode,
    PatternList, PhraseMatcher, RedAction, Team, Thresholds, WatchdogConfig,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// The `policy:` section: what an agent without its own setting gets.
pub(super) struct Defaults<'s> {
    policy: &'s spec::PolicySpec,
    phrases: Option<Arc<PhraseMatcher>>,
    dry_run: HashSet<DenyCode>,
    headers: Vec<String>,
    max_body_bytes: u64,
}

/// Validates the `policy:` defaults.
pub(super) fn policy_defaults<'s>(
    errs: &mut Errs,
    policy: &'s spec::PolicySpec,
    max_body_bytes: u64,
) -> Defaults<'s> {
    let phrases = match &policy.blocked_phrases {
        Some(p) if !p.is_empty() => compile_phrases(errs, "policy.blocked_phrases", p),
        _ => None,
    };
    let dry_run = parse_dry_run(errs, "policy.dry_run", policy.dry_run.as_deref());
    let headers = parse_headers(
        errs,
        "policy.required_headers",
        policy.required_headers.as_deref(),
    );
    for (field, v) in [
        ("max_tokens", policy.max_tokens),
        ("max_messages", policy.max_messages.map(|n| n as u64)),
        ("requests_per_minute", policy.requests_per_minute),
        ("tokens_per_minute", policy.tokens_per_minute),
        ("max_in_flight", policy.max_in_flight),
    ] {
        check_positive(errs, &format!("policy.{field}"), v);
    }
    Defaults {
        policy,
        phrases,
        dry_run,
        headers,
        max_body_bytes,
    }
}

/// Every agent, each list indexed like `agents`.
#[derive(Default)]
pub(super) struct Agents {
    pub agents: Vec<Arc<AgentRules>>,
    pub guards: Vec<Guards>,
    pub forward_headers: Vec<Vec<http::HeaderName>>,
    pub tool_access: Vec<HashMap<String, ToolGrant>>,
    pub mcp_access: Vec<HashMap<String, Arc<McpAccess>>>,
    pub keys: KeyIndex<usize>,
}

/// Validates every agent; a key may belong to one agent only.
pub(super) fn build_agents(
    errs: &mut Errs,
    specs: &BTreeMap<String, spec::AgentSpec>,
    defaults: &Defaults<'_>,
    tool_names: &HashSet<String>,
    mcp_servers: &HashSet<String>,
    teams: &HashMap<String, Arc<Team>>,
) -> Agents {
    let mut out = Agents::default();
    let mut key_owner: HashMap<String, String> = HashMap::new();
    for (name, a) in specs {
        let at = format!("agents.{name}");
        let digest = match KeyDigest::from_hex(&a.key_sha256) {
            Ok(d) => Some(d),
            Err(why) => {
                errs.push(format!("{at}.key_sha256"), why);
                None
            }
        };
        if let Some(d) = digest {
            if let Some(other) = key_owner.insert(d.to_hex(), name.clone()) {
                errs.push(
                    format!("{at}.key_sha256"),
                    format!("the same key is already used by agent `{other}`"),
                );
            }
            out.keys.insert(d, out.agents.len());
        }
        let mut rules = build_rules(errs, &at, name, a, defaults);
        if let Some(t) = &a.team {
            match teams.get(t) {
                Some(team) => rules.team = Some(team.clone()),
                None => errs.push(
                    format!("{at}.team"),
                    format!(
                        "no team `{t}` under `teams:` (teams: {})",
                        super::runtime::list(teams.keys())
                    ),
                ),
            }
        }
        let guards = build_guards(errs, &at, a, defaults.policy, &rules.models);
        let predicts = guards
            .watchdog
            .as_ref()
            .is_some_and(|w| w.predict.is_some());
        if predicts && rules.budgets.task_usd.is_none() {
            // A prediction is judged against the task's money budget.
            errs.push(
                format!("{at}.watchdog.predict"),
                "needs a task money budget (`budgets.task_usd`) to predict against",
            );
        }
        out.guards.push(guards);
        out.forward_headers.push(build_forward_headers(
            errs,
            &format!("{at}.forward_headers"),
            a.forward_headers.as_deref().unwrap_or_default(),
        ));
        out.tool_access
            .push(build_tool_grants(errs, &at, &a.tool_access, tool_names));
        out.mcp_access
            .push(build_mcp_grants(errs, &at, &a.mcp_access, mcp_servers));
        out.agents.push(Arc::new(rules));
    }
    out
}

/// An agent's rules and limits: its own settings, else the policy's.
fn build_rules(
    errs: &mut Errs,
    at: &str,
    name: &str,
    a: &spec::AgentSpec,
    defaults: &Defaults<'_>,
) -> AgentRules {
    let policy = defaults.policy;
    // The name keys the agent's task state (`agent/task`), which the
    // state is bounded per agent by, and labels its metrics.
    if !valid_name(name) {
        errs.push(
            at,
            "an agent name is 1-64 characters of A-Z, a-z, 0-9, `.`, `_` and `-`",
        );
    }
    if a.models.is_empty() {
        errs.push(
            format!("{at}.models"),
            "at least one model is required (use \"*\" to allow every routed model)",
        );
    }
    let models = patterns(errs, &format!("{at}.models"), &a.models);
    let tools = a
        .tools
        .as_ref()
        .map(|t| patterns(errs, &format!("{at}.tools"), t));
    let paths = a.paths.as_ref().map(|p| endpoints(errs, at, p));
    let max_body = a.max_body_bytes.unwrap_or(defaults.max_body_bytes);
    if a.max_body_bytes.is_some() {
        check_body_limit(errs, &format!("{at}.max_body_bytes"), max_body);
    }
    for (field, v) in [
        ("max_tokens", a.max_tokens),
        ("max_messages", a.max_messages.map(|n| n as u64)),
        ("requests_per_minute", a.requests_per_minute),
        ("tokens_per_minute", a.tokens_per_minute),
        ("max_in_flight", a.max_in_flight),
    ] {
        check_positive(errs, &format!("{at}.{field}"), v);
    }
    let phrases = match &a.blocked_phrases {
        None => defaults.phrases.clone(),
        Some(p) if p.is_empty() => None,
        Some(p) => compile_phrases(errs, &format!("{at}.blocked_phrases"), p),
    };
    let dry_run = match &a.dry_run {
        None => defaults.dry_run.clone(),
        Some(d) => parse_dry_run(errs, &format!("{at}.dry_run"), Some(d)),
    };
    let required_headers = match &a.required_headers {
        None => defaults.headers.clone(),
        Some(h) => parse_headers(errs, &format!("{at}.required_headers"), Some(h)),
    };
    let mode = match a.mode.or(policy.mode) {
        Some(spec::ModeSpec::DryRun) => Mode::DryRun,
        Some(spec::ModeSpec::Enforce) | None => Mode::Enforce,
    };
    // An agent's own section replaces the policy default whole; errors
    // name the section they come from.
    let budgets_at = if a.budgets.is_some() { at } else { "policy" };
    let budgets = build_budgets(
        errs,
        budgets_at,
        a.budgets.as_ref().or(policy.budgets.as_ref()),
    );
    AgentRules {
        name: Arc::from(name),
        models,
        paths,
        tools,
        required_headers,
        max_body_bytes: max_body,
        max_tokens: a.max_tokens.or(policy.max_tokens),
        over_limit: match a.max_tokens_over_limit.or(policy.max_tokens_over_limit) {
            Some(spec::OverLimitSpec::Clamp) => loopgate_policy::rules::OverLimit::Clamp,
            Some(spec::OverLimitSpec::Refuse) | None => loopgate_policy::rules::OverLimit::Refuse,
        },
        max_messages: a.max_messages.or(policy.max_messages),
        phrases,
        limits: Limits {
            requests_per_minute: a.requests_per_minute.or(policy.requests_per_minute),
            tokens_per_minute: a.tokens_per_minute.or(policy.tokens_per_minute),
            max_in_flight: a.max_in_flight.or(policy.max_in_flight),
        },
        budgets,
        team: None,
        mode,
        dry_run,
        keys: AgentKeys::new(name),
    }
}

/// `teams:`: money budgets shared by the agents that name the team. A
/// team name keys its store windows and labels nothing agents send.
pub(super) fn build_teams(
    errs: &mut Errs,
    specs: &BTreeMap<String, spec::TeamSpec>,
) -> HashMap<String, Arc<Team>> {
    let mut out = HashMap::new();
    for (name, t) in specs {
        let at = format!("teams.{name}");
        if !valid_name(name) {
            errs.push(
                &at,
                "a team name is 1-64 characters of A-Z, a-z, 0-9, `.`, `_` and `-`",
            );
        }
        let daily = usd(errs, &format!("{at}.daily_usd"), t.daily_usd);
        let monthly = usd(errs, &format!("{at}.monthly_usd"), t.monthly_usd);
        // A budget written but wrong has its own error above.
        if t.daily_usd.is_none() && t.monthly_usd.is_none() {
            errs.push(&at, "a team needs daily_usd or monthly_usd (or both)");
        }
        out.insert(name.clone(), Arc::new(Team::new(name, daily, monthly)));
    }
    out
}

/// A budget in US dollars as micro-dollars; a bad one is an error at `at`.
fn usd(errs: &mut Errs, at: &str, v: Option<f64>) -> Option<u64> {
    let v = v?;
    match usd_to_micros(v) {
        Some(m) if m > 0 => Some(m),
        _ => {
            errs.push(
                at,
                format!("`{v}` is not a budget: US dollars, more than 0 (at least $0.000001) and at most 1e12"),
            );
            None
        }
    }
}

/// `agents.<name>.paths`: the endpoints the agent may call.
fn endpoints(errs: &mut Errs, at: &str, paths: &[String]) -> HashSet<Endpoint> {
    if paths.is_empty() {
        errs.push(
            format!("{at}.paths"),
            "must not be empty (omit it to allow every endpoint)",
        );
    }
    let mut set = HashSet::new();
    for (j, p) in paths.iter().enumerate() {
        match Endpoint::from_path(p) {
            Some(e) if e.allowed_as() == e => {
                set.insert(e);
            }
            Some(e) => errs.push(
                format!("{at}.paths[{j}]"),
                format!(
                    "`{p}` is allowed wherever `{}` is: name that",
                    e.allowed_as().path()
                ),
            ),
            None => errs.push(
                format!("{at}.paths[{j}]"),
                format!(
                    "`{p}` is not an endpoint Loopgate serves (one of: {})",
                    list(
                        Endpoint::ALL
                            .iter()
                            .filter(|e| e.allowed_as() == **e)
                            .map(|e| e.path())
                    )
                ),
            ),
        }
    }
    set
}

/// An agent's loop guard and watchdog: its own sections, else the
/// policy's. The loop guard is on by default (window 10, repeats 3): a
/// gateway for agents does not ship with its seat belt unbuckled;
/// `loop_guard: {enabled: false}` turns it off. It only acts on requests
/// that name a task.
fn build_guards(
    errs: &mut Errs,
    at: &str,
    a: &spec::AgentSpec,
    policy: &spec::PolicySpec,
    models: &PatternList,
) -> Guards {
    let pick = |own: bool| if own { at } else { "policy" };
    let loop_spec = a.loop_guard.as_ref().or(policy.loop_guard.as_ref());
    let watchdog_spec = a.watchdog.as_ref().or(policy.watchdog.as_ref());
    let default_loops = spec::LoopGuardSpec::default();
    Guards {
        loops: build_loops(
            errs,
            pick(a.loop_guard.is_some()),
            loop_spec.unwrap_or(&default_loops),
        ),
        snapshot_dir: loop_spec
            .and_then(|l| l.snapshot_dir.as_ref())
            .map(std::path::PathBuf::from),
        watchdog: watchdog_spec
            .and_then(|w| build_watchdog(errs, pick(a.watchdog.is_some()), w, models)),
    }
}

/// An agent's guards (the budgets live in its `AgentRules`).
#[derive(Debug, Clone, Default)]
pub struct Guards {
    pub loops: Option<LoopConfig>,
    pub snapshot_dir: Option<std::path::PathBuf>,
    pub watchdog: Option<WatchdogConfig>,
}

fn build_budgets(errs: &mut Errs, at: &str, b: Option<&spec::BudgetsSpec>) -> Budgets {
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
        task_usd: usd(errs, &field("task_usd"), b.task_usd),
        daily_usd: usd(errs, &field("daily_usd"), b.daily_usd),
        monthly_usd: usd(errs, &field("monthly_usd"), b.monthly_usd),
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

fn build_forward_headers(errs: &mut Errs, at: &str, names: &[String]) -> Vec<http::HeaderName> {
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

fn build_loops(errs: &mut Errs, at: &str, l: &spec::LoopGuardSpec) -> Option<LoopConfig> {
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
        stop_after_trips: l.stop_after_trips.unwrap_or(d.stop_after_trips),
        idle_ttl: d.idle_ttl,
    })
}

/// An agent's or a team's name: 1-64 characters of `A-Z a-z 0-9 . _ -`
/// (it keys store records and labels metrics).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Steps a spend prediction looks ahead without an expected length.
const DEFAULT_LOOKAHEAD: u64 = 5;

/// The watchdog's default yellow context occupancy.
const DEFAULT_CONTEXT_SHARE: f64 = 0.8;

pub(super) fn thresholds(errs: &mut Errs, at: &str, t: &spec::ThresholdsSpec) -> Thresholds {
    for (field, share) in [
        ("budget_used", t.budget_used),
        ("context_share", t.context_share),
    ] {
        if share.is_some_and(|b| !(b > 0.0 && b <= 1.0)) {
            errs.push(format!("{at}.{field}"), "must be a share in (0, 1]");
        }
    }
    Thresholds {
        calls_per_minute: t.calls_per_minute,
        steps: t.steps,
        latency_ms: t.latency_ms,
        budget_used: t.budget_used,
        context_share: t.context_share,
    }
}

fn build_watchdog(
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
    let mut yellow = thresholds(errs, &format!("{at}.watchdog.yellow"), &w.yellow);
    // A watched task is warned when a prompt fills most of its model's
    // window, unless told otherwise.
    yellow.context_share = yellow.context_share.or(Some(DEFAULT_CONTEXT_SHARE));
    let predict = w.predict.as_ref().map(|p| {
        for (f, v) in [
            ("expected_steps", p.expected_steps),
            ("lookahead_steps", p.lookahead_steps),
        ] {
            if v == Some(0) {
                errs.push(format!("{at}.watchdog.predict.{f}"), "must be at least 1");
            }
        }
        loopgate_policy::predict::Forecast {
            horizon: loopgate_policy::predict::Horizon {
                expected_steps: p.expected_steps,
                lookahead: p.lookahead_steps.unwrap_or(DEFAULT_LOOKAHEAD),
            },
            act: p.on_overrun == Some(spec::OnOverrunSpec::Act),
        }
    });
    Some(WatchdogConfig {
        yellow,
        red: thresholds(errs, &format!("{at}.watchdog.red"), &w.red),
        action,
        idle_ttl: Duration::from_secs(3600),
        predict,
    })
}

fn compile_phrases(errs: &mut Errs, path: &str, phrases: &[String]) -> Option<Arc<PhraseMatcher>> {
    match PhraseMatcher::new(phrases) {
        Ok(m) => Some(Arc::new(m)),
        Err(why) => {
            errs.push(path, why);
            None
        }
    }
}

fn parse_dry_run(errs: &mut Errs, path: &str, codes: Option<&[String]>) -> HashSet<DenyCode> {
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

fn parse_headers(errs: &mut Errs, path: &str, headers: Option<&[String]>) -> Vec<String> {
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
