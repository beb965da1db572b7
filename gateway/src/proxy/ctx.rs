//! The typed per-request context, and the admission record that travels
//! with an admitted request (into a subrequest, when the body is large).
//!
//! What is particular to one kind of call lives in its [`Plan`] variant;
//! what one exchange feature keeps lives in that feature's module (see
//! `features`), reached through [`RequestCtx::features`].

use super::attempt::{Attempt, Fallback};
use super::call::Call;
use super::features::Features;
use super::respond::RpcReply;
use crate::config::runtime::Route;
use loopgate_policy::{DenyCode, Lease, Usage};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything the later hooks need to know about an admitted request.
/// Immutable once built; shared with a subrequest as an `Arc`.
#[derive(Debug)]
pub struct Admission {
    pub request_id: String,
    pub agent: Arc<str>,
    /// The config's name for the route, tool or MCP server (a bounded
    /// metrics label).
    pub route_name: Arc<str>,
    pub route: Arc<Route>,
    /// A dry-run rule would have denied this request with this code.
    pub would_deny: Option<DenyCode>,
    /// `agent/task` when the request named a task.
    pub task_key: Option<String>,
    /// The agent's watchdog keeps task state this long: each finished
    /// call of a watched task feeds its latency EMA.
    pub watch_ttl: Option<Duration>,
    /// Each settled step's cost feeds the task's spend fit, kept this
    /// long (the watchdog predicts the task's spend).
    pub spend_fit: Option<Duration>,
    /// `x-loopgate-guard`: `warn` (watchdog yellow) or `degraded`.
    pub guard: Option<&'static str>,
    /// `x-loopgate-predicted-usd`: the task's predicted spend.
    pub predicted_usd: Option<f64>,
    /// Forwarded under `fail_mode: open` although the gateway could not
    /// decide: the deny code it would otherwise have answered with.
    pub fail_open: Option<DenyCode>,
    /// Scoping headers this agent may send upstream (config).
    pub forward_headers: Vec<http::HeaderName>,
    /// The body was read and judged here (model calls and MCP POSTs
    /// always; tool calls only under idempotency, which hashes it).
    pub body_read: bool,
    /// Admission changed the body (a degraded model): every attempt sends
    /// the judged bytes, not Pingora's replay.
    pub body_rewritten: bool,
    /// What is particular to the kind of call.
    pub plan: Plan,
}

/// The admitted call, by kind.
#[derive(Debug)]
pub enum Plan {
    Model(ModelPlan),
    Tool(ToolPlan),
    Mcp(McpPlan),
}

#[derive(Debug)]
pub struct ModelPlan {
    pub endpoint: loopgate_policy::Endpoint,
    pub model: String,
    pub stream: bool,
    /// The model the agent asked for, when the watchdog degraded it.
    pub degraded_from: Option<String>,
    /// Output tokens a stream may produce before its token budget is spent.
    pub budget_room: Option<u64>,
    /// Output tokens a stream may produce before its money budgets are
    /// spent (at the output price reserved at).
    pub money_room: Option<u64>,
    /// The prompt's estimated tokens (what a cut stream is settled with:
    /// its usage never came).
    pub estimated_prompt: u64,
    /// Output tokens the budgets reserved (all completions; none for
    /// embeddings): what an answer whose usage cannot be read settles at,
    /// unless the gateway relayed more.
    pub reserved_output: u64,
    /// The call holds token or money reservations that its usage settles:
    /// only then is the output the gateway relayed counted (an answer
    /// whose usage cannot be read settles on it), a scan of every event's
    /// text that a call no budget or token limit watches need not pay.
    pub settles: bool,
    /// The body's output limit, written per attempt for its target.
    pub output: loopgate_policy::OutputLimit,
    /// An OpenAI agent's `stream_options.include_usage`, for a stream
    /// translated from Anthropic (`false` where nothing is translated).
    pub usage_chunk: bool,
    /// A priced OpenAI-family stream whose agent did not ask for its
    /// usage: each attempt of the agent's family asks for it, and the
    /// usage chunk is dropped from what the agent receives.
    pub ask_usage: bool,
    /// On a route of both API families, a body the other family cannot
    /// read faithfully (why): only targets of the agent's family serve it.
    pub native_only: Option<Arc<str>>,
    /// On a route of both families: the bodies of the targets of the
    /// other family, translated once at admission (empty elsewhere).
    pub translated: super::model::Translated,
}

#[derive(Debug)]
pub struct ToolPlan {
    /// The path (and query) to send under the tool's base URL.
    pub target: String,
    /// The claimed idempotency record key, and the largest answer recorded.
    pub idem: Option<(String, usize)>,
    /// 2xx answers must be JSON to count as a success.
    pub expect_json: bool,
    /// The tool's redirects are relayed (`pass_redirects`).
    pub pass_redirects: bool,
    /// In a task: the failure-streak key, threshold and cool-down.
    pub isolation: Option<(String, u32, Duration)>,
}

#[derive(Debug)]
pub struct McpPlan {
    /// The path (and query) to send under the server's URL.
    pub target: String,
    pub call: super::mcp::McpCall,
}

impl Admission {
    /// A 3xx answer is relayed to the agent: only a tool configured with
    /// `pass_redirects`; for every other upstream it is a failure.
    pub fn passes_redirects(&self) -> bool {
        matches!(&self.plan, Plan::Tool(t) if t.pass_redirects)
    }

    /// The upstream path of a tool or MCP call (model calls keep theirs).
    pub fn target(&self) -> Option<&str> {
        match &self.plan {
            Plan::Model(_) => None,
            Plan::Tool(t) => Some(&t.target),
            Plan::Mcp(m) => Some(&m.target),
        }
    }

    /// What `usage` cost, in micro-dollars, at the price of the target
    /// `served` (the provider that answered): what the money budgets
    /// settle and the spend prediction fits. `None` without a price.
    pub fn cost_micros(&self, served: &str, usage: &Usage) -> Option<u64> {
        let m = self.model()?;
        let price = self.route.price_of(served, &m.model)?;
        Some(price.cost_micros(usage))
    }

    pub fn model(&self) -> Option<&ModelPlan> {
        match &self.plan {
            Plan::Model(m) => Some(m),
            _ => None,
        }
    }
}

/// Which side of a large-body forward this context is.
#[derive(Debug, Default)]
pub enum Role {
    /// An ordinary request: it talks to the upstream itself.
    #[default]
    Main,
    /// A main request whose large body went through a subrequest; that
    /// subrequest's hooks did the proxying.
    Forwarded,
    /// The subrequest carrying a large body: the judged bytes (and their
    /// content type) it sends, and where it reports to its main request.
    Sub {
        body: bytes::Bytes,
        content_type: Option<http::HeaderValue>,
        report: Arc<std::sync::Mutex<Option<SubReport>>>,
    },
}

/// Per-request state, created by `new_ctx` and filled in by the hooks.
#[derive(Debug)]
pub struct RequestCtx {
    pub started: Instant,
    pub request_id: String,
    /// What the request is, decided once in `request_filter`.
    pub call: Option<Call>,
    /// MCP: the message a refusal answers, once the body was judged.
    pub rpc_reply: Option<RpcReply>,
    pub agent: Option<Arc<str>>,
    pub admitted: Option<Arc<Admission>>,
    pub role: Role,
    /// The exchange features armed for this request.
    pub features: Features,
    /// The attempt under way: its target and breaker ticket.
    pub attempt: Option<Attempt>,
    /// What was tried, and whether another attempt may follow.
    pub fallback: Fallback,
    /// When the first upstream request went out and the last response byte came.
    pub upstream_first_at: Option<Instant>,
    pub upstream_done_at: Option<Instant>,
    pub upstream_started: Option<Instant>,
    pub upstream_status: Option<u16>,
    /// Time to the response header of the attempt that served.
    pub ttfb: Option<Duration>,
    /// Breaker key of the last attempt.
    pub breaker_key: Option<Arc<str>>,
    /// The provider that served the response.
    pub served_by: Option<Arc<str>>,
    /// The provider the request was last sent to, answered or not: what
    /// the access log names when no answer came (the agent left first).
    pub sent_to: Option<Arc<str>>,
    /// The API family of the provider that answered (for SSE error events).
    pub served_kind: Option<crate::config::ProviderKind>,
    /// Request body bytes (as judged).
    pub bytes_in: usize,
    /// An event stream is being relayed (counted in `loopgate_active_streams`).
    pub streaming: bool,
    /// The body as judged, kept for model calls (a target may rename the
    /// model or need the output limit in another field or lower).
    pub original_body: Option<bytes::Bytes>,
    /// Every attempt sends `original_body` (admission rewrote it).
    pub send_original: bool,
    /// The body this attempt sends when it differs from what Pingora
    /// replays (renamed model, output limit, or the large-body subrequest).
    pub attempt_body: Option<bytes::Bytes>,
    /// A refused body is still arriving: read it off before closing.
    pub intake: super::buffers::BodyIntake,
    /// The error code Loopgate answered with, if any.
    pub error_code: Option<&'static str>,
    /// What this request holds on its agent's limits; returned in `logging`.
    pub lease: Option<Lease>,
    /// Limit windows whose reservation the reported usage replaces.
    pub settle_keys: Vec<Arc<str>>,
    /// Money windows whose reservation the reported usage's cost replaces.
    pub money_keys: Vec<Arc<str>>,
    /// Usage a large-body subrequest reported (its meter read it).
    pub reported_usage: Option<Usage>,
    /// Output tokens a large-body subrequest's meter counted as relayed.
    pub reported_relayed: u64,
    /// A large-body subrequest reported what it did (without a report,
    /// whether anything went upstream is unknown).
    pub sub_reported: bool,
    /// Answered from an idempotency record, not forwarded.
    pub replayed: bool,
    /// MCP: what the access log and metrics record (also for refusals).
    pub mcp_audit: Option<super::mcp::McpAudit>,
}

impl RequestCtx {
    pub fn new() -> Self {
        RequestCtx {
            started: Instant::now(),
            request_id: String::new(),
            call: None,
            rpc_reply: None,
            agent: None,
            admitted: None,
            role: Role::Main,
            features: Features::default(),
            attempt: None,
            fallback: Fallback::default(),
            upstream_first_at: None,
            upstream_done_at: None,
            upstream_started: None,
            upstream_status: None,
            ttfb: None,
            breaker_key: None,
            served_by: None,
            sent_to: None,
            served_kind: None,
            bytes_in: 0,
            streaming: false,
            original_body: None,
            send_original: false,
            attempt_body: None,
            intake: Default::default(),
            error_code: None,
            lease: None,
            settle_keys: Vec::new(),
            money_keys: Vec::new(),
            reported_usage: None,
            reported_relayed: 0,
            sub_reported: false,
            replayed: false,
            mcp_audit: None,
        }
    }

    /// The provider's reported usage: read by this request's meter, or
    /// reported by its large-body subrequest.
    pub fn usage(&self) -> Option<Usage> {
        self.features
            .usage
            .as_ref()
            .and_then(|m| m.usage())
            .or(self.reported_usage)
    }

    /// Output tokens the gateway counted in the answer it relayed (its
    /// own estimate, for an answer whose usage it could not read).
    pub fn relayed_output(&self) -> u64 {
        self.features
            .usage
            .as_ref()
            .map_or(self.reported_relayed, |m| m.relayed_output())
    }

    /// No attempt's request ever went upstream (every connection failed,
    /// every breaker was open, or the call ended before its first
    /// attempt): nothing can have been spent. Unknown (a large body's
    /// subrequest that did not report) counts as sent.
    pub fn never_sent(&self) -> bool {
        self.upstream_first_at.is_none()
            && match self.role {
                Role::Main => true,
                Role::Forwarded => self.sub_reported,
                Role::Sub { .. } => false,
            }
    }

    /// What the answer cost, from the reported usage at the price of the
    /// model the provider that answered was sent: the catalog's name for
    /// the model (a bounded label) and dollars.
    pub fn cost(&self) -> Option<(&str, f64)> {
        let (usage, adm, served) = (
            self.usage()?,
            self.admitted.as_deref()?,
            self.served_by.as_deref()?,
        );
        let m = adm.model()?;
        adm.route
            .cost(served, &m.model, adm.route_name.as_ref(), &usage)
    }

    /// What the answer cost exactly, in pico-dollars, at the price of the
    /// provider that answered: what `x-loopgate-cost-usd` says.
    pub fn cost_picos(&self) -> Option<u128> {
        let (usage, adm, served) = (
            self.usage()?,
            self.admitted.as_deref()?,
            self.served_by.as_deref()?,
        );
        let m = adm.model()?;
        Some(adm.route.price_of(served, &m.model)?.cost_picos(&usage))
    }

    /// This context talked to the upstream itself (not its subrequest).
    pub fn talks_upstream(&self) -> bool {
        !matches!(self.role, Role::Forwarded)
    }
}

/// What a large-body subrequest learned about the upstream exchange, for
/// its main request's access log, metrics and limit settlement.
#[derive(Debug, Default, Clone)]
pub struct SubReport {
    pub served_by: Option<Arc<str>>,
    pub sent_to: Option<Arc<str>>,
    pub fallback_from: Option<Arc<str>>,
    pub upstream_status: Option<u16>,
    pub ttfb: Option<Duration>,
    pub upstream_time: Option<Duration>,
    pub attempts: u32,
    pub usage: Option<Usage>,
    /// Output tokens its meter counted as relayed.
    pub relayed: u64,
    pub breaker_key: Option<Arc<str>>,
    pub error_code: Option<&'static str>,
}

impl Default for RequestCtx {
    fn default() -> Self {
        Self::new()
    }
}
