//! The rules of MCP calls: `/mcp/{server}` on the proxy port (streamable
//! HTTP transport: JSON-RPC over POST, the server's SSE stream on GET, end
//! of session on DELETE).
//!
//! The agent's key decides which servers, tools, prompts and resources it
//! may use ([`loopgate_policy::mcp`] holds the one rule function for listing
//! and calling; the body is parsed once, there). Every refusal is answered
//! in JSON-RPC (same id once the body is judged; `error.data.loopgate_code`),
//! never forwarded. Sessions are bound to the agent that opened them, in
//! the state store, so replicas agree (`features::mcp_session`); list
//! results are filtered to the grant (`features::mcp_lists`). Each
//! `tools/call` feeds the task's loop guard and watchdog, and a per-tool
//! call-rate window taken with the agent's limits in one store call.

use super::admit::{
    aside, declared_length, read_body, Caller, FailMode, Judged, Judgement, JUDGE_ASIDE_BYTES,
};
use super::call::MCP_METHODS;
use super::ctx::{McpPlan, Plan, RequestCtx};
use super::env::Env;
use super::features::mcp_session;
use super::respond::RpcReply;
use crate::config::runtime::{McpAccess, McpServer};
use crate::error::GatewayError;
use bytes::Bytes;
use loopgate_breaker::{Fingerprint, LoopConfig};
use loopgate_policy::mcp::{self, ListFilter};
use loopgate_policy::{Deny, DenyCode, Verdict, WindowTake};
use pingora_proxy::Session;
use serde_json::Value;
use sha2::Digest;
use std::sync::Arc;
use std::time::Duration;

/// How long a session stays bound to its agent after the last `initialize`.
pub const SESSION_TTL: Duration = Duration::from_secs(24 * 3600);
const SESSION_HEADER: &str = "mcp-session-id";

/// What the rest of the exchange needs to know about an MCP request.
#[derive(Debug)]
pub struct McpCall {
    pub server: String,
    pub tool: Option<String>,
    /// List requests whose results are filtered to the grant.
    pub lists: Vec<ListFilter>,
    pub access: Arc<McpAccess>,
    /// `initialize`: bind the session id the server answers with.
    pub binds_session: bool,
    /// A GET: the server's own stream, silent up to this long
    /// (`features::mcp_stream`).
    pub stream_idle: Option<Duration>,
}

/// One MCP request as the access log and metrics see it: never the
/// arguments, only their digest.
#[derive(Debug, Clone, Default)]
pub struct McpAudit {
    pub server: String,
    pub method: String,
    pub tool: Option<String>,
    pub args_sha256: Option<String>,
    /// Metric labels, from the config only: the server's name once it is
    /// known (else `unknown`), and the grant entry that admitted the tool
    /// (`search_*`, not the `search_x7f` an agent sent; else `other`).
    pub server_label: Option<Arc<str>>,
    pub tool_label: Option<String>,
}

/// The one `Mcp-Session-Id` a request carries, if any. Two of them, or one
/// that is not 1-256 visible ASCII characters (the MCP spec's alphabet), is
/// refused: the gateway would check one and the server might use another,
/// and a value the gateway cannot read must not skip the ownership check.
pub fn session_id_of(headers: &http::HeaderMap) -> Result<Option<String>, &'static str> {
    let mut all = headers.get_all(SESSION_HEADER).iter();
    let Some(v) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err("more than one Mcp-Session-Id");
    }
    let b = v.as_bytes();
    if b.is_empty() || b.len() > 256 || !b.iter().all(|c| (0x21..=0x7e).contains(c)) {
        return Err("Mcp-Session-Id must be 1-256 visible ASCII characters");
    }
    Ok(std::str::from_utf8(b).ok().map(str::to_string))
}

/// The store key binding a session to its agent: under the agent's own
/// name, so the store bounds each agent's sessions on their own (one
/// agent's sessions never take another's room) and another agent looking
/// a session up finds nothing (404, and no sign that it exists).
pub fn session_key(agent: &str, server: &str, id: &str) -> String {
    format!("{}{agent}/{server}:{id}", loopgate_policy::SESSION_PREFIX)
}

/// Judges an MCP request: the server and the agent's grant on it, the
/// session's owner, the body (every JSON-RPC message, parsed once), and
/// the call-rate windows of each `tools/call`. From the moment the body
/// is judged, a refusal (here or in a later step) answers its message
/// in-band ([`RpcReply`]).
pub async fn judge(
    session: &mut Session,
    ctx: &mut RequestCtx,
    env: &Env<'_>,
    caller: &Caller<'_>,
    name: &str,
    verdict: &mut Verdict,
) -> Result<Judgement, GatewayError> {
    let rules = caller.rules();
    let method = session.req_header().method.clone();
    let audit = ctx.mcp_audit.insert(McpAudit {
        server: loopgate_policy::clip(name, 64).to_string(),
        method: method.as_str().to_string(),
        ..McpAudit::default()
    });
    let (server, access) = granted(caller, name, audit)?;
    let session_id = check_transport(session, &method)?;
    let target = match session.req_header().uri.query() {
        Some(q) => format!("{}?{q}", server.path),
        None => server.path.clone(),
    };
    let mut fail = FailMode::new(server.fail_open);
    if let Some(sid) = &session_id {
        mcp_session::check_owner(env, &rules.name, name, sid, &mut fail).await?;
    }
    let (body, judgement) = match method {
        http::Method::POST => {
            let body = read_body(session, rules.max_body_bytes, &mut ctx.intake).await?;
            // Judging builds the body's `serde_json::Value` tree, whose
            // cost per byte the body's shape decides: the bound of it is
            // charged like the body until the tree is gone.
            let work = ctx
                .intake
                .judging(loopgate_policy::json::parse_cost(&body))?;
            let judged = judge_body(ctx, caller, server, &access, &body, verdict).await;
            ctx.intake.shrink(work);
            (body, Some(judged?))
        }
        // GET and DELETE (`check_transport` let no other method through)
        // act on a session.
        _ if session_id.is_none() => {
            return Err(
                Deny::new(DenyCode::InvalidRequest, "this needs an Mcp-Session-Id")
                    .never_retryable()
                    .into(),
            )
        }
        _ => (Bytes::new(), None),
    };
    let mut call = McpCall {
        server: name.to_string(),
        tool: None,
        lists: Vec::new(),
        access: access.clone(),
        binds_session: false,
        stream_idle: (method == http::Method::GET).then_some(server.stream_idle),
    };
    let (mut extra, mut loop_call) = (Vec::new(), None);
    if let Some(read) = judgement {
        extra = call_windows(name, server, &access, rules.name.as_ref(), &read.judgement);
        loop_call = read_call(ctx, &access, read, &mut call);
    }
    if rules.is_dry_run(DenyCode::ToolNotAllowed) {
        // Dry-run shows what enforcement would hide: lists pass unfiltered.
        call.lists.clear();
    }
    let watched = call.tool.is_some();
    Ok(Judgement::Forward(Box::new(Judged {
        route_name: Arc::from(name),
        route: server.route.clone(),
        body,
        body_read: method == http::Method::POST,
        body_rewritten: false,
        fail,
        estimated_prompt: 0,
        max_tokens: 0,
        default_output: None,
        money: None,
        task_budget: false,
        extra,
        loop_call,
        // The task's loop guard and watchdog see tool calls.
        watched,
        context_share: None,
        isolation: None,
        idem_claim: None,
        plan: Plan::Mcp(McpPlan { target, call }),
    })))
}

/// The server and the agent's grant on it. No grant is a refusal the
/// agent cannot mistake for an empty server.
fn granted<'c>(
    caller: &Caller<'c>,
    name: &str,
    audit: &mut McpAudit,
) -> Result<(&'c McpServer, Arc<McpAccess>), GatewayError> {
    let cfg = caller.cfg;
    let Some(server) = cfg.mcp_servers.get(name) else {
        return Err(Deny::new(
            DenyCode::NotFound,
            format!("no such MCP server: `{}`", loopgate_policy::clip(name, 100)),
        )
        .never_retryable()
        .into());
    };
    audit.server_label = Some(Arc::from(server.name.as_str()));
    let Some(access) = cfg.mcp_access[caller.agent_idx].get(name).cloned() else {
        return Err(Deny::new(
            DenyCode::ToolNotAllowed,
            format!(
                "agent `{}` may not use MCP server `{name}`",
                caller.rules().name
            ),
        )
        .never_retryable()
        .into());
    };
    Ok((server, access))
}

/// The transport's rules: POST, GET or DELETE; at most one readable
/// session id; no body on GET or DELETE. Returns the session id.
fn check_transport(
    session: &mut Session,
    method: &http::Method,
) -> Result<Option<String>, GatewayError> {
    if !matches!(
        *method,
        http::Method::POST | http::Method::GET | http::Method::DELETE
    ) {
        return Err(GatewayError::MethodNotAllowed {
            allow: MCP_METHODS.into(),
            message: "MCP endpoints take POST, GET and DELETE".into(),
        });
    }
    let req = session.req_header();
    let session_id = session_id_of(&req.headers)
        .map_err(|why| Deny::new(DenyCode::InvalidRequest, why).never_retryable())?;
    // Nothing judges a body on GET or DELETE, so none may travel: a server
    // that reads one would act on what no rule saw.
    let bodiless = *method != http::Method::POST;
    let has_body = declared_length(req)?.is_some_and(|n| n > 0)
        || req.headers.contains_key(http::header::TRANSFER_ENCODING);
    if bodiless && has_body {
        session.set_keepalive(None);
        return Err(Deny::new(
            DenyCode::InvalidRequest,
            format!("{method} on an MCP endpoint takes no body"),
        )
        .never_retryable()
        .into());
    }
    Ok(session_id)
}

/// What the judged messages ask for: the lists to filter, a session to
/// bind, and the first `tools/call` (audited by its arguments' digest,
/// never the arguments). Returns the call as the loop guard sees it.
fn read_call(
    ctx: &mut RequestCtx,
    access: &McpAccess,
    read: Read,
    call: &mut McpCall,
) -> Option<Fingerprint> {
    let j = &read.judgement;
    call.lists = j.messages.iter().filter_map(|m| m.list.clone()).collect();
    call.binds_session = j.initializes();
    let first = read.first?;
    let audit = ctx.mcp_audit.get_or_insert_with(McpAudit::default);
    audit.tool = Some(loopgate_policy::clip(&first.tool, 128).to_string());
    audit.tool_label = access
        .grant
        .tools
        .matching(&first.tool)
        .map(|p| p.as_config());
    audit.args_sha256 = Some(first.args_sha256);
    call.tool = Some(first.tool);
    first.fingerprint
}

/// A judged POST without its tree: the messages (their arguments gone)
/// and what the first `tools/call` came to.
struct Read {
    judgement: mcp::Judgement,
    /// Dry-run: the refusal enforcement would have answered.
    would_deny: Option<loopgate_policy::Deny>,
    first: Option<FirstCall>,
}

/// The first `tools/call` of a POST, read while its tree was held.
struct FirstCall {
    tool: String,
    /// The digest of its arguments (noise fields removed), compact JSON.
    args_sha256: String,
    /// What makes two calls the same call, for the loop guard (when on).
    fingerprint: Option<Fingerprint>,
}

/// Judges a POST body against the grant (dry-run: a call outside it goes
/// through, recorded), and says which message a refusal answers. A body
/// over [`JUDGE_ASIDE_BYTES`] is judged on the blocking pool, as a model
/// call's is: its tree costs a few milliseconds per MiB to build.
async fn judge_body(
    ctx: &mut RequestCtx,
    caller: &Caller<'_>,
    server: &McpServer,
    access: &Arc<McpAccess>,
    body: &Bytes,
    verdict: &mut Verdict,
) -> Result<Read, GatewayError> {
    let rules = caller.rules();
    let dry = [DenyCode::ToolNotAllowed, DenyCode::PathNotAllowed].map(|c| rules.is_dry_run(c));
    let read = if body.len() <= JUDGE_ASIDE_BYTES {
        let (noise, loops) = (&server.noise_fields, caller.loop_guard());
        parse_and_judge(&access.grant, dry, body, noise, loops, &server.name)
    } else {
        let (grant, body) = (access.clone(), body.clone());
        let (noise, loops) = (server.noise_fields.clone(), caller.loop_guard().cloned());
        let name = server.name.clone();
        aside(move || parse_and_judge(&grant.grant, dry, &body, &noise, loops.as_ref(), &name))
            .await?
    };
    let batch = body.first() == Some(&b'[');
    let read = read.map_err(|r| {
        ctx.rpc_reply = Some(RpcReply { id: r.id, batch });
        if let Some(a) = ctx.mcp_audit.as_mut() {
            // What the refused message was, as the judge read it (the one
            // parse); `invalid` when it could not tell.
            a.method = r.method.map(String::from).unwrap_or_else(|| match batch {
                true => "batch".into(),
                false => "invalid".into(),
            });
            a.tool = r.tool.map(String::from);
        }
        GatewayError::Denied(r.deny)
    })?;
    if let Some(d) = &read.would_deny {
        verdict.would_deny = Some(d.clone());
    }
    let j = &read.judgement;
    ctx.rpc_reply = Some(RpcReply {
        id: j.answer_id(),
        batch: j.batch,
    });
    if let Some(a) = ctx.mcp_audit.as_mut() {
        a.method = loopgate_policy::clip(j.method_summary(), 64).to_string();
    }
    Ok(read)
}

/// [`judge_body`]'s work that needs the tree, on the calling thread: the
/// judgement (under dry-run for `dry`'s codes, tool and path, a refusal
/// is recorded and the shape judged alone), then the first call's digest
/// and fingerprint, its arguments moved out of the tree, never copied;
/// every other call's arguments are dropped before it returns, so what it
/// returns holds no tree.
fn parse_and_judge(
    grant: &mcp::McpGrant,
    dry: [bool; 2],
    body: &[u8],
    noise: &[String],
    loops: Option<&LoopConfig>,
    server: &str,
) -> Result<Read, mcp::Refused> {
    let (mut judgement, would_deny) = match mcp::judge(grant, body) {
        Ok(j) => (j, None),
        Err(r)
            if (r.deny.code == DenyCode::ToolNotAllowed && dry[0])
                || (r.deny.code == DenyCode::PathNotAllowed && dry[1]) =>
        {
            (mcp::judge(&allow_all(), body)?, Some(r.deny))
        }
        Err(r) => return Err(r),
    };
    let mut first = None;
    for m in &mut judgement.messages {
        let Some((tool, args)) = m.tool.as_mut() else {
            continue;
        };
        let mut args = std::mem::take(args);
        if first.is_some() {
            continue;
        }
        mcp::strip_noise(&mut args, noise);
        let mut digest = DigestWriter(sha2::Sha256::new());
        // Compact JSON, as `Value::to_string` writes it, streamed.
        let _ = serde_json::to_writer(&mut digest, &args);
        let tool = tool.clone();
        let fingerprint = loops.map(|cfg| {
            let call = Value::Object(serde_json::Map::from_iter([
                ("tool".to_string(), Value::String(tool.clone())),
                ("arguments".to_string(), args),
            ]));
            loopgate_breaker::fingerprint(&format!("mcp:{server}:{tool}"), &call, cfg)
        });
        first = Some(FirstCall {
            tool,
            args_sha256: hex::encode(digest.0.finalize()),
            fingerprint,
        });
    }
    Ok(Read {
        judgement,
        would_deny,
        first,
    })
}

/// Feeds what is written to a SHA-256.
struct DigestWriter(sha2::Sha256);

impl std::io::Write for DigestWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A grant allowing everything (dry-run judges the shape only).
fn allow_all() -> mcp::McpGrant {
    let all = loopgate_policy::PatternList::parse(&["*"]).unwrap_or_default();
    mcp::McpGrant {
        tools: all.clone(),
        prompts: all.clone(),
        resources: all,
    }
}

/// The call-rate windows of every `tools/call` in a POST.
fn call_windows(
    name: &str,
    server: &McpServer,
    access: &McpAccess,
    agent: &str,
    j: &mcp::Judgement,
) -> Vec<WindowTake> {
    let mut extra: Vec<WindowTake> = Vec::new();
    for (t, _) in j.calls() {
        let key = format!("{agent}:mcp:{name}:{t}");
        // A batch calling one tool twice takes 2 from one window, not 1 twice.
        if let Some(w) = extra.iter_mut().find(|w| *w.key == *key) {
            w.cost += 1;
            continue;
        }
        let limit = if server.writes.allows(t) {
            access.write_calls_per_minute
        } else {
            access.calls_per_minute
        };
        extra.push(WindowTake {
            key: key.into(),
            limit,
            window: Duration::from_secs(60),
            cost: 1,
            enforce: true,
        });
    }
    extra
}

#[cfg(test)]
mod session_id_props {
    use super::*;
    use proptest::prelude::*;

    /// What the MCP spec allows an id to be: 1-256 visible ASCII characters.
    fn valid(id: &[u8]) -> bool {
        (1..=256).contains(&id.len()) && id.iter().all(|c| (b'!'..=b'~').contains(c))
    }

    /// `len` visible ASCII characters.
    fn visible(len: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(b'!'..=b'~', len)
    }

    /// Mostly ids a client would send (the lengths at both ends of the
    /// range included), the rest one byte or one length off.
    fn value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            6 => visible(1..=256),
            1 => visible(256..=256),
            1 => visible(1..=1),
            1 => visible(257..=300),
            1 => Just(Vec::new()),
            // One stray byte (a space, a tab, DEL, a high byte, ...) anywhere.
            3 => (visible(0..=20), any::<u8>(), visible(0..=20))
                .prop_filter("a byte outside the alphabet", |(_, b, _)| !(b'!'..=b'~').contains(b))
                .prop_map(|(mut a, b, c)| { a.push(b); a.extend(c); a }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Both directions: no header is no id; exactly one valid value is
        /// that id, byte for byte (refusing it fails); anything else (two
        /// headers, a value outside the alphabet or the length) is refused.
        #[test]
        fn one_visible_id_or_refused(
            values in prop_oneof![
                1 => proptest::collection::vec(value(), 0..=0),
                6 => proptest::collection::vec(value(), 1..=1),
                2 => proptest::collection::vec(value(), 2..=3),
            ]
        ) {
            let mut h = http::HeaderMap::new();
            let mut sent = Vec::new();
            for v in &values {
                // What no HTTP header can carry (CR, LF, NUL) never arrives.
                if let Ok(v) = http::HeaderValue::from_bytes(v) {
                    sent.push(v.as_bytes().to_vec());
                    h.append(SESSION_HEADER, v);
                }
            }
            let expected = match &sent[..] {
                [] => Some(None),
                [one] if valid(one) => Some(Some(String::from_utf8(one.clone()).unwrap())),
                _ => None,
            };
            let got = session_id_of(&h);
            prop_assert_eq!(got.clone().ok(), expected, "{:?}: {:?}", sent, got);
        }
    }
}
