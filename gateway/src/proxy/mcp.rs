//! Admission of MCP calls: `/mcp/{server}` on the proxy port (streamable
//! HTTP transport: JSON-RPC over POST, the server's SSE stream on GET, end
//! of session on DELETE).
//!
//! The agent's key decides which servers, tools, prompts and resources it
//! may use ([`loopgate_policy::mcp`] holds the one rule function for listing
//! and calling). A refused message is answered here with a JSON-RPC error
//! (same id; `error.data.loopgate_code`), never forwarded. Sessions are bound
//! to the agent that opened them, in the state store, so replicas agree.
//! `tools/call` feeds the task's loop guard and watchdog and a per tool
//! call-rate limit taken with the agent's limits in one store call.

use super::admit::{AdmitState, Admitted};
use super::ctx::Admission;
use crate::config::runtime::{McpAccess, McpServer};
use crate::config::Config;
use crate::error::GatewayError;
use bytes::Bytes;
use loopgate_policy::mcp::{self, Judgement, ListFilter};
use loopgate_policy::{Deny, DenyCode, LimitRequest, Verdict, WindowTake};
use pingora_proxy::Session;
use serde_json::Value;
use sha2::Digest;
use std::sync::Arc;
use std::time::Duration;

/// How long a session stays bound to its agent after the last `initialize`.
pub const SESSION_TTL: Duration = Duration::from_secs(24 * 3600);
const SESSION_HEADER: &str = "mcp-session-id";

/// `Some(server)` for a `/mcp/{server}` path.
pub fn split(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/mcp/")?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    (!rest.contains('/')).then_some(rest)
}

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

impl McpAudit {
    /// What a body says it is, judged or not.
    fn peek(server: &str, http_method: &str, body: &[u8], noise: &[String]) -> McpAudit {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let (method, first) = match &v {
            Value::Array(items) => ("batch".to_string(), items.first().cloned()),
            Value::Object(_) => (
                v.get("method")
                    .and_then(Value::as_str)
                    .map(|m| loopgate_policy::clip(m, 64).to_string())
                    .unwrap_or_else(|| "response".into()),
                Some(v.clone()),
            ),
            _ if body.is_empty() => (http_method.to_string(), None),
            _ => ("invalid".to_string(), None),
        };
        let params = first.as_ref().and_then(|m| m.get("params"));
        let tool = (first
            .as_ref()
            .and_then(|m| m.get("method"))
            .and_then(Value::as_str)
            == Some("tools/call"))
        .then(|| params.and_then(|p| p.get("name")).and_then(Value::as_str))
        .flatten()
        .map(|t| loopgate_policy::clip(t, 128).to_string());
        let args_sha256 = tool.as_ref().map(|_| {
            let mut args = params
                .and_then(|p| p.get("arguments"))
                .cloned()
                .unwrap_or(Value::Null);
            mcp::strip_noise(&mut args, noise);
            hex::encode(sha2::Sha256::digest(args.to_string()))
        });
        McpAudit {
            server: server.to_string(),
            method,
            tool,
            args_sha256,
            server_label: None,
            tool_label: None,
        }
    }
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

/// The store key binding a session to its agent.
pub fn session_key(server: &str, id: &str) -> String {
    format!("mcp-session:{server}:{id}")
}

fn rpc(id: Value, deny: Deny, batch: bool, request_id: &str, status: u16) -> Admitted {
    let one = mcp::error_response(&id, &deny, request_id);
    let body = if batch { Value::Array(vec![one]) } else { one };
    Admitted::Rpc {
        status,
        body: serde_json::to_vec(&body).unwrap_or_default(),
        deny,
    }
}

pub async fn admit_mcp(
    session: &mut Session,
    cfg: &Config,
    state: &AdmitState<'_>,
    agent_idx: usize,
    request_id: &str,
    intake: &mut super::buffers::BodyIntake,
    audit: &mut Option<McpAudit>,
) -> Result<Admitted, GatewayError> {
    let rules = &cfg.agents[agent_idx];
    let req = session.req_header().clone();
    let name = split(req.uri.path()).unwrap_or("");
    *audit = Some(McpAudit {
        server: loopgate_policy::clip(name, 64).to_string(),
        method: req.method.as_str().to_string(),
        ..McpAudit::default()
    });
    let Some(server) = cfg.mcp_servers.get(name) else {
        return Ok(rpc(
            Value::Null,
            Deny::new(
                DenyCode::NotFound,
                format!("no such MCP server: `{}`", loopgate_policy::clip(name, 100)),
            )
            .never_retryable(),
            false,
            request_id,
            404,
        ));
    };
    if let Some(a) = audit.as_mut() {
        a.server_label = Some(Arc::from(server.tool.name.as_str()));
    }
    // No grant: a refusal the agent cannot mistake for an empty server.
    let Some(access) = cfg.mcp_access[agent_idx].get(name).cloned() else {
        return Ok(rpc(
            Value::Null,
            Deny::new(
                DenyCode::ToolNotAllowed,
                format!("agent `{}` may not use MCP server `{name}`", rules.name),
            )
            .never_retryable(),
            false,
            request_id,
            403,
        ));
    };

    // A session belongs to the agent that opened it.
    let session_id = match session_id_of(&req.headers) {
        Ok(sid) => sid,
        Err(why) => {
            return Ok(rpc(
                Value::Null,
                Deny::new(DenyCode::InvalidRequest, why).never_retryable(),
                false,
                request_id,
                400,
            ))
        }
    };
    // Nothing judges a body on GET or DELETE, so none may travel: a server
    // that reads one would act on what no rule saw.
    let bodiless = matches!(req.method, http::Method::GET | http::Method::DELETE);
    let has_body = super::admit::declared_length(&req)?.is_some_and(|n| n > 0)
        || req.headers.contains_key(http::header::TRANSFER_ENCODING);
    if bodiless && has_body {
        session.set_keepalive(None);
        return Ok(rpc(
            Value::Null,
            Deny::new(
                DenyCode::InvalidRequest,
                format!("{} on an MCP endpoint takes no body", req.method),
            )
            .never_retryable(),
            false,
            request_id,
            400,
        ));
    }
    // `fail_mode: open`: what the gateway could not decide, let through.
    let mut fail_open: Option<DenyCode> = None;
    let undecided = |d: &Deny| {
        matches!(
            d.code,
            DenyCode::StateUnavailable | DenyCode::PolicyUnavailable
        )
    };
    if let Some(sid) = &session_id {
        let owner = match state
            .store
            .record_get(state.clock.now(), &session_key(name, sid))
            .await
        {
            Ok(o) => o,
            Err(e) => {
                let d = Deny::new(DenyCode::StateUnavailable, e.to_string());
                if !server.tool.fail_open {
                    return Ok(rpc(Value::Null, d, false, request_id, 503));
                }
                log::warn!("fail_mode open: session not checked: {}", d.message);
                fail_open = Some(d.code);
                Some((0, rules.name.as_bytes().to_vec()))
            }
        };
        match owner {
            Some((_, agent)) if agent == rules.name.as_bytes() => {}
            Some(_) => {
                return Ok(rpc(
                    Value::Null,
                    Deny::new(
                        DenyCode::SessionNotOwned,
                        "this MCP session belongs to another agent",
                    )
                    .never_retryable(),
                    false,
                    request_id,
                    403,
                ))
            }
            None => {
                // Unknown (or expired) here: the client starts a new session.
                return Ok(rpc(
                    Value::Null,
                    Deny::new(DenyCode::NotFound, "unknown MCP session: initialize again")
                        .never_retryable(),
                    false,
                    request_id,
                    404,
                ));
            }
        }
    }

    let mut dry_run_deny = None;
    let (body, mut call, extra) = match req.method {
        http::Method::POST => {
            let limit = rules.max_body_bytes;
            let body = super::admit::read_body(session, limit, intake).await?;
            let mut peeked = McpAudit::peek(name, "POST", &body, &server.noise_fields);
            peeked.server_label = Some(Arc::from(server.tool.name.as_str()));
            *audit = Some(peeked);
            let judgement = match mcp::judge(&access.grant, &body) {
                Ok(j) => j,
                // Dry-run: a call outside the grant goes through, recorded.
                Err(refused)
                    if matches!(
                        refused.deny.code,
                        DenyCode::ToolNotAllowed | DenyCode::PathNotAllowed
                    ) && rules.is_dry_run(refused.deny.code) =>
                {
                    dry_run_deny = Some(refused.deny);
                    match mcp::judge(&allow_all(), &body) {
                        Ok(j) => j,
                        Err(refused) => {
                            let batch = body.first() == Some(&b'[');
                            return Ok(rpc(refused.id, refused.deny, batch, request_id, 200));
                        }
                    }
                }
                Err(refused) => {
                    let batch = body.first() == Some(&b'[');
                    return Ok(rpc(refused.id, refused.deny, batch, request_id, 200));
                }
            };
            // Without a session id (stateless servers, or `initialize`) the
            // grant applies all the same.
            let (call, extra) = describe(name, server, &access, rules.name.as_ref(), &judgement);
            (body, call, extra)
        }
        http::Method::GET | http::Method::DELETE => {
            if session_id.is_none() {
                return Ok(rpc(
                    Value::Null,
                    Deny::new(DenyCode::InvalidRequest, "this needs an Mcp-Session-Id")
                        .never_retryable(),
                    false,
                    request_id,
                    400,
                ));
            }
            let call = McpCall {
                server: name.to_string(),
                tool: None,
                lists: Vec::new(),
                access: access.clone(),
                binds_session: false,
            };
            (Bytes::new(), call, Vec::new())
        }
        _ => {
            return Err(Deny::new(
                DenyCode::MethodNotAllowed,
                "MCP endpoints take POST, GET and DELETE",
            )
            .into())
        }
    };

    let task = super::admit::task_id(session);
    let mut verdict = Verdict::default();
    if rules.is_dry_run(DenyCode::ToolNotAllowed) {
        // Dry-run shows what enforcement would hide: lists pass unfiltered.
        call.lists.clear();
    }
    if let Some(d) = dry_run_deny {
        verdict.would_deny = Some(d);
    }
    let agent_guards = &cfg.guards[agent_idx];
    let batch = body.first() == Some(&b'[');
    let call_id = first_call_id(&body);
    // The agent's request limits and each called tool's rate, in one call,
    // before the guards: a refused call leaves no task state behind, and
    // what the limits took is given back if a guard refuses after them.
    let taken = rules
        .admit_limits(
            state.store,
            state.clock.now(),
            &LimitRequest {
                extra: &extra,
                estimated_prompt: 0,
                max_tokens: Some(0),
                task: None,
            },
            &mut verdict,
        )
        .await;
    let taken = match taken {
        Ok(t) => t,
        Err(d) if undecided(&d) && server.tool.fail_open => {
            fail_open.get_or_insert(d.code);
            loopgate_policy::LimitsTaken::none()
        }
        Err(d) => return Ok(rpc(call_id, d, batch, request_id, 200)),
    };
    let guarded: Result<(), Result<Admitted, GatewayError>> = async {
        // The task's loop guard and watchdog see tool calls.
        if let (Some(tool), Some(task)) = (&call.tool, task) {
            let key = format!("{}/{task}", rules.name);
            if let Some(loops) = &agent_guards.loops {
                let args = first_call_args(&body, &server.noise_fields);
                let what = format!("mcp:{name}:{tool}");
                let deny = super::guards::check_loop_value(
                    state,
                    rules,
                    agent_guards,
                    loops,
                    &key,
                    &what,
                    &args,
                )
                .await;
                match deny {
                    Ok(Some(d)) => match verdict.judge_external(rules, Some(d)) {
                        Ok(()) => {}
                        Err(d) => return Err(Ok(rpc(call_id, d, batch, request_id, 200))),
                    },
                    Ok(None) => {}
                    Err(GatewayError::Denied(d)) if undecided(&d) && server.tool.fail_open => {
                        fail_open.get_or_insert(d.code);
                    }
                    Err(GatewayError::Denied(d)) => {
                        return Err(Ok(rpc(call_id, d, batch, request_id, 200)))
                    }
                    Err(e) => return Err(Err(e)),
                }
            }
            if let Some(wd) = &agent_guards.watchdog {
                match super::guards::watch(state, rules, wd, &key) {
                    Ok(super::guards::Watch::Stop(d)) => {
                        if let Err(d) = verdict.judge_external(rules, Some(d)) {
                            return Err(Ok(rpc(call_id, d, batch, request_id, 200)));
                        }
                    }
                    Ok(_) => {}
                    Err(GatewayError::Denied(d)) => {
                        return Err(Ok(rpc(call_id, d, batch, request_id, 200)))
                    }
                    Err(e) => return Err(Err(e)),
                }
            }
        }
        Ok(())
    }
    .await;
    if let Err(out) = guarded {
        super::admit::release(state, &taken).await;
        return out;
    }
    if let Some(a) = audit.as_mut() {
        a.tool_label = a
            .tool
            .as_deref()
            .and_then(|t| access.grant.tools.matching(t))
            .map(|p| p.as_config());
    }
    let query = req.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let body_read = req.method == http::Method::POST;
    Ok(Admitted::Forward(
        Arc::new(Admission {
            request_id: request_id.to_string(),
            agent: rules.name.clone(),
            model: String::new(),
            route_name: Arc::from(name),
            route: server.tool.route.clone(),
            stream: false,
            would_deny: verdict.would_deny.map(|d| d.code),
            task_key: task.map(|t| format!("{}/{t}", rules.name)),
            guard: None,
            degraded_from: None,
            budget_room: None,
            tool_path: Some(format!("{}{query}", server.path)),
            body_read,
            idem: None,
            expect_json: true,
            isolation: None,
            fail_open,
            mcp: Some(Arc::new(call)),
            body_rewritten: false,
            forward_headers: cfg.forward_headers[agent_idx].clone(),
        }),
        body,
        taken,
    ))
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

/// The call's description for the exchange, and the call-rate windows of
/// every `tools/call` in it.
fn describe(
    name: &str,
    server: &McpServer,
    access: &Arc<McpAccess>,
    agent: &str,
    j: &Judgement,
) -> (McpCall, Vec<WindowTake>) {
    let tool = j
        .messages
        .iter()
        .find_map(|m| m.tool.as_ref())
        .map(|(t, _)| t.clone());
    let mut extra: Vec<WindowTake> = Vec::new();
    for (t, _) in j.messages.iter().filter_map(|m| m.tool.as_ref()) {
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
    let call = McpCall {
        server: name.to_string(),
        tool,
        lists: j.messages.iter().filter_map(|m| m.list.clone()).collect(),
        access: access.clone(),
        binds_session: j
            .messages
            .iter()
            .any(|m| m.method.as_deref() == Some("initialize")),
    };
    (call, extra)
}

/// The id of the first `tools/call` (for answering its refusal).
fn first_call_id(body: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let first = |m: &Value| m.get("id").cloned().unwrap_or(Value::Null);
    match &v {
        Value::Array(items) => items
            .iter()
            .find(|m| m.get("method").and_then(Value::as_str) == Some("tools/call"))
            .map(first)
            .unwrap_or(Value::Null),
        other => first(other),
    }
}

/// The first `tools/call`'s name and arguments, noise removed: what makes
/// two calls the same call.
fn first_call_args(body: &[u8], noise: &[String]) -> Value {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let call = match &v {
        Value::Array(items) => items
            .iter()
            .find(|m| m.get("method").and_then(Value::as_str) == Some("tools/call"))
            .cloned()
            .unwrap_or(Value::Null),
        other => other.clone(),
    };
    let mut args = call
        .get("params")
        .and_then(|p| p.get("arguments"))
        .cloned()
        .unwrap_or(Value::Null);
    mcp::strip_noise(&mut args, noise);
    serde_json::json!({ "tool": call.get("params").and_then(|p| p.get("name")), "arguments": args })
}

/// Largest MCP message held to filter it (a JSON body, or one SSE event).
pub const MAX_LIST_BYTES: usize = 8 * 1024 * 1024;

/// Filters `*/list` results to the grant as the response passes: a JSON
/// body is held whole (it is one message); an SSE stream passes event by
/// event, and only an event carrying a list result is held and rewritten.
#[derive(Debug)]
pub struct ListRewriter {
    /// By JSON-RPC id (its JSON text, so `1` and `"1"` stay apart): one
    /// lookup per answered message, not a scan of every list request.
    lists: std::collections::HashMap<String, ListFilter>,
    access: Arc<McpAccess>,
    sse: bool,
    pending: Vec<u8>,
    pub removed: usize,
}

impl ListRewriter {
    pub fn new(call: &McpCall, content_type: &str) -> ListRewriter {
        ListRewriter {
            lists: call
                .lists
                .iter()
                .map(|f| (f.id.to_string(), f.clone()))
                .collect(),
            access: call.access.clone(),
            sse: content_type.starts_with("text/event-stream"),
            pending: Vec::new(),
            removed: 0,
        }
    }

    /// Rewrites one message if it answers a list request.
    fn rewrite_message(&mut self, v: &mut Value) -> bool {
        let mut changed = false;
        let mut one = |m: &mut Value, this: &mut ListRewriter| {
            let Some(id) = m.get("id").map(Value::to_string) else {
                return;
            };
            if let Some(f) = this.lists.get(&id) {
                if let Some(result) = m.get_mut("result") {
                    this.removed += this.access.grant.filter_list(f, result);
                    changed = true;
                }
            }
        };
        match v {
            Value::Array(items) => items.iter_mut().for_each(|m| one(m, self)),
            m => one(m, self),
        }
        changed
    }

    /// Takes the next body chunk; returns what to send now, or `Err` when
    /// the message to filter outgrew [`MAX_LIST_BYTES`]: it is never passed
    /// on unfiltered.
    pub fn feed(&mut self, chunk: &[u8], end: bool) -> Result<Bytes, String> {
        if self.pending.len() + chunk.len() > MAX_LIST_BYTES {
            self.pending = Vec::new();
            return Err(format!(
                "an MCP answer to filter exceeds {MAX_LIST_BYTES} bytes"
            ));
        }
        self.pending.extend_from_slice(chunk);
        Ok(self.feed_held(end))
    }

    fn feed_held(&mut self, end: bool) -> Bytes {
        if !self.sse {
            if !end {
                return Bytes::new();
            }
            let raw = std::mem::take(&mut self.pending);
            let Ok(mut v) = serde_json::from_slice::<Value>(&raw) else {
                return Bytes::from(raw);
            };
            if !self.rewrite_message(&mut v) {
                return Bytes::from(raw);
            }
            return Bytes::from(serde_json::to_vec(&v).unwrap_or(raw));
        }
        let mut out = Vec::new();
        while let Some(pos) = find_event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..pos).collect();
            out.extend_from_slice(&self.rewrite_event(event));
        }
        if end && !self.pending.is_empty() {
            out.append(&mut self.pending);
        }
        Bytes::from(out)
    }

    /// One SSE event (with its blank-line terminator).
    fn rewrite_event(&mut self, event: Vec<u8>) -> Vec<u8> {
        let Ok(text) = std::str::from_utf8(&event) else {
            return event;
        };
        let data: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            return event;
        }
        let Ok(mut v) = serde_json::from_str::<Value>(&data.join("\n")) else {
            return event;
        };
        if !self.rewrite_message(&mut v) {
            return event;
        }
        let mut out = String::new();
        for l in text
            .lines()
            .filter(|l| !l.starts_with("data:") && !l.is_empty())
        {
            out.push_str(l);
            out.push('\n');
        }
        out.push_str("data: ");
        out.push_str(&v.to_string());
        out.push_str("\n\n");
        out.into_bytes()
    }
}

/// The end (exclusive, blank line included) of the first complete event.
fn find_event_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| p + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod session_id_props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any header values: an id is taken only when there is exactly one
        /// and it is 1-256 visible ASCII, and it is taken as sent.
        #[test]
        fn one_visible_id_or_refused(
            values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..3)
        ) {
            let mut h = http::HeaderMap::new();
            let mut sent = Vec::new();
            for v in &values {
                if let Ok(v) = http::HeaderValue::from_bytes(v) {
                    sent.push(v.as_bytes().to_vec());
                    h.append(SESSION_HEADER, v);
                }
            }
            match session_id_of(&h) {
                Ok(None) => prop_assert!(sent.is_empty()),
                Ok(Some(id)) => {
                    prop_assert_eq!(sent.len(), 1);
                    prop_assert_eq!(id.as_bytes(), &sent[0][..]);
                    prop_assert!((1..=256).contains(&id.len()));
                    prop_assert!(id.bytes().all(|c| (0x21..=0x7e).contains(&c)));
                }
                Err(_) => prop_assert!(!sent.is_empty()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopgate_policy::mcp::{Kind, McpGrant};
    use loopgate_policy::PatternList;
    use serde_json::json;

    fn rewriter(sse: bool) -> ListRewriter {
        let access = Arc::new(McpAccess {
            grant: McpGrant {
                tools: PatternList::parse(&["read*"]).unwrap(),
                prompts: PatternList::default(),
                resources: PatternList::default(),
            },
            calls_per_minute: 1,
            write_calls_per_minute: 1,
        });
        let call = McpCall {
            server: "s".into(),
            tool: None,
            lists: vec![ListFilter {
                id: json!(2),
                kind: Kind::Tool,
                templates: false,
            }],
            access,
            binds_session: false,
        };
        ListRewriter::new(
            &call,
            if sse {
                "text/event-stream"
            } else {
                "application/json"
            },
        )
    }

    fn list_result() -> Value {
        json!({"jsonrpc": "2.0", "id": 2, "result": {"tools": [{"name": "read_file"}, {"name": "delete_file"}], "nextCursor": "c2"}})
    }

    #[test]
    fn json_list_results_are_filtered_whole() {
        let mut r = rewriter(false);
        let body = list_result().to_string();
        let (a, b) = body.as_bytes().split_at(10);
        assert!(r.feed(a, false).unwrap().is_empty());
        let out: Value = serde_json::from_slice(&r.feed(b, true).unwrap()).unwrap();
        assert_eq!(out["result"]["tools"], json!([{"name": "read_file"}]));
        assert_eq!(out["result"]["nextCursor"], "c2");
        assert_eq!(r.removed, 1);
    }

    #[test]
    fn sse_passes_other_events_and_rewrites_the_list_event() {
        let mut r = rewriter(true);
        let progress =
            "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n";
        let list = format!("event: message\nid: 9\ndata: {}\n\n", list_result());
        let stream = format!("{progress}{list}");
        let mut out = Vec::new();
        for chunk in stream.as_bytes().chunks(7) {
            out.extend_from_slice(&r.feed(chunk, false).unwrap());
        }
        out.extend_from_slice(&r.feed(b"", true).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(progress), "{text}");
        assert!(text.contains("id: 9\n"));
        assert!(!text.contains("delete_file"));
        assert!(text.contains("read_file"));
        assert_eq!(r.removed, 1);
    }
}
