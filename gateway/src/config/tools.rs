//! HTTP tools (`tools:`) and what an agent may do with one (`tool_access`).

use super::providers::{build_upstream, single_route, UpstreamSpec, TOOL_FIELDS};
use super::routes::Route;
use super::runtime::{check_body_limit, patterns, Errs};
use super::spec;
use loopgate_policy::PatternList;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// An HTTP tool upstream: a connection with its own breaker, served through
/// a one-target route (the gateway never retries a tool call on its own).
#[derive(Debug)]
pub struct Tool {
    pub name: String,
    pub route: Arc<Route>,
    pub idempotency: Option<Idempotency>,
    pub expect_json: bool,
    /// `pass_redirects: true`: a 3xx answer is relayed, not a failure.
    pub pass_redirects: bool,
    /// Same failing answer this many times in a row isolates the tool for the task.
    pub isolate_after: u32,
    pub isolate_for: Duration,
    /// `fail_mode: open`: forward when the gateway cannot decide.
    pub fail_open: bool,
}

#[derive(Debug, Clone)]
pub struct Idempotency {
    pub required: bool,
    pub ttl: Duration,
    pub max_record_bytes: usize,
    pub retry_after_failure: bool,
}

/// What an agent may do with one tool.
#[derive(Debug)]
pub struct ToolGrant {
    pub methods: Vec<http::Method>,
    pub paths: PatternList,
    pub max_body_bytes: Option<u64>,
}

fn build_tool(
    errs: &mut Errs,
    name: &str,
    t: spec::ToolSpec,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<Tool> {
    let idempotency = t.idempotency.as_ref().map(|i| Idempotency {
        required: i.mode == spec::IdempotencyMode::Required,
        ttl: Duration::from_millis(i.ttl_ms.unwrap_or(86_400_000).max(1)),
        max_record_bytes: i.max_record_bytes.unwrap_or(1024 * 1024),
        retry_after_failure: i.retry_after_failure.unwrap_or(false),
    });
    let expect_json = t.expect_json.unwrap_or(false);
    let pass_redirects = t.pass_redirects.unwrap_or(false);
    let fail_open = t.fail_mode == Some(spec::FailMode::Open);
    let (isolate_after, isolate_ms) = (t.isolate_after, t.isolate_ms);
    let upstream = UpstreamSpec {
        url: t.base_url,
        auth: t.auth,
        timeouts: t.timeouts,
        breaker: t.breaker,
    };
    let provider = build_upstream(errs, "tools", TOOL_FIELDS, name, upstream, env)?;
    Some(Tool {
        name: name.to_string(),
        route: single_route(provider),
        idempotency,
        expect_json,
        pass_redirects,
        isolate_after: isolate_after.unwrap_or(3).max(1),
        isolate_for: Duration::from_millis(isolate_ms.unwrap_or(30_000).max(1)),
        fail_open,
    })
}

/// Builds every tool under `tools:`; a tool with an error is left out (the
/// error is collected).
pub(super) fn build_tools(
    errs: &mut Errs,
    specs: BTreeMap<String, spec::ToolSpec>,
    env: &dyn Fn(&str) -> Option<String>,
) -> HashMap<String, Arc<Tool>> {
    let mut tools: HashMap<String, Arc<Tool>> = HashMap::new();
    for (name, t) in specs {
        if let Some(tool) = build_tool(errs, &name, t, env) {
            tools.insert(name, Arc::new(tool));
        }
    }
    tools
}

/// `agents.<name>.tool_access`: the agent's grant on each tool.
pub(super) fn build_tool_grants(
    errs: &mut Errs,
    at: &str,
    specs: &BTreeMap<String, spec::ToolAccessSpec>,
    tool_names: &HashSet<String>,
) -> HashMap<String, ToolGrant> {
    let mut grants = HashMap::new();
    for (tool, g) in specs {
        let gat = format!("{at}.tool_access.{tool}");
        if !tool_names.contains(tool) {
            errs.push(gat.clone(), format!("no tool `{tool}` under `tools:`"));
        }
        let mut methods = Vec::new();
        for (j, m) in g.methods.iter().enumerate() {
            match http::Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
                Ok(m) => methods.push(m),
                Err(_) => errs.push(
                    format!("{gat}.methods[{j}]"),
                    format!("`{m}` is not an HTTP method"),
                ),
            }
        }
        if methods.is_empty() {
            errs.push(format!("{gat}.methods"), "at least one method is required");
        }
        if g.paths.is_empty() {
            errs.push(
                format!("{gat}.paths"),
                "at least one path is required (\"/*\" for all)",
            );
        }
        if g.paths.iter().any(|p| !p.starts_with('/')) {
            errs.push(format!("{gat}.paths"), "paths start with /");
        }
        let paths = patterns(errs, &format!("{gat}.paths"), &g.paths);
        if let Some(limit) = g.max_body_bytes {
            check_body_limit(errs, &format!("{gat}.max_body_bytes"), limit);
        }
        grants.insert(
            tool.clone(),
            ToolGrant {
                methods,
                paths,
                max_body_bytes: g.max_body_bytes,
            },
        );
    }
    grants
}
