//! The typed per-request context and the admission record that travels with
//! an admitted request (into a subrequest, when the body is large).

use super::routing::Picked;
use crate::config::runtime::Route;
use crate::error::GatewayError;
use loopgate_policy::{DenyCode, Lease, Usage, UsageScanner};
use std::sync::Arc;
use std::time::Instant;

/// Everything the later hooks need to know about an admitted request.
/// Immutable once built; shared with a subrequest as an `Arc`.
#[derive(Debug)]
pub struct Admission {
    pub request_id: String,
    pub agent: Arc<str>,
    pub model: String,
    /// The config's name for the route (a bounded metrics label).
    pub route_name: Arc<str>,
    pub route: Arc<Route>,
    pub stream: bool,
    /// A dry-run rule would have denied this request with this code.
    pub would_deny: Option<DenyCode>,
    /// `agent/task` when the request named a task.
    pub task_key: Option<String>,
    /// `x-loopgate-guard`: `warn` (watchdog yellow) or `degraded`.
    pub guard: Option<&'static str>,
    /// The model the agent asked for, when the watchdog degraded it.
    pub degraded_from: Option<String>,
    /// Output tokens a stream may produce before its budget is spent.
    pub budget_room: Option<u64>,
    /// HTTP tool call: the path (and query) to send under the tool's base URL.
    pub tool_path: Option<String>,
    /// The body was read and judged here (always for model calls; for tool
    /// calls only under idempotency, which hashes it).
    pub body_read: bool,
    /// The claimed idempotency record key, and the largest response recorded.
    pub idem: Option<(String, usize)>,
    /// Tool call whose 2xx answers must be JSON to count as a success.
    pub expect_json: bool,
    /// Tool call in a task: its failure-streak key, threshold and cool-down.
    pub isolation: Option<(String, u32, std::time::Duration)>,
    /// Forwarded under `fail_mode: open` although the gateway could not
    /// decide: the deny code it would otherwise have answered with.
    pub fail_open: Option<DenyCode>,
    /// An MCP request: server, method, tool, list filters.
    pub mcp: Option<Arc<super::mcp::McpCall>>,
    /// Admission changed the body (an output limit set): every attempt
    /// sends the judged bytes, not Pingora's replay of the agent's.
    pub body_rewritten: bool,
    /// Scoping headers this agent may send upstream (config).
    pub forward_headers: Vec<http::HeaderName>,
}

/// Per-request state, created by `new_ctx` and filled in by the hooks.
#[derive(Debug)]
pub struct RequestCtx {
    pub started: Instant,
    pub request_id: String,
    pub agent: Option<Arc<str>>,
    pub admitted: Option<Arc<Admission>>,
    /// This context belongs to the subrequest that carries a large body.
    pub is_subrequest: bool,
    /// A large body was forwarded through a subrequest; its hooks did the proxying.
    pub forwarded_by_subrequest: bool,
    /// When the first upstream request went out and the last response byte came.
    pub upstream_first_at: Option<Instant>,
    pub upstream_done_at: Option<Instant>,
    /// Time to the response header of the attempt that served.
    pub ttfb: Option<std::time::Duration>,
    /// Breaker key of the last attempt.
    pub breaker_key: Option<Arc<str>>,
    /// Request body bytes (as judged).
    pub bytes_in: usize,
    /// An event stream is being relayed (counted in `loopgate_active_streams`).
    pub streaming: bool,
    /// Large-body subrequest: where it reports the exchange to its main request.
    pub report: Option<Arc<std::sync::Mutex<Option<SubReport>>>>,
    /// The attempt under way: its target and breaker ticket, until its
    /// outcome is reported.
    pub attempt: Option<Attempt>,
    /// Targets of the route already tried (or skipped) by this request.
    pub tried: Vec<usize>,
    pub attempts: u32,
    pub first_attempt_at: Option<Instant>,
    /// The provider that served the response, and the one it fell back from.
    pub served_by: Option<Arc<str>>,
    pub fallback_from: Option<Arc<str>>,
    /// The last failure, answered if no attempt is left.
    pub last_failure: Option<GatewayError>,
    /// A stale pooled connection: try the same target again, uncounted.
    pub retry_same: Option<usize>,
    pub stale_retries: u8,
    /// The API family of the provider that answered (for SSE error events).
    pub served_kind: Option<crate::config::ProviderKind>,
    /// The body as judged, kept when a target renames the model.
    pub original_body: Option<bytes::Bytes>,
    /// The body this attempt sends when it differs from what Pingora
    /// replays (renamed model, or the large-body subrequest).
    pub attempt_body: Option<bytes::Bytes>,
    /// Large-body subrequest: the judged body (and its content type) to send.
    pub injected_body: Option<(bytes::Bytes, Option<http::HeaderValue>)>,
    /// Set by a hook that failed for a reason it knows better than the
    /// transport error that follows (e.g. an unresolved provider).
    pub pending_error: Option<GatewayError>,
    /// A refused body is still arriving: read it off before closing.
    pub intake: super::buffers::BodyIntake,
    /// The error code Loopgate answered with, if any.
    pub error_code: Option<&'static str>,
    pub upstream_status: Option<u16>,
    pub upstream_started: Option<Instant>,
    /// What this request holds on its agent's limits; returned in `logging`.
    pub lease: Option<Lease>,
    /// Reads the provider's reported usage from the response as it passes.
    pub usage_scanner: Option<UsageScanner>,
    pub usage: Option<Usage>,
    /// A 2xx tool answer being kept to check that it is JSON (`None` once
    /// it outgrew the bound: then it is not judged).
    pub json_check: Option<Vec<u8>>,
    /// Answered from an idempotency record, not forwarded.
    pub replayed: bool,
    /// The response being recorded for idempotent replay.
    pub idem_capture: Option<IdemCapture>,
    /// Limit windows whose reservation the reported usage replaces.
    pub settle_keys: Vec<Arc<str>>,
    /// Every attempt sends `original_body` (the watchdog rewrote it).
    pub send_original: bool,
    /// MCP: what the access log and metrics record (also for refusals).
    pub mcp_audit: Option<super::mcp::McpAudit>,
    /// MCP: list results being filtered to the agent's grant.
    pub mcp_rewriter: Option<super::mcp::ListRewriter>,
}

impl RequestCtx {
    pub fn new() -> Self {
        RequestCtx {
            started: Instant::now(),
            request_id: String::new(),
            agent: None,
            admitted: None,
            is_subrequest: false,
            forwarded_by_subrequest: false,
            upstream_first_at: None,
            upstream_done_at: None,
            ttfb: None,
            breaker_key: None,
            bytes_in: 0,
            streaming: false,
            report: None,
            attempt: None,
            tried: Vec::new(),
            attempts: 0,
            first_attempt_at: None,
            served_by: None,
            fallback_from: None,
            last_failure: None,
            retry_same: None,
            stale_retries: 0,
            served_kind: None,
            original_body: None,
            attempt_body: None,
            injected_body: None,
            pending_error: None,
            intake: Default::default(),
            error_code: None,
            upstream_status: None,
            upstream_started: None,
            lease: None,
            usage_scanner: None,
            usage: None,
            json_check: None,
            replayed: false,
            idem_capture: None,
            settle_keys: Vec::new(),
            send_original: false,
            mcp_audit: None,
            mcp_rewriter: None,
        }
    }
}

/// What a large-body subrequest learned about the upstream exchange, for
/// its main request's access log, metrics and limit settlement.
#[derive(Debug, Default, Clone)]
pub struct SubReport {
    pub served_by: Option<Arc<str>>,
    pub fallback_from: Option<Arc<str>>,
    pub upstream_status: Option<u16>,
    pub ttfb: Option<std::time::Duration>,
    pub upstream_time: Option<std::time::Duration>,
    pub attempts: u32,
    pub usage: Option<Usage>,
    pub breaker_key: Option<Arc<str>>,
    pub error_code: Option<&'static str>,
}

/// A tool response on its way to the agent, kept for idempotent replay.
#[derive(Debug, Default)]
pub struct IdemCapture {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
    /// Larger than `max_record_bytes`: it cannot be replayed.
    pub truncated: bool,
    pub complete: bool,
}

/// One attempt at an upstream.
#[derive(Debug)]
pub struct Attempt {
    pub picked: Picked,
    pub started: Instant,
    /// Time to the response header, once it arrived.
    pub ttfb: Option<std::time::Duration>,
}

impl Default for RequestCtx {
    fn default() -> Self {
        Self::new()
    }
}
