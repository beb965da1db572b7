//! MCP servers (`mcp_servers:`) and what an agent may use on one
//! (`mcp_access`).

use super::tools::Tool;
use loopgate_policy::PatternList;
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
