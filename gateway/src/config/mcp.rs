//! MCP servers (`mcp_servers:`) and what an agent may use on one
//! (`mcp_access`).

use super::providers::MCP_FIELDS;
use super::runtime::{patterns, Errs};
use super::spec;
use super::tools::{build_tool, Tool};
use loopgate_policy::PatternList;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// An MCP server: an upstream like a tool (credential, timeouts, breaker,
/// fail mode), plus what the MCP rules need.
#[derive(Debug)]
pub struct McpServer {
    pub tool: Arc<Tool>,
    /// The endpoint's path on the server (and query), e.g. `/mcp`.
    pub path: String,
    pub writes: PatternList,
    pub noise_fields: Vec<String>,
}

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
            None => "/".to_string(), // build_tool reports the bad URL
        };
        let base_url = m
            .url
            .strip_suffix(path.as_str())
            .unwrap_or(&m.url)
            .to_string();
        let writes = patterns(errs, &format!("{at}.writes"), &m.writes);
        let as_tool = spec::ToolSpec {
            base_url,
            auth: m.auth,
            timeouts: m.timeouts,
            breaker: m.breaker,
            idempotency: None,
            // A 2xx that is not JSON (nor an SSE stream) is not JSON-RPC:
            // it counts against the server's breaker.
            expect_json: Some(true),
            isolate_after: None,
            isolate_ms: None,
            fail_mode: m.fail_mode,
        };
        if let Some(tool) = build_tool(errs, "mcp_servers", MCP_FIELDS, &name, as_tool, env) {
            mcp_servers.insert(
                name,
                Arc::new(McpServer {
                    tool: Arc::new(tool),
                    path,
                    writes,
                    noise_fields: m.noise_fields,
                }),
            );
        }
    }
    mcp_servers
}
