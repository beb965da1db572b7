//! MCP servers (`mcp_servers:`) and what an agent may use on one
//! (`mcp_access`).

use super::providers::{build_upstream, single_route, UpstreamSpec, MCP_FIELDS};
use super::routes::Route;
use super::runtime::{at_least_one, patterns, Errs};
use super::spec;
use loopgate_policy::PatternList;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// An MCP server: an upstream connection (credential, timeouts, breaker)
/// behind a one-target route, its fail mode, and what the MCP rules need.
/// Every answer is checked as JSON-RPC (see `proxy::features::json_check`).
#[derive(Debug)]
pub struct McpServer {
    pub name: String,
    /// One attempt at the server's one connection (the gateway never
    /// retries an MCP call on its own).
    pub route: Arc<Route>,
    /// `fail_mode: open`: forward when the gateway cannot decide.
    pub fail_open: bool,
    /// The endpoint's path on the server (and query), e.g. `/mcp`.
    pub path: String,
    pub writes: PatternList,
    pub noise_fields: Vec<String>,
    /// `stream_idle_ms`: how long the server's own stream (GET) may be
    /// silent; see `proxy::features::mcp_stream`.
    pub stream_idle: Duration,
}

/// `stream_idle_ms` when the config does not say: an idle stream is the
/// normal state of one that waits for the server to have something to say.
pub const STREAM_IDLE_DEFAULT_MS: u64 = 300_000;

/// What one agent may use on one MCP server.
#[derive(Debug)]
pub struct McpAccess {
    pub grant: loopgate_policy::mcp::McpGrant,
    pub calls_per_minute: u64,
    pub write_calls_per_minute: u64,
}

/// Builds every server under `mcp_servers:`; a server with an error is left
/// out (the error is collected). `tool_names` are the names under `tools:`,
/// which a server may not reuse.
pub(super) fn build_mcp_servers(
    errs: &mut Errs,
    specs: BTreeMap<String, spec::McpServerSpec>,
    tool_names: &HashSet<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> HashMap<String, Arc<McpServer>> {
    let mut mcp_servers: HashMap<String, Arc<McpServer>> = HashMap::new();
    for (name, m) in specs {
        let at = format!("mcp_servers.{name}");
        if tool_names.contains(&name) {
            // They would share a breaker key and a metrics label.
            errs.push(
                at.clone(),
                format!("`{name}` is also a tool name; pick another"),
            );
        }
        let path = match m.url.split_once("://").map(|(_, rest)| rest) {
            Some(rest) => match rest.find('/') {
                Some(i) => rest[i..].to_string(),
                None => "/".to_string(),
            },
            None => "/".to_string(), // build_upstream reports the bad URL
        };
        let base_url = m
            .url
            .strip_suffix(path.as_str())
            .unwrap_or(&m.url)
            .to_string();
        let writes = patterns(errs, &format!("{at}.writes"), &m.writes);
        let idle_ms = m.stream_idle_ms.unwrap_or(STREAM_IDLE_DEFAULT_MS);
        if idle_ms == 0 || idle_ms > 24 * 3600 * 1000 {
            errs.push(
                format!("{at}.stream_idle_ms"),
                "must be between 1 and 86400000 milliseconds",
            );
        }
        let upstream = UpstreamSpec {
            url: base_url,
            auth: m.auth,
            timeouts: m.timeouts,
            breaker: m.breaker,
        };
        if let Some(provider) =
            build_upstream(errs, "mcp_servers", MCP_FIELDS, &name, upstream, env)
        {
            mcp_servers.insert(
                name.clone(),
                Arc::new(McpServer {
                    name,
                    route: single_route(provider),
                    fail_open: m.fail_mode == Some(spec::FailMode::Open),
                    path,
                    writes,
                    noise_fields: m.noise_fields,
                    stream_idle: Duration::from_millis(idle_ms),
                }),
            );
        }
    }
    mcp_servers
}

/// `agents.<name>.mcp_access`: the agent's grant on each MCP server.
pub(super) fn build_mcp_grants(
    errs: &mut Errs,
    at: &str,
    specs: &BTreeMap<String, spec::McpAccessSpec>,
    servers: &HashSet<String>,
) -> HashMap<String, Arc<McpAccess>> {
    let mut grants = HashMap::new();
    for (server, g) in specs {
        let gat = format!("{at}.mcp_access.{server}");
        // Judged by the file's names: a server that failed to build has
        // its own error, and a grant on it is not a second one.
        if !servers.contains(server) {
            errs.push(
                gat.clone(),
                format!("no server `{server}` under `mcp_servers:`"),
            );
        }
        let field = |f: &str| format!("{gat}.{f}");
        let access = McpAccess {
            grant: loopgate_policy::mcp::McpGrant {
                tools: patterns(errs, &field("tools"), &g.tools),
                prompts: patterns(errs, &field("prompts"), &g.prompts),
                resources: patterns(errs, &field("resources"), &g.resources),
            },
            calls_per_minute: at_least_one(
                errs,
                &field("calls_per_minute"),
                g.calls_per_minute,
                120,
            ),
            write_calls_per_minute: at_least_one(
                errs,
                &field("write_calls_per_minute"),
                g.write_calls_per_minute,
                20,
            ),
        };
        grants.insert(server.clone(), Arc::new(access));
    }
    grants
}
