//! Validated, immutable runtime config: the `Config` snapshot, `build`
//! (spec in, every error collected, all or nothing) and the error helpers the
//! section modules share (`Errs`, `patterns`, the number checks). Each kind
//! of section is validated in its own module beside this one. Built only
//! from a spec that passed every check; shared by the proxy as an `Arc`
//! snapshot.

use super::spec::ConfigSpec;
use super::{ConfigError, ConfigErrors};
pub use crate::access_log::Target as AccessTarget;
use crate::connections::ConnectionLimits;
use crate::secret::Secret;
use loopgate_policy::{AgentRules, KeyIndex, PatternList};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::agents::{build_agents, policy_defaults, Agents};
pub use super::agents::{Guards, NEVER_FORWARDED, SCOPING_HEADERS};
use super::listen::{build_access_log, build_admin, build_connections, parse_addr, Admin};
use super::mcp::build_mcp_servers;
pub use super::mcp::{McpAccess, McpServer};
pub use super::providers::Provider;
use super::providers::{build_provider, PROVIDER_FIELDS};
use super::routes::{build_models, build_routes};
pub use super::routes::{Route, Routes, Target};
use super::state::build_state;
pub use super::state::{RedisSettings, StateSettings, TaskBounds};
use super::tools::build_tools;
pub use super::tools::{Idempotency, Tool, ToolGrant};

pub const DEFAULT_MAX_BODY_BYTES: u64 = 1024 * 1024;
/// Bodies are held in memory while judged; refuse configs that would let one
/// request pin more than this.
pub const MAX_MAX_BODY_BYTES: u64 = 256 * 1024 * 1024;

#[derive(Debug)]
pub struct Config {
    pub file: String,
    pub listen: SocketAddr,
    /// The agent listener's connection limits (`listen.connections`).
    pub connections: ConnectionLimits,
    pub threads: usize,
    pub admin_listen: Option<SocketAddr>,
    pub admin_token: Option<Secret>,
    /// Admin endpoints served without the token (`health`, `ready`, `metrics`).
    pub admin_open: Vec<String>,
    pub access_log: AccessTarget,
    pub providers: Vec<Arc<Provider>>,
    pub routes: Routes,
    /// What a money budget does with a model without a price
    /// (`on_unknown_price`, default `deny`).
    pub on_unknown_price: super::spec::UnknownPrice,
    /// Priced non-streamed answers carry `x-loopgate-cost-usd`
    /// (`cost_header`, default `false`).
    pub cost_header: bool,
    pub agents: Vec<Arc<AgentRules>>,
    /// Loop guard and watchdog per agent, indexed like `agents`.
    pub guards: Vec<Guards>,
    /// Per agent (indexed like `agents`): the scoping headers it may send
    /// upstream (see [`SCOPING_HEADERS`]); every other one is stripped.
    pub forward_headers: Vec<Vec<http::HeaderName>>,
    /// HTTP tool upstreams by name.
    pub tools: HashMap<String, Arc<Tool>>,
    /// Per agent (indexed like `agents`): the tools it may call, and how.
    pub tool_access: Vec<HashMap<String, ToolGrant>>,
    /// MCP servers by name.
    pub mcp_servers: HashMap<String, Arc<McpServer>>,
    /// Per agent (indexed like `agents`): the MCP servers it may use.
    pub mcp_access: Vec<HashMap<String, Arc<McpAccess>>>,
    pub keys: KeyIndex<usize>,
    pub max_body_bytes: u64,
    /// Read at start only: a reload that changes it is logged and ignored.
    pub state: StateSettings,
    /// Per-agent bounds of task state and sessions. Read at start only.
    pub bounds: TaskBounds,
}

/// `v`, or `default` when absent; 0 is an error at `path`.
pub(super) fn at_least_one(errs: &mut Errs, path: &str, v: Option<u64>, default: u64) -> u64 {
    match v {
        Some(0) => {
            errs.push(path, "must be at least 1");
            default
        }
        Some(n) => n,
        None => default,
    }
}

impl Config {
    /// Every upstream the gateway connects to: providers, tools and MCP servers.
    pub fn upstreams(&self) -> impl Iterator<Item = &Arc<Provider>> {
        self.providers
            .iter()
            .chain(self.tools.values().map(|t| &t.route.targets[0].provider))
            .chain(
                self.mcp_servers
                    .values()
                    .map(|m| &m.route.targets[0].provider),
            )
    }

    /// The running config as JSON for the admin API, every secret redacted:
    /// provider keys, the admin token and agent key digests never appear.
    pub fn redacted_json(&self) -> serde_json::Value {
        use serde_json::json;
        let ms = |d: Duration| d.as_millis() as u64;
        let providers: Vec<_> = self
            .providers
            .iter()
            .map(|p| {
                json!({
                    "name": &*p.name,
                    "kind": format!("{:?}", p.kind).to_lowercase(),
                    "base_url": format!("{}://{}{}", if p.tls { "https" } else { "http" }, p.authority, p.base_path),
                    "api_key": p.api_key.as_ref().map(|_| "[redacted]"),
                    "timeouts": {"connect_ms": ms(p.timeouts.connect), "read_ms": ms(p.timeouts.read), "total_ms": ms(p.timeouts.total)},
                    "breaker": {
                        "consecutive_failures": p.breaker.consecutive_failures,
                        "failure_rate": p.breaker.failure_rate,
                        "timeout_rate": p.breaker.timeout_rate,
                        "min_requests": p.breaker.min_requests,
                        "window_ms": ms(p.breaker.window),
                        "open_ms": ms(p.breaker.open_for),
                        "max_open_ms": ms(p.breaker.max_open_for),
                        "half_open_probes": p.breaker.half_open_probes,
                        "isolate_by": if p.isolate_by_agent { "agent" } else { "none" },
                        "probe": p.probe.as_ref().map(|pr| format!("{} {}", pr.method, pr.path)),
                    },
                    "price": p.price.map(|pr| json!({
                        "input": pr.input, "output": pr.output,
                        "cache_read": pr.cache_read, "cache_write": pr.cache_write,
                    })),
                })
            })
            .collect();
        let routes: Vec<_> = self
            .routes
            .names()
            .filter_map(|name| {
                let key = name.trim_end_matches('*');
                let (_, r) = self.routes.find(key)?;
                Some(json!({
                    "model": name,
                    "targets": r.targets.iter().map(|t| json!({
                        "provider": &*t.provider.name, "weight": t.weight, "model": t.model,
                    })).collect::<Vec<_>>(),
                    "max_attempts": r.max_attempts,
                    "max_total_ms": ms(r.max_total),
                }))
            })
            .collect();
        let agents: Vec<_> = self
            .agents
            .iter()
            .map(|a| {
                json!({
                    "name": a.name.as_ref(),
                    "key_sha256": "[redacted]",
                    "models": format!("{:?}", a.models.patterns()),
                    "paths": a.paths.as_ref().map(|p| {
                        let mut v: Vec<_> = p.iter().map(|e| e.path()).collect();
                        v.sort();
                        v
                    }),
                    "tools": a.tools.as_ref().map(|t| format!("{:?}", t.patterns())),
                    "mode": format!("{:?}", a.mode).to_lowercase(),
                    "max_body_bytes": a.max_body_bytes,
                    "max_tokens": a.max_tokens,
                    "max_tokens_over_limit": format!("{:?}", a.over_limit).to_lowercase(),
                    "max_messages": a.max_messages,
                    "required_headers": a.required_headers,
                    "blocked_phrases": a.phrases.as_ref().map(|p| p.len()),
                    "requests_per_minute": a.limits.requests_per_minute,
                    "tokens_per_minute": a.limits.tokens_per_minute,
                    "max_in_flight": a.limits.max_in_flight,
                })
            })
            .collect();
        json!({
            "file": self.file,
            "listen": self.listen.to_string(),
            "connections": self.connections.to_json(),
            "threads": self.threads,
            "admin": {
                "listen": self.admin_listen.map(|a| a.to_string()),
                "token": self.admin_token.as_ref().map(|_| "[redacted]"),
                "open": self.admin_open,
            },
            "access_log": format!("{:?}", self.access_log),
            "max_body_bytes": self.max_body_bytes,
            "state": self.state.redacted_json(),
            "providers": providers,
            "tools": self.tools.values().map(|t| {
                let p = &t.route.targets[0].provider;
                json!({
                    "name": t.name,
                    "base_url": format!("{}://{}{}", if p.tls { "https" } else { "http" }, p.authority, p.base_path),
                    "auth": (p.api_key.is_some() || p.custom_auth.is_some()).then_some("[redacted]"),
                    "auth_header": p.custom_auth.as_ref().map(|(h, _)| h.as_str()),
                    "probe": p.probe.as_ref().map(|pr| format!("{} {}", pr.method, pr.path)),
                })
            }).collect::<Vec<_>>(),
            "routes": routes,
            "prices": {
                "built_in_taken": super::prices::built_in_date(),
                "on_unknown_price": match self.on_unknown_price {
                    super::spec::UnknownPrice::Deny => "deny",
                    super::spec::UnknownPrice::Zero => "zero",
                },
                "cost_header": self.cost_header,
            },
            "agents": agents,
        })
    }
}

pub(super) struct Errs<'a> {
    pub(super) file: &'a str,
    pub(super) list: Vec<ConfigError>,
}

impl Errs<'_> {
    /// Records an error once: a shared section (`policy:` defaults) is
    /// validated for each agent that inherits it, and one mistake is one
    /// line.
    pub(super) fn push(&mut self, path: impl Into<String>, why: impl Into<String>) {
        let e = ConfigError {
            file: self.file.to_string(),
            path: path.into(),
            why: why.into(),
        };
        if !self.list.contains(&e) {
            self.list.push(e);
        }
    }

    /// The value of the environment variable `var` that `field` names,
    /// trimmed; an error at `field` (one wording everywhere) when it is
    /// unset or blank.
    pub(super) fn env_value(
        &mut self,
        field: &str,
        var: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Option<String> {
        match env(var) {
            Some(v) if !v.trim().is_empty() => Some(v.trim().to_string()),
            Some(_) => {
                self.push(field, format!("environment variable {var} is empty"));
                None
            }
            None => {
                self.push(field, format!("environment variable {var} is not set"));
                None
            }
        }
    }
}

/// Validates a spec; collects every error rather than stopping at the first.
pub fn build(
    file: &str,
    spec: ConfigSpec,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigErrors> {
    let mut errs = Errs {
        file,
        list: Vec::new(),
    };

    let listen = parse_addr(
        &mut errs,
        match spec.listen.mapping {
            true => "listen.address",
            false => "listen",
        },
        &spec.listen.address,
    );
    let connections = build_connections(&mut errs, spec.listen.connections.as_ref());
    let Admin {
        listen: admin_listen,
        token: admin_token,
        open: admin_open,
    } = build_admin(&mut errs, spec.admin.as_ref(), env);
    let access_log = build_access_log(&mut errs, spec.access_log.as_ref());
    let threads = match spec.threads {
        Some(0) => {
            errs.push("threads", "must be at least 1");
            1
        }
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };

    let state = build_state(&mut errs, spec.state.as_ref(), env);
    let mut bounds = TaskBounds::default();
    if let Some(s) = &spec.state {
        for (field, v, slot) in [
            (
                "tasks_per_agent",
                s.tasks_per_agent,
                &mut bounds.tasks_per_agent,
            ),
            (
                "sessions_per_agent",
                s.sessions_per_agent,
                &mut bounds.sessions_per_agent,
            ),
        ] {
            match v {
                Some(0) => errs.push(format!("state.{field}"), "must be at least 1"),
                Some(n) => *slot = n,
                None => {}
            }
        }
    }
    let max_body_bytes = spec.policy.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
    check_body_limit(&mut errs, "policy.max_body_bytes", max_body_bytes);

    let mut providers: HashMap<String, Arc<Provider>> = HashMap::new();
    if spec.providers.is_empty() {
        errs.push("providers", "at least one provider is required");
    }
    for (name, p) in &spec.providers {
        if let Some(provider) =
            build_provider(&mut errs, "providers", PROVIDER_FIELDS, name, p, env)
        {
            providers.insert(name.clone(), Arc::new(provider));
        }
    }

    let spec_tool_names: HashSet<String> = spec.tools.keys().cloned().collect();
    let spec_mcp_names: HashSet<String> = spec.mcp_servers.keys().cloned().collect();
    let tools = build_tools(&mut errs, spec.tools, env);
    let mcp_servers = build_mcp_servers(&mut errs, spec.mcp_servers, &spec_tool_names, env);

    let models = Arc::new(build_models(&mut errs, &spec.models));
    let routes = build_routes(
        &mut errs,
        &spec.routes,
        &spec.providers,
        &providers,
        &models,
    );

    // Routes are complete only when their providers and they themselves
    // built: only then is a model without one an error of the agent's.
    let routes_whole = errs.list.is_empty();
    let defaults = policy_defaults(&mut errs, &spec.policy, max_body_bytes);
    let teams = super::agents::build_teams(&mut errs, &spec.teams);
    let Agents {
        agents,
        guards,
        forward_headers,
        tool_access,
        mcp_access,
        keys,
    } = build_agents(
        &mut errs,
        &spec.agents,
        &defaults,
        &spec_tool_names,
        &spec_mcp_names,
        &teams,
    );

    if routes_whole {
        check_agent_routes(&mut errs, &agents, &routes);
    }
    let on_unknown_price = spec.on_unknown_price.unwrap_or_default();
    if on_unknown_price == super::spec::UnknownPrice::Deny {
        check_money_prices(&mut errs, &spec.agents, &agents, &routes);
    }
    if !errs.list.is_empty() {
        return Err(ConfigErrors(errs.list));
    }
    let mut providers: Vec<Arc<Provider>> = providers.into_values().collect();
    providers.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Config {
        file: file.to_string(),
        listen: listen.expect("validated"),
        connections,
        threads,
        admin_listen,
        admin_token,
        admin_open,
        access_log,
        providers,
        routes,
        on_unknown_price,
        cost_header: spec.cost_header.unwrap_or(false),
        agents,
        guards,
        forward_headers,
        tools,
        tool_access,
        mcp_servers,
        mcp_access,
        keys,
        max_body_bytes,
        state,
        bounds,
    })
}

/// With `on_unknown_price: deny`, an agent under a money budget may only
/// be allowed models that have a price: a budget that cannot be computed
/// is not a budget, and a call it cannot price would only be refused when
/// it comes. Wildcards are judged by what they can reach: an agent allowed
/// `gpt-4o*` (or `*`) reaches every route under it, and a route `foo*`
/// needs a price for every name under it (a catalog `foo*`-or-shorter
/// entry or its provider's `price:`), not just for the names it knows.
fn check_money_prices(
    errs: &mut Errs,
    specs: &std::collections::BTreeMap<String, super::spec::AgentSpec>,
    agents: &[Arc<AgentRules>],
    routes: &Routes,
) {
    for rules in agents.iter().filter(|r| r.money_budgeted()) {
        let name = &*rules.name;
        let b = &rules.budgets;
        let own = specs.get(name).is_some_and(|a| a.budgets.is_some());
        let field = match (b.task_usd.or(b.daily_usd).or(b.monthly_usd), own) {
            (Some(_), true) => format!("agents.{name}.budgets"),
            (Some(_), false) => "policy.budgets".to_string(),
            (None, _) => format!("agents.{name}.team"),
        };
        let mut seen = HashSet::new();
        for allowed in rules.models.patterns() {
            for (route, reach, r) in routes.reachable(allowed) {
                let Some(model) = r.unpriced(&reach) else {
                    continue;
                };
                if seen.insert(model.clone()) {
                    errs.push(
                        &field,
                        format!(
                            "agent `{name}` spends under a money budget and may call `{}` (route `{route}`), \
                             but `{model}` has no price and on_unknown_price is deny: give it a price \
                             (`models.{model}.price` or its provider's `price:`), or set on_unknown_price: zero",
                            allowed.as_config()
                        ),
                    );
                }
            }
        }
    }
}

/// Every model an agent may call has a route: one without passed
/// `loopgate check` and was refused 404 `no route for model` when called.
/// A wildcard needs at least one routed model under it.
fn check_agent_routes(errs: &mut Errs, agents: &[Arc<AgentRules>], routes: &Routes) {
    for rules in agents {
        for (i, allowed) in rules.models.patterns().iter().enumerate() {
            if routes.reachable(allowed).is_empty() {
                errs.push(
                    format!("agents.{}.models[{i}]", rules.name),
                    format!(
                        "no route serves `{}`: add it to a route's models or remove it \
                         (routed: {})",
                        allowed.as_config(),
                        list(routes.names())
                    ),
                );
            }
        }
    }
}

pub(super) fn list<I: IntoIterator<Item = S>, S: AsRef<str>>(items: I) -> String {
    items
        .into_iter()
        .map(|s| s.as_ref().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn patterns(errs: &mut Errs, path: &str, items: &[String]) -> PatternList {
    PatternList::parse(items).unwrap_or_else(|(j, why)| {
        errs.push(format!("{path}[{j}]"), why);
        PatternList::default()
    })
}

pub(super) fn check_positive(errs: &mut Errs, path: &str, v: Option<u64>) {
    if v == Some(0) {
        errs.push(path, "must be at least 1 (omit it for no limit)");
    }
}

pub(super) fn check_body_limit(errs: &mut Errs, path: &str, v: u64) {
    if v == 0 || v > MAX_MAX_BODY_BYTES {
        errs.push(path, format!("must be between 1 and {MAX_MAX_BODY_BYTES}"));
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::*;
    use crate::config::spec;
    use loopgate_policy::Endpoint;
    use loopgate_policy::LimitField;

    fn build_str(yaml: &str) -> Result<Config, Vec<String>> {
        let spec = parse("t.yaml", yaml).map_err(|e| vec![e.to_string()])?;
        build("t.yaml", spec, &|v| {
            (v == "SET").then(|| "sk-test".to_string())
        })
        .map_err(|e| e.0.iter().map(|e| e.to_string()).collect())
    }

    const GOOD: &str = r#"
listen: 127.0.0.1:8080
providers:
  oa: { kind: openai, base_url: "https://api.openai.com", api_key_env: SET }
  local: { kind: openai_compatible, base_url: "http://127.0.0.1:11434/prefix/" }
routes:
  - models: [gpt-4o, "gpt-4o-mini*"]
    targets: [ { provider: oa, weight: 3 }, { provider: local } ]
agents:
  a:
    key_sha256: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    models: [gpt-4o]
    paths: [/v1/chat/completions]
"#;

    #[test]
    fn header_values_are_built_once_and_checked_at_load() {
        let c = build_str(GOOD).unwrap();
        let oa = c.providers.iter().find(|p| &*p.name == "oa").unwrap();
        let cred = oa.credential_value.as_ref().unwrap();
        assert_eq!(cred.as_bytes(), b"Bearer sk-test");
        assert!(cred.is_sensitive(), "never printed by the http crate");
        assert_eq!(oa.name_value, "oa");
        assert_eq!(oa.authority_value, "api.openai.com");
        let local = c.providers.iter().find(|p| &*p.name == "local").unwrap();
        assert!(local.credential_value.is_none());
        assert_eq!(local.authority_value, "127.0.0.1:11434");

        // A key no header can carry is a load error that names the
        // variable, never the value.
        let spec = parse(
            "t.yaml",
            &GOOD.replace("api_key_env: SET", "api_key_env: BAD"),
        )
        .unwrap();
        let env = |v: &str| (v == "BAD").then(|| "sk-\u{1}secret".to_string());
        let e: Vec<String> = build("t.yaml", spec, &env)
            .unwrap_err()
            .0
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(
            e,
            ["t.yaml: providers.oa.api_key_env: the key holds characters an HTTP header cannot carry"]
        );
        assert!(!e[0].contains("secret"));
    }

    #[test]
    fn good_config_builds() {
        let c = build_str(GOOD).unwrap();
        assert_eq!(c.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
        let local = c.providers.iter().find(|p| &*p.name == "local").unwrap();
        assert_eq!(local.base_path, "/prefix");
        assert_eq!(local.port, 11434);
        assert!(!local.tls);
        assert!(local.addr.load().is_some());
        let oa = c.providers.iter().find(|p| &*p.name == "oa").unwrap();
        assert!(oa.tls && oa.port == 443 && oa.needs_dns());
        assert_eq!(oa.api_key.as_ref().unwrap().expose(), "sk-test");
        assert_eq!(c.routes.find("gpt-4o").map(|r| r.0), Some("gpt-4o"));
        assert_eq!(
            c.routes.find("gpt-4o-mini-2024").map(|r| r.0),
            Some("gpt-4o-mini*")
        );
        assert!(c.routes.find("gpt-4o-2024").is_none());
        assert_eq!(c.keys.lookup(b"abc"), Some(&0));
    }

    #[test]
    fn state_settings_are_validated_and_the_url_password_never_shown() {
        let c = build_str(GOOD).unwrap();
        assert_eq!(c.state, StateSettings::Memory);
        let with = |state: &str| build_str(&format!("{GOOD}\nstate: {state}\n"));
        let c = with("{ backend: redis, url: \"redis://u:hunter2@127.0.0.1:6379/0\" }").unwrap();
        let StateSettings::Redis(r) = &c.state else {
            panic!("redis expected");
        };
        assert_eq!(r.timeout, Duration::from_millis(50));
        assert_eq!(r.on_unavailable, spec::OnUnavailable::Deny);
        assert_eq!(r.key_prefix, "loopgate:");
        let shown = c.redacted_json().to_string();
        assert!(shown.contains("redis://u:***@127.0.0.1:6379/0"), "{shown}");
        assert!(!shown.contains("hunter2"));
        for (state, want) in [
            (
                "{ backend: redis }",
                "t.yaml: state.url: backend: redis needs url",
            ),
            (
                "{ backend: redis, url: \"http://x\" }",
                "t.yaml: state.url: `http://x` is not a redis:// URL",
            ),
            (
                "{ backend: redis, url: \"redis://h\", on_unavailable: local }",
                "t.yaml: state.replicas: on_unavailable: local needs replicas",
            ),
            (
                "{ backend: redis, url: \"redis://h\", timeout_ms: 0 }",
                "t.yaml: state.timeout_ms: must be at least 1",
            ),
            (
                "{ backend: redis, url_env: UNSET }",
                "t.yaml: state.url_env: environment variable UNSET is not set",
            ),
            (
                "{ backend: memory, url: \"redis://h\" }",
                "t.yaml: state.url: only applies to backend: redis",
            ),
            ("{ backend: etcd }", "state.backend: unknown variant `etcd`"),
        ] {
            let errs = with(state).unwrap_err();
            assert!(errs.iter().any(|e| e.contains(want)), "{state}: {errs:?}");
        }
    }

    #[test]
    fn routes_carry_retry_budget_and_renames() {
        let c = build_str(&GOOD.replace(
            "targets: [ { provider: oa, weight: 3 }, { provider: local } ]",
            "targets: [ { provider: oa, weight: 3 }, { provider: local, model: llama3.1 } ]\n    retry: { max_attempts: 3, max_total_ms: 5000 }",
        ))
        .unwrap();
        let r = c.routes.find("gpt-4o").unwrap().1;
        assert_eq!((r.max_attempts, r.max_total), (3, Duration::from_secs(5)));
        assert_eq!(r.targets[1].model.as_deref(), Some("llama3.1"));
        let c = build_str(GOOD).unwrap();
        assert_eq!(
            c.routes.find("gpt-4o").unwrap().1.max_attempts,
            2,
            "default: one per target"
        );
    }

    #[test]
    fn breaker_settings_are_validated() {
        let yaml = GOOD.replace(
            "api_key_env: SET }",
            "api_key_env: SET, breaker: { failure_rate: 1.5, open_ms: 0, isolate_by: agent, probe: { method: POST, path: /v1/models } } }",
        );
        let e = build_str(&yaml).unwrap_err().join("\n");
        assert!(
            e.contains("providers.oa.breaker.failure_rate: must be a share in (0, 1]"),
            "{e}"
        );
        assert!(
            e.contains("providers.oa.breaker.open_ms: must be at least 1"),
            "{e}"
        );
        assert!(
            e.contains("providers.oa.breaker.probe.method: `POST` is not read-only"),
            "{e}"
        );
        let yaml = GOOD.replace(
            "api_key_env: SET }",
            "api_key_env: SET, breaker: { consecutive_failures: 2, isolate_by: agent, probe: { path: /v1/models } } }",
        );
        let c = build_str(&yaml).unwrap();
        let oa = c.providers.iter().find(|p| &*p.name == "oa").unwrap();
        assert!(oa.isolate_by_agent && oa.breaker.active_probe);
        assert_eq!(oa.breaker.consecutive_failures, 2);
        assert_eq!(oa.probe.as_ref().unwrap().method, http::Method::GET);
    }

    #[test]
    fn unknown_fields_name_their_path() {
        let e = build_str(&GOOD.replace("paths:", "pathz:")).unwrap_err();
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("t.yaml: agents.a.pathz: unknown field `pathz`, expected one of"),
            "{e:?}"
        );
        assert!(e[0].ends_with("at line 13 column 5"), "{e:?}");
    }

    #[test]
    fn every_semantic_error_is_reported() {
        let bad = r#"
listen: nope
providers:
  oa: { kind: openai, base_url: "ftp://x", api_key_env: UNSET }
  an: { kind: anthropic, base_url: "https://api.anthropic.com" }
routes:
  - models: [m, "a*b"]
    targets: [ { provider: ghost, weight: 0 } ]
agents:
  a: { key_sha256: "xyz", models: [], paths: [/admin, /v1/messages/count_tokens] }
"#;
        let e = build_str(bad).unwrap_err().join("\n");
        for want in [
            "t.yaml: listen: `nope` is not an IP:port",
            "t.yaml: providers.oa.base_url: must start with http:// or https://",
            "t.yaml: providers.oa.api_key_env: environment variable UNSET is not set",
            "t.yaml: providers.an.api_key_env: required for this provider kind",
            "t.yaml: routes[0].models[1]: `a*b`",
            "t.yaml: routes[0].targets[0].weight: must be at least 1",
            "t.yaml: routes[0].targets[0].provider: unknown provider `ghost`",
            "t.yaml: agents.a.key_sha256: must be 64 hex digits",
            "t.yaml: agents.a.models: at least one model is required",
            "t.yaml: agents.a.paths[0]: `/admin` is not an endpoint",
            "t.yaml: agents.a.paths[1]: `/v1/messages/count_tokens` is allowed wherever `/v1/messages` is: name that",
        ] {
            assert!(e.contains(want), "missing {want:?} in\n{e}");
        }
    }

    #[test]
    fn money_budgets_and_teams_are_checked_and_built() {
        let yaml = format!(
            "{GOOD}    team: ops\n    budgets: {{ daily_usd: 2.5, monthly_usd: 40, task_usd: 0.25 }}\nteams:\n  ops: {{ daily_usd: 10 }}\n"
        );
        let c = build_str(&yaml).unwrap();
        let a = &c.agents[0];
        assert_eq!(
            (
                a.budgets.daily_usd,
                a.budgets.monthly_usd,
                a.budgets.task_usd
            ),
            (Some(2_500_000), Some(40_000_000), Some(250_000))
        );
        let team = a.team.as_ref().unwrap();
        assert_eq!(
            (&*team.name, team.daily_usd, team.monthly_usd),
            ("ops", Some(10_000_000), None)
        );
        let bad = format!(
            "{GOOD}    team: ghost\n    budgets: {{ daily_usd: -1, monthly_usd: .nan, task_usd: 0 }}\nteams:\n  ops: {{}}\n  \"b c\": {{ monthly_usd: 1e13 }}\n"
        );
        let e = build_str(&bad).unwrap_err().join("\n");
        for want in [
            "t.yaml: agents.a.budgets.daily_usd: `-1` is not a budget: US dollars, more than 0",
            "t.yaml: agents.a.budgets.monthly_usd: `NaN` is not a budget",
            "t.yaml: agents.a.budgets.task_usd: `0` is not a budget",
            "t.yaml: agents.a.team: no team `ghost` under `teams:` (teams: ",
            "t.yaml: teams.ops: a team needs daily_usd or monthly_usd (or both)",
            "t.yaml: teams.b c: a team name is 1-64 characters",
            "t.yaml: teams.b c.monthly_usd: `10000000000000` is not a budget",
        ] {
            assert!(e.contains(want), "missing {want:?} in\n{e}");
        }
    }

    #[test]
    fn a_money_budget_needs_a_price_for_every_model_the_agent_may_call() {
        let base = r#"
listen: 127.0.0.1:8080
providers:
  oa: { kind: openai_compatible, base_url: "http://127.0.0.1:1" }
routes:
  - models: [gpt-4o-mini, mystery]
    targets: [ { provider: oa } ]
  - models: ["llama*"]
    targets: [ { provider: oa } ]
agents:
  a:
    key_sha256: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    models: ["*"]
    budgets: { daily_usd: 5 }
"#;
        let e = build_str(base).unwrap_err().join("\n");
        for want in [
            "t.yaml: agents.a.budgets: agent `a` spends under a money budget and may call `*` (route `mystery`), but `mystery` has no price",
            "t.yaml: agents.a.budgets: agent `a` spends under a money budget and may call `*` (route `llama*`), but `llama*` has no price and on_unknown_price is deny",
        ] {
            assert!(e.contains(want), "missing {want:?} in\n{e}");
        }
        assert!(!e.contains("`gpt-4o-mini` has no price"), "{e}");
        // An exact grant reaches only its own name.
        let exact = base.replace(r#"models: ["*"]"#, "models: [gpt-4o-mini]");
        build_str(&exact).unwrap();
        // Priced: an entry for the name, and one for every name under the prefix.
        let priced = format!(
            "{base}models:\n  mystery: {{ price: {{ input: 1, output: 2 }} }}\n  \"ll*\": {{ price: {{ input: 0, output: 0 }} }}\n"
        );
        build_str(&priced).unwrap();
        // An entry for one name under the prefix does not price the rest.
        let one = format!("{base}models:\n  mystery: {{ price: {{ input: 1, output: 2 }} }}\n  llama3: {{ price: {{ input: 0, output: 0 }} }}\n");
        assert!(build_str(&one)
            .unwrap_err()
            .join("\n")
            .contains("`llama*` has no price"));
        // zero: counted as free, accepted.
        build_str(&format!("{base}on_unknown_price: zero\n")).unwrap();
        // A team's budget is named where the agent joins it.
        let team = base
            .replace("    budgets: { daily_usd: 5 }\n", "    team: t\n")
            .replace("agents:", "teams:\n  t: { monthly_usd: 10 }\nagents:");
        let e = build_str(&team).unwrap_err().join("\n");
        assert!(e.contains("t.yaml: agents.a.team: agent `a` spends"), "{e}");
    }

    #[test]
    fn tool_and_mcp_server_errors_name_the_section_and_field_written() {
        let yaml = format!(
            "{GOOD}tools:
  weather:
    base_url: \"ftp://tools.example/weather\"
    auth: {{ bearer_env: UNSET }}
    timeouts: {{ read_ms: 0 }}
    breaker: {{ open_ms: 0 }}
  orders:
    base_url: \"http://tools.example/orders\"
    auth: {{ header: x-key, value_env: UNSET }}
mcp_servers:
  files:
    url: \"ftp://mcp.example/mcp\"
    auth: {{ bearer_env: UNSET }}
    timeouts: {{ connect_ms: 0 }}
    stream_idle_ms: 0
    breaker: {{ failure_rate: 2.0 }}
  docs:
    url: \"http://mcp.example/mcp\"
    auth: {{ bearer_env: \"\" }}
"
        );
        let e = build_str(&yaml).unwrap_err().join("\n");
        for want in [
            "t.yaml: tools.weather.base_url: must start with http:// or https://",
            "t.yaml: tools.weather.auth.bearer_env: environment variable UNSET is not set",
            "t.yaml: tools.weather.timeouts.read_ms: must be between",
            "t.yaml: tools.weather.breaker.open_ms: must be at least 1",
            "t.yaml: tools.orders.auth.value_env: environment variable UNSET",
            "t.yaml: mcp_servers.files.url: must start with http:// or https://",
            "t.yaml: mcp_servers.files.auth.bearer_env: environment variable UNSET is not set",
            "t.yaml: mcp_servers.files.timeouts.connect_ms: must be between",
            "t.yaml: mcp_servers.files.stream_idle_ms: must be between 1 and 86400000",
            "t.yaml: mcp_servers.files.breaker.failure_rate: must be a share in (0, 1]",
            "t.yaml: mcp_servers.docs.auth.bearer_env: must name an environment variable",
        ] {
            assert!(e.contains(want), "missing {want:?} in\n{e}");
        }
        for wrong in ["tools.files", "tools.docs", "api_key_env"] {
            assert!(!e.contains(wrong), "{wrong:?} in\n{e}");
        }
        assert!(!e.contains("mcp_servers.files.base_url"), "{e}");
    }

    #[test]
    fn an_mcp_server_is_its_own_upstream_with_one_attempt() {
        let yaml = format!(
            "{GOOD}mcp_servers:
  files:
    url: \"http://127.0.0.1:9000/v1/mcp?x=1\"
    auth: {{ header: x-key, value_env: SET }}
    fail_mode: open
    writes: [\"write_*\"]
"
        );
        let c = build_str(&yaml).unwrap();
        let m = &c.mcp_servers["files"];
        assert_eq!(m.name, "files");
        assert_eq!(m.path, "/v1/mcp?x=1");
        assert!(m.fail_open);
        assert_eq!(m.route.max_attempts, 1);
        assert_eq!(m.route.targets.len(), 1);
        // Its own stream may be silent 5 minutes unless the config says.
        assert_eq!(m.stream_idle, std::time::Duration::from_secs(300));
        let p = &m.route.targets[0].provider;
        assert_eq!(
            (&*p.name, p.port, p.base_path.as_str()),
            ("files", 9000, "")
        );
        assert_eq!(p.custom_auth.as_ref().unwrap().0, "x-key");
        assert!(c.upstreams().any(|u| Arc::ptr_eq(u, p)));
    }

    #[test]
    fn shared_keys_and_duplicate_routes_are_errors() {
        let yaml = format!(
            "{GOOD}  b:\n    key_sha256: \"BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD\"\n    models: [\"*\"]\n"
        )
        .replace("[gpt-4o, \"gpt-4o-mini*\"]", "[gpt-4o, gpt-4o]");
        let e = build_str(&yaml).unwrap_err().join("\n");
        assert!(
            e.contains("agents.b.key_sha256: the same key is already used by agent `a`"),
            "{e}"
        );
        assert!(
            e.contains("routes[0].models[1]: model `gpt-4o` is routed twice"),
            "{e}"
        );
    }

    #[test]
    fn loop_guard_settings_are_bounded() {
        let yaml = GOOD.replace(
            "    paths: [/v1/chat/completions]\n",
            "    paths: [/v1/chat/completions]\n    loop_guard: { last_turns: 1001 }\n",
        );
        let e = build_str(&yaml).unwrap_err().join("\n");
        assert!(
            e.contains("agents.a.loop_guard.last_turns: must be at most 1000"),
            "{e}"
        );
        let ok = yaml.replace("last_turns: 1001", "last_turns: 1000");
        assert!(build_str(&ok).is_ok());
    }

    #[test]
    fn a_route_may_mix_api_families_and_says_which_calls_it_translates() {
        use loopgate_policy::Endpoint;
        let c = build_str(GOOD).unwrap();
        let (_, r) = c.routes.find("gpt-4o").unwrap();
        assert!(!r.translates(Endpoint::ChatCompletions));
        assert!(r.translates(Endpoint::Messages));
        assert!(!r.translates(Endpoint::Embeddings));
        let yaml = GOOD.replace(
            "local: { kind: openai_compatible",
            "local: { kind: anthropic, api_key_env: SET",
        );
        let c = build_str(&yaml).unwrap_or_else(|e| panic!("{e:?}"));
        let (_, r) = c.routes.find("gpt-4o").unwrap();
        assert!(r.translates(Endpoint::ChatCompletions));
        assert!(r.translates(Endpoint::Messages));
    }

    #[test]
    fn model_settings_decide_each_targets_output_field_and_maximum() {
        let yaml = GOOD.replace(
            "routes:\n",
            "models:\n  \"o3*\": { max_output_tokens: 100000 }\n  o3-mini-tiny: { max_output_tokens: 10, max_tokens_field: max_tokens, clamp_requested: true }\nroutes:\n  - models: [o3-mini, o3-mini-tiny]\n    targets: [ { provider: oa }, { provider: local, model: o3-mini, max_tokens_field: max_completion_tokens } ]\n",
        );
        let c = build_str(&yaml).unwrap();
        let (_, r) = c.routes.find("o3-mini").unwrap();
        let out = |i, model: &str, named: &str| {
            r.target_output(i, Endpoint::ChatCompletions, model, named)
                .unwrap()
        };
        // kind: openai and a reasoning model: max_completion_tokens; the
        // longest matching model entry gives the maximum.
        let o = out(0, "o3-mini", "o3-mini");
        assert_eq!(
            (o.field, o.max_output, o.clamp_asked),
            (LimitField::MaxCompletionTokens, Some(100_000), false)
        );
        let o = out(0, "o3-mini-tiny", "o3-mini-tiny");
        assert_eq!(
            (o.field, o.max_output, o.clamp_asked),
            (LimitField::MaxTokens, Some(10), true)
        );
        // The target's setting wins; a model the agent did not name is clamped.
        let o = out(1, "o3-mini", "o3-mini-tiny");
        assert_eq!(
            (o.field, o.clamp_asked),
            (LimitField::MaxCompletionTokens, true)
        );
        // gpt-4o on openai reads max_tokens; Responses reads its own field.
        let (_, r) = c.routes.find("gpt-4o").unwrap();
        let o = r
            .target_output(0, Endpoint::ChatCompletions, "gpt-4o", "gpt-4o")
            .unwrap();
        assert_eq!((o.field, o.max_output), (LimitField::MaxTokens, None));
        let o = r.target_output(0, Endpoint::Responses, "o3", "o3").unwrap();
        assert_eq!(o.field, LimitField::MaxOutputTokens);
        assert!(r
            .target_output(0, Endpoint::Embeddings, "gpt-4o", "gpt-4o")
            .is_none());

        let bad = GOOD.replace(
            "routes:\n",
            "models:\n  a: { max_output_tokens: 0 }\n  b: { clamp_requested: true }\n  \"c*d\": {}\nroutes:\n",
        );
        let e = build_str(&bad).unwrap_err().join("\n");
        for want in [
            "t.yaml: models.a.max_output_tokens: must be at least 1",
            "t.yaml: models.b.clamp_requested: needs max_output_tokens",
            "t.yaml: models.c*d:",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
        let bad = GOOD
            .replace(
                "providers:\n",
                "providers:\n  an: { kind: anthropic, base_url: \"https://x\", api_key_env: SET }\n",
            )
            .replace(
                "routes:\n",
                "routes:\n  - models: [claude]\n    targets: [ { provider: an } ]\n    max_tokens_field: max_completion_tokens\n",
            );
        let e = build_str(&bad).unwrap_err().join("\n");
        assert!(
            e.contains("t.yaml: routes[0].max_tokens_field: provider `an` is anthropic"),
            "{e}"
        );
    }

    #[test]
    fn secrets_do_not_appear_in_debug_output() {
        let c = build_str(GOOD).unwrap();
        assert!(!format!("{c:?}").contains("sk-test"));
    }
}
