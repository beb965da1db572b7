//! The config file as written: strict serde types, one per YAML section.
//!
//! Every struct denies unknown fields, so a typo is an error rather than a
//! silently ignored setting. These types carry no behaviour; `runtime.rs`
//! validates them into the types the proxy uses.

use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigSpec {
    /// Proxy listener: an address (`0.0.0.0:8080`), or the address with
    /// its connection limits (`{ address: ..., connections: {...} }`).
    pub listen: ListenSpec,
    /// Worker threads of the proxy service (default: number of CPUs).
    #[serde(default)]
    pub threads: Option<usize>,
    #[serde(default)]
    pub admin: Option<AdminSpec>,
    #[serde(default)]
    pub access_log: Option<AccessLogSpec>,
    pub providers: BTreeMap<String, ProviderSpec>,
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    /// What the gateway knows of the models it sends upstream, by the name
    /// sent (after a target's rename): exact, or `prefix*` (the longest
    /// prefix wins).
    #[serde(default)]
    pub models: BTreeMap<String, ModelSpec>,
    /// What a money budget does with a model that has no price: `deny`
    /// (default: a budget that cannot be computed is not a budget) or
    /// `zero` (count it as free).
    #[serde(default)]
    pub on_unknown_price: Option<UnknownPrice>,
    /// Whether a priced model's non-streamed answer carries
    /// `x-loopgate-cost-usd` (default `false`): the answer is then held
    /// whole until its usage is read, through a subrequest (see
    /// `proxy::large_body`), which costs about a third more CPU per call.
    #[serde(default)]
    pub cost_header: Option<bool>,
    /// HTTP tool upstreams, served at `/tools/{tool}/{path}`.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolSpec>,
    /// MCP servers (streamable HTTP), served at `/mcp/{server}`.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, McpServerSpec>,
    #[serde(default)]
    pub agents: BTreeMap<String, AgentSpec>,
    /// Money budgets shared by the agents that name the team
    /// (`agents.<a>.team`).
    #[serde(default)]
    pub teams: BTreeMap<String, TeamSpec>,
    #[serde(default)]
    pub policy: PolicySpec,
    /// Where shared state lives: the embedded memory store (default, one
    /// instance) or Redis (several instances share limits and breakers).
    #[serde(default)]
    pub state: Option<StateSpec>,
}

/// `listen:` as written: a bare address, or a mapping.
#[derive(Debug)]
pub struct ListenSpec {
    pub address: String,
    pub connections: Option<ConnectionsSpec>,
    /// Written as a mapping: errors name `listen.address`.
    pub mapping: bool,
}

/// The mapping form of `listen:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListenerSpec {
    address: String,
    #[serde(default)]
    connections: Option<ConnectionsSpec>,
}

impl<'de> Deserialize<'de> for ListenSpec {
    // By hand rather than `untagged`, so that a typo inside the mapping is
    // reported as itself, not as "did not match any variant".
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ListenSpec;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an IP:port address, or a mapping with `address` and `connections`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ListenSpec, E> {
                Ok(ListenSpec {
                    address: v.to_string(),
                    connections: None,
                    mapping: false,
                })
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(self, m: M) -> Result<ListenSpec, M::Error> {
                let l = ListenerSpec::deserialize(serde::de::value::MapAccessDeserializer::new(m))?;
                Ok(ListenSpec {
                    address: l.address,
                    connections: l.connections,
                    mapping: true,
                })
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// `listen.connections`: what one client address and all clients may hold.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionsSpec {
    /// Connections one address may hold while they are slow to deliver a
    /// request header (default 256). Connections that deliver their
    /// headers promptly never count, however many there are.
    #[serde(default)]
    pub slow_per_client: Option<usize>,
    /// Agent connections in all (default: half the open-file limit less
    /// `reserve_fds`, since each needs an upstream socket too).
    #[serde(default)]
    pub max: Option<usize>,
    /// A request header arrives whole within this (default 15000).
    #[serde(default)]
    pub header_timeout_ms: Option<u64>,
    /// A request body arrives whole within this of its header (default
    /// 20000), plus a second for every `body_min_bytes_per_sec` bytes it
    /// has delivered; 408 and closed otherwise.
    #[serde(default)]
    pub body_timeout_ms: Option<u64>,
    /// Each this many body bytes received extend the body's deadline by a
    /// second (default 16384): an honest large body on a slow link keeps
    /// going, a trickle does not. 0: the deadline is `body_timeout_ms`
    /// whatever the size.
    #[serde(default)]
    pub body_min_bytes_per_sec: Option<u64>,
    /// A kept-alive connection waits this long for its next request
    /// (default 60000), then is closed quietly.
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
    /// Request bodies all agents may hold in memory at once while they are
    /// read and judged, with what judging them allocates (default 512
    /// MiB): past it, 503 `gateway_overloaded`.
    #[serde(default)]
    pub body_memory_bytes: Option<u64>,
    /// Descriptors kept out of the agents' share (default 128).
    #[serde(default)]
    pub reserve_fds: Option<usize>,
    /// Addresses or CIDR ranges (a load balancer, a NAT) exempt from
    /// `slow_per_client`; the total still applies.
    #[serde(default)]
    pub trusted: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateBackend {
    Memory,
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUnavailable {
    /// 503 `state_unavailable`; nothing goes upstream.
    Deny,
    /// The embedded store, with limits divided by `replicas`.
    Local,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateSpec {
    pub backend: StateBackend,
    /// `redis://host:port/db` (a password belongs in `url_env`).
    #[serde(default)]
    pub url: Option<String>,
    /// Environment variable holding the URL instead (for one with a password).
    #[serde(default)]
    pub url_env: Option<String>,
    /// Prefix of every key (default `loopgate:`).
    #[serde(default)]
    pub key_prefix: Option<String>,
    /// Bound on each store call from the request path (default 50).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Default `deny`.
    #[serde(default)]
    pub on_unavailable: Option<OnUnavailable>,
    /// Instances sharing the limits; with `local`, each admits 1/replicas.
    #[serde(default)]
    pub replicas: Option<u64>,
    /// How long a concurrency slot outlives a dead instance (default 30000).
    #[serde(default)]
    pub slot_lease_ms: Option<u64>,
    /// How often open breakers are exchanged (default 250).
    #[serde(default)]
    pub breaker_sync_ms: Option<u64>,
    /// Tasks one agent's guard state holds with `backend: memory` (loop
    /// rings, watchdog steps and tool isolation streaks, each kind its own
    /// bound), default 100000: past it the agent's own least recent task
    /// goes. Redis keeps them by TTL instead.
    #[serde(default)]
    pub tasks_per_agent: Option<usize>,
    /// Live MCP sessions one agent may hold with `backend: memory`
    /// (default 10000): past it its `initialize` is refused.
    #[serde(default)]
    pub sessions_per_agent: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSpec {
    /// Admin listener: `/health`, `/ready`, `/metrics` and `/admin/*`.
    /// Keep it on loopback or a private network.
    pub listen: String,
    /// Environment variable holding the admin token (`Authorization:
    /// Bearer <token>`). Without it the `/admin/*` API answers 401 to all.
    #[serde(default)]
    pub token_env: Option<String>,
    /// Endpoints served without the token. Default `[health, ready, metrics]`;
    /// `[]` puts all three behind the token too.
    #[serde(default)]
    pub open: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessLogSpec {
    /// `stdout` (default), `stderr`, `off`, or a file path (appended to).
    pub path: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    Openai,
    Anthropic,
    OpenaiCompatible,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSpec {
    pub kind: ProviderKind,
    /// `http://` or `https://` origin, optionally with a path prefix.
    pub base_url: String,
    /// Environment variable holding the provider key. Required for `openai`
    /// and `anthropic`; optional for `openai_compatible`.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// `anthropic-version` sent when the agent did not send one.
    #[serde(default)]
    pub anthropic_version: Option<String>,
    #[serde(default)]
    pub timeouts: TimeoutsSpec,
    #[serde(default)]
    pub breaker: BreakerSpec,
    /// One price for every model this provider serves, instead of the
    /// catalog's (a local model: all zero).
    #[serde(default)]
    pub price: Option<PriceSpec>,
}

/// `on_unknown_price:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum UnknownPrice {
    #[default]
    Deny,
    Zero,
}

/// A model's prices in US dollars per million tokens.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceSpec {
    /// Prompt tokens not read from the cache.
    pub input: f64,
    pub output: f64,
    /// Prompt tokens read from the cache (OpenAI's cached input, Anthropic's
    /// cache read). Default: the input price.
    #[serde(default)]
    pub cache_read: Option<f64>,
    /// Prompt tokens written to the cache (Anthropic). Default: the input
    /// price.
    #[serde(default)]
    pub cache_write: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsolateBy {
    /// One breaker per provider (default).
    None,
    /// One breaker per provider and agent: one tenant's failures cannot
    /// open the circuit for another.
    Agent,
}

/// Circuit breaker thresholds for one provider; every field has a default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerSpec {
    /// Trip after this many failures in a row. Default 5.
    #[serde(default)]
    pub consecutive_failures: Option<u32>,
    /// Trip when this share of the window's requests failed. Default 0.5.
    #[serde(default)]
    pub failure_rate: Option<f64>,
    /// Trip when this share of the window's requests timed out. Default 0.5.
    #[serde(default)]
    pub timeout_rate: Option<f64>,
    /// The rates apply from this many requests in the window. Default 10.
    #[serde(default)]
    pub min_requests: Option<u32>,
    /// Default 30000.
    #[serde(default)]
    pub window_ms: Option<u64>,
    /// First open period; doubles per consecutive trip. Default 30000.
    #[serde(default)]
    pub open_ms: Option<u64>,
    /// Longest open period. Default 600000.
    #[serde(default)]
    pub max_open_ms: Option<u64>,
    /// Live requests let through at once when half-open. Default 1.
    #[serde(default)]
    pub half_open_probes: Option<u32>,
    /// Closed this long, the trip backoff starts over. Default 300000.
    #[serde(default)]
    pub healthy_after_ms: Option<u64>,
    #[serde(default)]
    pub isolate_by: Option<IsolateBy>,
    /// Test half-open with this read-only request instead of live traffic.
    #[serde(default)]
    pub probe: Option<ProbeSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeSpec {
    /// `GET` or `HEAD`. Default `GET`.
    #[serde(default)]
    pub method: Option<String>,
    /// e.g. `/v1/models`.
    pub path: String,
}

/// An HTTP tool upstream. Its credential is injected by the gateway and
/// never taken from the agent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    pub base_url: String,
    #[serde(default)]
    pub auth: Option<ToolAuthSpec>,
    #[serde(default)]
    pub timeouts: TimeoutsSpec,
    #[serde(default)]
    pub breaker: BreakerSpec,
    /// Idempotency for side-effecting calls (POST, PUT, PATCH, DELETE).
    #[serde(default)]
    pub idempotency: Option<IdempotencySpec>,
    /// A 2xx whose body is not JSON counts as a breaker failure ("200 but
    /// unusable"). Default false.
    #[serde(default)]
    pub expect_json: Option<bool>,
    /// Relay the tool's redirects (3xx with a `Location`) to the agent,
    /// which may follow them unjudged. Default false: a redirect is the
    /// tool's failure (502 `upstream_error`), as from a model provider.
    #[serde(default)]
    pub pass_redirects: Option<bool>,
    /// A task that gets the same failing answer this many times in a row is
    /// cut off from the tool for `isolate_ms`. Default 3.
    #[serde(default)]
    pub isolate_after: Option<u32>,
    /// Default 30000.
    #[serde(default)]
    pub isolate_ms: Option<u64>,
    /// When the gateway cannot decide (state store unavailable, guard state
    /// unreadable): `closed` (default) refuses with 503, `open` forwards,
    /// marked `x-loopgate-fail-open`. Never overrides a denial or an open breaker.
    #[serde(default)]
    pub fail_mode: Option<FailMode>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailMode {
    Closed,
    Open,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdempotencyMode {
    /// A side-effecting call without `Idempotency-Key` is refused.
    Required,
    /// Calls with a key get idempotency; calls without pass as they are.
    Optional,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencySpec {
    pub mode: IdempotencyMode,
    /// How long a key is remembered. Default 86400000.
    #[serde(default)]
    pub ttl_ms: Option<u64>,
    /// Largest response recorded for replay. Default 1048576.
    #[serde(default)]
    pub max_record_bytes: Option<usize>,
    /// Whether a call that failed in transport may be sent again with the
    /// same key (the tool tolerates it). Default false: 409 outcome_unknown.
    #[serde(default)]
    pub retry_after_failure: Option<bool>,
}

/// Either `bearer_env`, or `header` with `value_env`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolAuthSpec {
    #[serde(default)]
    pub bearer_env: Option<String>,
    #[serde(default)]
    pub header: Option<String>,
    #[serde(default)]
    pub value_env: Option<String>,
}

/// What an agent may do with one HTTP tool.
/// An MCP server over the streamable HTTP transport.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerSpec {
    /// The server's MCP endpoint, e.g. `http://127.0.0.1:9000/mcp`.
    pub url: String,
    #[serde(default)]
    pub auth: Option<ToolAuthSpec>,
    #[serde(default)]
    pub timeouts: TimeoutsSpec,
    #[serde(default)]
    pub breaker: BreakerSpec,
    #[serde(default)]
    pub fail_mode: Option<FailMode>,
    /// Tools that change things (exact or `prefix*`): a lower call-rate default.
    #[serde(default)]
    pub writes: Vec<String>,
    /// Argument fields left out of a call's fingerprint (ids, timestamps).
    #[serde(default)]
    pub noise_fields: Vec<String>,
    /// How long the server's own stream (`GET`, server to client) may stay
    /// silent before the gateway ends it cleanly, milliseconds: any event
    /// the server sends (a comment or ping included) starts it again. It
    /// replaces `timeouts.read_ms` for that stream, whose end is never
    /// counted by the breaker. Default 300000 (5 minutes).
    #[serde(default)]
    pub stream_idle_ms: Option<u64>,
}

/// What an agent may use on one MCP server.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpAccessSpec {
    /// Tools, exact or `prefix*`.
    pub tools: Vec<String>,
    #[serde(default)]
    pub prompts: Vec<String>,
    /// Resource URIs, exact or `prefix*`.
    #[serde(default)]
    pub resources: Vec<String>,
    /// Calls per minute to each tool (default 120).
    #[serde(default)]
    pub calls_per_minute: Option<u64>,
    /// Calls per minute to each `writes` tool (default 20).
    #[serde(default)]
    pub write_calls_per_minute: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolAccessSpec {
    /// e.g. `[GET]`.
    pub methods: Vec<String>,
    /// Paths under the tool: exact, or `prefix*`.
    pub paths: Vec<String>,
    /// Largest request body (needs a `Content-Length`).
    #[serde(default)]
    pub max_body_bytes: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutsSpec {
    /// TCP (and TLS) connect, milliseconds. Default 5000.
    #[serde(default)]
    pub connect_ms: Option<u64>,
    /// Longest wait for any single read from the provider: bounds both the
    /// time to the first response byte and a stall between streamed chunks.
    /// Default 120000.
    #[serde(default)]
    pub read_ms: Option<u64>,
    /// Whole exchange including a streamed body. Default 600000.
    #[serde(default)]
    pub total_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// Model names this route serves: exact, or `prefix*`.
    pub models: Vec<String>,
    /// In fallback order; the first attempt picks by weight and health.
    pub targets: Vec<TargetSpec>,
    #[serde(default)]
    pub retry: Option<RetrySpec>,
    /// The field this route's servers read a chat completion's output limit
    /// from, for every target (a target's own setting wins). Default: the
    /// model's setting, else by provider kind and model (see `ModelSpec`).
    #[serde(default)]
    pub max_tokens_field: Option<ChatLimitField>,
}

/// The field that carries a chat completion's output limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatLimitField {
    /// Read by every OpenAI-compatible server; refused by OpenAI's
    /// reasoning models.
    MaxTokens,
    /// Required by OpenAI's reasoning models; unknown to some
    /// OpenAI-compatible servers, which then ignore the limit.
    MaxCompletionTokens,
}

/// What the gateway knows of one model.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// The model's own output maximum, in tokens per completion. A limit
    /// the gateway inserts is capped at it, and so is an agent's own value
    /// where the gateway chose this model (a target's rename, a fallback, a
    /// watchdog degrade). Default: unknown (no cap).
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    /// The field a chat completion's output limit is sent in to this model.
    /// Default: `max_completion_tokens` on `kind: openai` providers for
    /// OpenAI's reasoning models (`o1`, `o3`, `o4`, `gpt-5` families),
    /// `max_tokens` otherwise. A route's or target's setting wins.
    #[serde(default)]
    pub max_tokens_field: Option<ChatLimitField>,
    /// The model's price, instead of the built-in catalog's
    /// (`gateway/data/prices.yaml`).
    #[serde(default)]
    pub price: Option<PriceSpec>,
    /// The model's context window in tokens (prompt and output together),
    /// instead of the catalog's.
    #[serde(default)]
    pub context_window: Option<u64>,
    /// Cap an agent's own output limit at `max_output_tokens` also when
    /// the agent named this model (it cannot produce more anyway; without
    /// this the provider's own 400 answers). Default false.
    #[serde(default)]
    pub clamp_requested: Option<bool>,
}

/// How hard a route tries before giving up. Fallback happens only before
/// any response byte went to the agent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts in all, the first included. Default: one per target.
    #[serde(default)]
    pub max_attempts: Option<u32>,
    /// No new attempt starts after this long. Default 60000.
    #[serde(default)]
    pub max_total_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    pub provider: String,
    /// Relative share of traffic among this route's targets. Default 1.
    #[serde(default)]
    pub weight: Option<u32>,
    /// Send this model name to the provider instead of the requested one.
    #[serde(default)]
    pub model: Option<String>,
    /// The field this target reads a chat completion's output limit from
    /// (overrides the route's and the model's).
    #[serde(default)]
    pub max_tokens_field: Option<ChatLimitField>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModeSpec {
    Enforce,
    DryRun,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// SHA-256 hex of the agent's gateway key (`loopgate hash-key`).
    pub key_sha256: String,
    /// Models the agent may use: exact names, or `prefix*`; `*` for all.
    pub models: Vec<String>,
    /// Endpoint paths the agent may call. Default: every served endpoint.
    #[serde(default)]
    pub paths: Option<Vec<String>>,
    /// Tool names the agent may declare in `tools` (exact or `prefix*`).
    /// Default: any.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// HTTP tools (from `tools:`) the agent may call, and how. None by default.
    #[serde(default)]
    pub tool_access: BTreeMap<String, ToolAccessSpec>,
    /// MCP servers this agent may use, and what on each.
    #[serde(default)]
    pub mcp_access: BTreeMap<String, McpAccessSpec>,
    /// Scoping headers this agent may send upstream (`openai-organization`,
    /// `openai-project`, `anthropic-beta`); stripped otherwise.
    #[serde(default)]
    pub forward_headers: Option<Vec<String>>,
    /// The team (from `teams:`) whose money budgets this agent also
    /// spends from; at most one.
    #[serde(default)]
    pub team: Option<String>,
    // The rest override the same fields of `policy:` for this agent. They
    // are spelled out twice (here and in `PolicySpec`) on purpose: serde's
    // `flatten` does not work with `deny_unknown_fields`, and strictness wins.
    #[serde(default)]
    pub mode: Option<ModeSpec>,
    #[serde(default)]
    pub dry_run: Option<Vec<String>>,
    #[serde(default)]
    pub max_body_bytes: Option<u64>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_tokens_over_limit: Option<OverLimitSpec>,
    #[serde(default)]
    pub max_messages: Option<usize>,
    #[serde(default)]
    pub required_headers: Option<Vec<String>>,
    #[serde(default)]
    pub blocked_phrases: Option<Vec<String>>,
    #[serde(default)]
    pub requests_per_minute: Option<u64>,
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    #[serde(default)]
    pub max_in_flight: Option<u64>,
    #[serde(default)]
    pub loop_guard: Option<LoopGuardSpec>,
    #[serde(default)]
    pub budgets: Option<BudgetsSpec>,
    #[serde(default)]
    pub watchdog: Option<WatchdogSpec>,
}

/// `max_tokens_over_limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverLimitSpec {
    Refuse,
    Clamp,
}

/// Global rule defaults; every field can be overridden per agent.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// `enforce` (default) or `dry_run`: every rule only reports.
    #[serde(default)]
    pub mode: Option<ModeSpec>,
    /// Rules that only report while the rest enforce, by denial code
    /// (e.g. `[blocked_phrase, rate_limited]`).
    #[serde(default)]
    pub dry_run: Option<Vec<String>>,
    /// Largest request body accepted, in bytes. Default 1 MiB.
    #[serde(default)]
    pub max_body_bytes: Option<u64>,
    /// Largest `max_tokens` (or `max_completion_tokens`, `max_output_tokens`).
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// A request asking for more than `max_tokens`: `refuse` (default,
    /// 400 `max_tokens_exceeded`) or `clamp` (sent with `max_tokens`).
    #[serde(default)]
    pub max_tokens_over_limit: Option<OverLimitSpec>,
    /// Largest number of `messages`.
    #[serde(default)]
    pub max_messages: Option<usize>,
    /// Headers every request must carry (e.g. `x-agent-task-id`).
    #[serde(default)]
    pub required_headers: Option<Vec<String>>,
    /// Phrases refused anywhere in message text, case-insensitively.
    #[serde(default)]
    pub blocked_phrases: Option<Vec<String>>,
    /// Per agent, over a sliding minute.
    #[serde(default)]
    pub requests_per_minute: Option<u64>,
    /// Per agent, over a sliding minute: the prompt estimate up front,
    /// corrected by the usage the provider reports.
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    /// Per agent: requests in flight at once, streams included.
    #[serde(default)]
    pub max_in_flight: Option<u64>,
    /// Agent guards; an agent's own section replaces the default one whole.
    #[serde(default)]
    pub loop_guard: Option<LoopGuardSpec>,
    #[serde(default)]
    pub budgets: Option<BudgetsSpec>,
    #[serde(default)]
    pub watchdog: Option<WatchdogSpec>,
}

/// Loop detection per task (`x-agent-task-id`). On by default with these
/// defaults; `enabled: false` turns it off.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopGuardSpec {
    /// Default true.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Recent fingerprints kept per task. Default 10.
    #[serde(default)]
    pub window: Option<usize>,
    /// Repeats of a cycle that make a loop. Default 3.
    #[serde(default)]
    pub repeats: Option<usize>,
    /// Messages at the end of `messages` that identify a call. Default 2;
    /// at most 1000.
    #[serde(default)]
    pub last_turns: Option<usize>,
    /// Keys ignored at any depth (ids, timestamps, retry counters).
    #[serde(default)]
    pub ignore_fields: Option<Vec<String>>,
    /// First cool-down; doubles per trip. Default 30000.
    #[serde(default)]
    pub cooldown_ms: Option<u64>,
    /// Default 600000.
    #[serde(default)]
    pub max_cooldown_ms: Option<u64>,
    /// Clean requests in a row that reset the back-off. Default 5.
    #[serde(default)]
    pub clear_after: Option<u32>,
    /// The trip that stops the task (429 `task_stopped`) instead of
    /// cooling it down: default 2, so a task that repeats its loop after
    /// the cool-down is stopped, not slowed; 0 never stops (every trip
    /// cools down, doubling up to `max_cooldown_ms`).
    #[serde(default)]
    pub stop_after_trips: Option<u32>,
    /// Directory for a JSON snapshot per trip.
    #[serde(default)]
    pub snapshot_dir: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetsSpec {
    /// Tokens one task may use in all.
    #[serde(default)]
    pub task_tokens: Option<u64>,
    /// A task's budget is remembered this long. Default 86400000.
    #[serde(default)]
    pub task_ttl_ms: Option<u64>,
    /// Tokens the agent may use in any 24 hours.
    #[serde(default)]
    pub daily_tokens: Option<u64>,
    /// Output reserved when a request sets no `max_tokens`. Default 1024.
    #[serde(default)]
    pub default_max_tokens: Option<u64>,
    /// US dollars one task may spend in all.
    #[serde(default)]
    pub task_usd: Option<f64>,
    /// US dollars the agent may spend in any 24 hours.
    #[serde(default)]
    pub daily_usd: Option<f64>,
    /// US dollars the agent may spend in any 30 days (a sliding month).
    #[serde(default)]
    pub monthly_usd: Option<f64>,
}

/// A team's money budgets (`teams.<name>`), shared by its agents.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamSpec {
    /// US dollars the team's agents may spend together in any 24 hours.
    #[serde(default)]
    pub daily_usd: Option<f64>,
    /// US dollars in any 30 days.
    #[serde(default)]
    pub monthly_usd: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThresholdsSpec {
    #[serde(default)]
    pub calls_per_minute: Option<u32>,
    #[serde(default)]
    pub steps: Option<u64>,
    #[serde(default)]
    pub latency_ms: Option<f64>,
    /// Share of the task budget, 0..1.
    #[serde(default)]
    pub budget_used: Option<f64>,
    /// Share of the model's context window a call's prompt fills, 0..1
    /// (yellow default 0.8, for models whose window the catalog knows).
    #[serde(default)]
    pub context_share: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RedActionSpec {
    Stop,
    Degrade,
}

/// Per-task watchdog: yellow warns, red degrades or stops.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchdogSpec {
    #[serde(default)]
    pub yellow: ThresholdsSpec,
    #[serde(default)]
    pub red: ThresholdsSpec,
    pub action: RedActionSpec,
    /// With `action: degrade`: the cheaper model (allowed and routed).
    #[serde(default)]
    pub degrade_to: Option<String>,
    /// Spend prediction against the task's money budget.
    #[serde(default)]
    pub predict: Option<PredictSpec>,
}

/// Spend prediction: each task's cost per step is fitted as it goes, and
/// a task predicted to overrun its money budget is warned (or acted on).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictSpec {
    /// Steps this agent's tasks are expected to take: the spend is
    /// predicted at that step. Without it, `lookahead_steps` ahead.
    #[serde(default)]
    pub expected_steps: Option<u64>,
    /// Default 5.
    #[serde(default)]
    pub lookahead_steps: Option<u64>,
    /// `warn` (default): a predicted overrun is yellow; `act`: red, the
    /// watchdog's action (degrade or stop) before the budget is spent.
    #[serde(default)]
    pub on_overrun: Option<OnOverrunSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnOverrunSpec {
    Warn,
    Act,
}
