//! Responses Loopgate writes itself: its errors, one renderer per wire
//! format (OpenAI-shaped JSON, JSON-RPC for MCP, an SSE error event for a
//! stream already under way), idempotent replays and the model list.

use super::call::{Call, Wire};
use super::ctx::RequestCtx;
use crate::config::{Config, ProviderKind};
use crate::error::GatewayError;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora_proxy::Session;

pub const ERROR_HEADER: &str = "x-loopgate-error";
pub const REQUEST_ID_HEADER: &str = "x-request-id";
pub const WOULD_DENY_HEADER: &str = "x-loopgate-would-deny";
pub const PROVIDER_HEADER: &str = "x-loopgate-provider";
pub const FALLBACK_HEADER: &str = "x-loopgate-fallback";
pub const GUARD_HEADER: &str = "x-loopgate-guard";
/// The task's predicted spend in dollars (watchdog spend prediction).
pub const PREDICTED_HEADER: &str = "x-loopgate-predicted-usd";
/// What a non-streamed answer cost, in exact dollars (`proxy::large_body`).
pub const COST_HEADER: &str = "x-loopgate-cost-usd";
pub const DEGRADED_HEADER: &str = "x-loopgate-degraded";
/// Forwarded under `fail_mode: open`: why the gateway could not decide.
pub const FAIL_OPEN_HEADER: &str = "x-loopgate-fail-open";
/// Read by the official OpenAI and Anthropic SDKs before their own retry
/// rules: `false` on every refusal that a retry cannot clear soon.
pub const SHOULD_RETRY_HEADER: &str = "x-should-retry";

/// Once an MCP body is judged, a refusal answers its message in-band: the
/// id of the message refused (the first `tools/call`'s, else a lone
/// message's), in an array for a batch, with HTTP 200.
#[derive(Debug, Clone)]
pub struct RpcReply {
    pub id: serde_json::Value,
    pub batch: bool,
}

/// Writes `e` in the call's wire format (see [`Wire`]). Returns the status
/// written, or 0 when nothing could be written (a response had already
/// started, or the client is gone).
pub async fn write_error(session: &mut Session, ctx: &mut RequestCtx, e: &GatewayError) -> u16 {
    ctx.error_code = Some(e.code());
    if response_started(session) {
        return 0;
    }
    let mut extra: Vec<(&'static str, String)> = vec![(ERROR_HEADER, e.code().to_string())];
    if let Some(secs) = e.retry_after_secs() {
        extra.push(("retry-after", secs.max(1).to_string()));
    }
    if !e.worth_retrying() {
        // The official SDKs retry 409, 429 and 5xx by themselves (a loop
        // refusal included, after its Retry-After) unless told not to.
        extra.push((SHOULD_RETRY_HEADER, "false".to_string()));
    }
    if let GatewayError::MethodNotAllowed { allow, .. } = e {
        extra.push(("allow", allow.clone()));
    }
    let (status, body) = match Call::wire(ctx.call.as_ref()) {
        Wire::Json => (e.status(), render_json(e, &ctx.request_id, false)),
        Wire::Anthropic => (e.status(), render_anthropic(e, &ctx.request_id)),
        Wire::ToolJson => (e.status(), render_json(e, &ctx.request_id, true)),
        Wire::JsonRpc => render_rpc(e, ctx.rpc_reply.as_ref(), &ctx.request_id),
    };
    match write_json(session, ctx, status, body, &extra).await {
        Ok(()) => status,
        Err(err) => {
            log::debug!(
                "request {}: could not write error response: {err}",
                ctx.request_id
            );
            0
        }
    }
}

/// The OpenAI-shaped error body, extended:
/// `{"error":{"type":..,"code":..,"message":..,"request_id":..,"retryable":..}}`;
/// for tool calls it also says whether the tool broke
/// (`upstream_failed: true`) or the gateway refused, so an agent stops
/// retrying into a wall. The response carries `x-loopgate-error: <code>`,
/// so an agent can tell a gateway decision from a provider's own error.
pub fn render_json(e: &GatewayError, request_id: &str, tool_call: bool) -> Vec<u8> {
    let mut error = error_object(e, e.error_type(), request_id);
    if tool_call {
        error["upstream_failed"] = serde_json::Value::Bool(e.upstream_failed());
    }
    serde_json::to_vec(&serde_json::json!({ "error": error })).unwrap_or_default()
}

/// The error object both JSON shapes carry: `type` (the shape's own),
/// Loopgate's `code`, `message`, `request_id`, `retryable`, and a money
/// refusal's `budget`.
fn error_object(e: &GatewayError, kind: &str, request_id: &str) -> serde_json::Value {
    let mut error = serde_json::json!({
        "type": kind,
        "code": e.code(),
        "message": e.message(),
        "request_id": request_id,
        "retryable": e.retryable(),
    });
    if let Some(b) = budget_json(e) {
        error["budget"] = b;
    }
    error
}

/// The Anthropic-shaped error body for a Messages call, with the same
/// Loopgate fields as [`render_json`]:
/// `{"type":"error","error":{"type":..,"message":..,"code":..,"request_id":..,"retryable":..}}`.
/// `error.type` is the one Anthropic documents for the status, which its
/// SDKs and agents branch on.
pub fn render_anthropic(e: &GatewayError, request_id: &str) -> Vec<u8> {
    let error = error_object(e, anthropic_error_type(e.status()), request_id);
    serde_json::to_vec(&serde_json::json!({ "type": "error", "error": error })).unwrap_or_default()
}

/// Anthropic's error type for an HTTP status.
fn anthropic_error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 | 504 => "timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// A money budget's refusal, in numbers:
/// `{"level": "agent_day", "limit_usd": 5.0, "reserved_usd": 0.0123}`.
fn budget_json(e: &GatewayError) -> Option<serde_json::Value> {
    use loopgate_policy::price::micros_to_usd;
    let GatewayError::Denied(d) = e else {
        return None;
    };
    let b = d.budget.as_deref()?;
    Some(serde_json::json!({
        "level": b.level.as_str(),
        "limit_usd": micros_to_usd(b.limit),
        "reserved_usd": micros_to_usd(b.reserve),
    }))
}

/// The JSON-RPC error answering an MCP request: `error.data` carries the
/// Loopgate code, `retryable`, the request id and, when known,
/// `retry_after`. Before the body was judged (no [`RpcReply`]) the id is
/// `null` and the HTTP status is the error's; after, the refused message's
/// id, in-band (200), as MCP clients expect a JSON-RPC error.
pub fn render_rpc(e: &GatewayError, reply: Option<&RpcReply>, request_id: &str) -> (u16, Vec<u8>) {
    use loopgate_policy::DenyCode;
    let code = match e {
        GatewayError::Denied(d) => match d.code {
            DenyCode::InvalidJson => -32700,
            DenyCode::InvalidRequest => -32600,
            // A JSON-RPC method outside the grant or unknown.
            DenyCode::MethodNotAllowed => -32601,
            _ => -32001,
        },
        GatewayError::BadRequest(_) | GatewayError::MethodNotAllowed { .. } => -32600,
        GatewayError::Internal(_) => -32603,
        _ => -32001,
    };
    let mut data = serde_json::json!({
        "loopgate_code": e.code(),
        "retryable": e.retryable(),
        "request_id": request_id,
    });
    if let Some(secs) = e.retry_after_secs() {
        data["retry_after"] = serde_json::json!(secs.max(1));
    }
    let one = serde_json::json!({
        "jsonrpc": "2.0",
        "id": reply.map_or(serde_json::Value::Null, |r| r.id.clone()),
        "error": { "code": code, "message": e.message(), "data": data },
    });
    let (status, body) = match reply {
        Some(r) if r.batch => (200, serde_json::Value::Array(vec![one])),
        Some(_) if matches!(e, GatewayError::Denied(_)) => (200, one),
        _ => (e.status(), one),
    };
    (status, serde_json::to_vec(&body).unwrap_or_default())
}

/// The SSE event that ends a broken stream, in the provider family's
/// format, so an agent sees an error instead of a silent cut.
pub fn sse_error_event(kind: Option<ProviderKind>, e: &GatewayError, request_id: &str) -> Bytes {
    let event = match kind {
        Some(ProviderKind::Anthropic) => format!(
            "event: error\ndata: {}\n\n",
            serde_json::json!({"type": "error", "error": {
                "type": "api_error", "message": e.message(), "code": e.code(), "request_id": request_id,
            }})
        ),
        _ => format!(
            "data: {}\n\n",
            serde_json::json!({"error": {
                "type": e.error_type(), "code": e.code(), "message": e.message(),
                "request_id": request_id, "retryable": e.retryable(),
            }})
        ),
    };
    Bytes::from(event)
}

/// The gateway's decisions on a relayed response: the request id, who
/// served it and what the gateway decided on the way. Only the gateway
/// speaks in `x-loopgate-*`: an upstream's own are removed first, so it
/// cannot forge one of its decisions, and so are their spellings with `_`
/// (`x-loopgate_cost_usd`, `x_request_id`; see `header_names`).
pub fn decision_headers(resp: &mut ResponseHeader, ctx: &RequestCtx) -> pingora::Result<()> {
    let forged: Vec<http::HeaderName> = resp
        .headers
        .keys()
        .filter(|h| super::header_names::forged_answer_header(h.as_str()))
        .cloned()
        .collect();
    for h in &forged {
        resp.remove_header(h);
    }
    resp.insert_header(REQUEST_ID_HEADER, ctx.request_id.as_str())?;
    if let Some(p) = &ctx.served_by {
        // The attempt that answered carries its provider's prebuilt value;
        // a last attempt that failed (5xx, 429) was already settled, so
        // then the name is copied in.
        match &ctx.attempt {
            Some(att) => {
                resp.insert_header(PROVIDER_HEADER, att.picked.provider.name_value.clone())?
            }
            None => resp.insert_header(PROVIDER_HEADER, p.as_ref())?,
        }
        if let Some(from) = ctx.fallback.from.as_ref().filter(|f| *f != p) {
            resp.insert_header(FALLBACK_HEADER, from.as_ref())?;
        }
    }
    if let Some(adm) = ctx.admitted.as_ref() {
        if adm
            .model()
            .is_some_and(|m| m.endpoint == loopgate_policy::Endpoint::CountTokens)
        {
            resp.insert_header(COUNT_HEADER, "provider")?;
        }
        if let Some(code) = adm.would_deny {
            resp.insert_header(WOULD_DENY_HEADER, code.as_str())?;
        }
        if let Some(code) = adm.fail_open {
            resp.insert_header(FAIL_OPEN_HEADER, code.as_str())?;
        }
        if let Some(g) = adm.guard {
            resp.insert_header(GUARD_HEADER, g)?;
        }
        if let Some(usd) = adm.predicted_usd {
            resp.insert_header(PREDICTED_HEADER, format!("{usd:.6}"))?;
        }
        if let Some(m) = adm.model() {
            if let Some(from) = &m.degraded_from {
                resp.insert_header(DEGRADED_HEADER, format!("{from}->{}", m.model))?;
            }
        }
    }
    if ctx.lease.as_ref().is_some_and(|l| l.degraded) {
        // Admitted on this instance's share of the limits: Redis was away.
        resp.append_header(DEGRADED_HEADER, "state")?;
    }
    Ok(())
}

/// The response's content type, if it has a readable one.
pub fn content_type(resp: &ResponseHeader) -> Option<&str> {
    resp.headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
}

/// Whether the response's media type is `media` (`text/event-stream`,
/// `application/json`), parameters aside. Media types are
/// case-insensitive: every feature asks here, so a `Text/Event-Stream`
/// answer is a stream to each of them, not a stream to one and a body to
/// another (list filtering, usage, translation, the JSON check).
pub fn has_media_type(resp: &ResponseHeader, media: &str) -> bool {
    content_type(resp).is_some_and(|c| {
        c.get(..media.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(media))
    })
}

/// Whether the response is an event stream.
pub fn is_event_stream(resp: &ResponseHeader) -> bool {
    has_media_type(resp, "text/event-stream")
}

/// `fail_to_proxy`: answers the error the exchange ended with. The answer
/// is the error's own [`GatewayError`] cause when a hook gave one, else
/// the last failed attempt's, else what the transport error means. Returns
/// the status written (0: nothing could be, the response had started or
/// the agent is gone).
pub async fn write_failure(
    session: &mut Session,
    ctx: &mut RequestCtx,
    e: &pingora::Error,
    metrics: &crate::metrics::Metrics,
) -> u16 {
    let answer = GatewayError::cause_of(e)
        .cloned()
        .or_else(|| ctx.fallback.last_failure.take())
        .unwrap_or_else(|| {
            super::failure::map_transport_error(e, &super::upstream::provider_name(ctx))
        });
    if super::failure::dead_client(e) {
        // The agent went away (or reset): nothing can be answered, and the
        // log says so rather than call its request bad.
        ctx.error_code = Some(CLIENT_CLOSED);
        return 0;
    }
    if response_started(session) {
        // Mid-stream: end an event stream with an error event in the
        // provider's format rather than a silent cut.
        ctx.error_code = Some(answer.code());
        if session.response_written().is_some_and(is_event_stream) {
            // A translated stream ends in the agent's family.
            let kind = ctx
                .features
                .translate
                .as_ref()
                .and_then(|t| t.agent_kind())
                .or(ctx.served_kind);
            let event = sse_error_event(kind, &answer, &ctx.request_id);
            // What a broken translation read whole before it broke goes
            // first: the agent loses none of the answer it could read.
            let unsent = ctx
                .features
                .translate
                .as_mut()
                .and_then(|t| t.take_unsent());
            let event = match unsent {
                Some(before) => Bytes::from([before, event].concat()),
                None => event,
            };
            if let Err(err) = session.write_response_body(Some(event), true).await {
                log::debug!("request {}: cannot end the stream: {err}", ctx.request_id);
            }
        }
        return 0;
    }
    metrics.denied(answer.code());
    write_error(session, ctx, &answer).await
}

/// The access log's code for an exchange the agent left before its
/// answer was written (nginx logs it as 499).
pub const CLIENT_CLOSED: &str = "client_closed";

/// Whether a final (non-1xx) response header went out; a `100 Continue` we
/// sent before reading the body does not count.
pub fn response_started(session: &Session) -> bool {
    session
        .response_written()
        .is_some_and(|r| r.status.as_u16() >= 200)
}

async fn write_json(
    session: &mut Session,
    ctx: &RequestCtx,
    status: u16,
    body: Vec<u8>,
    extra: &[(&'static str, String)],
) -> pingora::Result<()> {
    let mut resp = ResponseHeader::build(status, Some(4 + extra.len()))?;
    resp.insert_header("content-type", "application/json")?;
    resp.insert_header("content-length", body.len().to_string())?;
    resp.insert_header(REQUEST_ID_HEADER, ctx.request_id.as_str())?;
    for (k, v) in extra {
        resp.insert_header(*k, v.as_str())?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(Bytes::from(body)), true)
        .await
}

/// Replays a recorded tool response for a repeated idempotency key.
pub async fn write_replay(
    session: &mut Session,
    ctx: &RequestCtx,
    record: &loopgate_policy::IdemRecord,
) -> pingora::Result<()> {
    let mut resp = ResponseHeader::build(record.status, Some(4))?;
    if let Some(ct) = &record.content_type {
        resp.insert_header("content-type", ct.as_str())?;
    }
    resp.insert_header("content-length", record.body.len().to_string())?;
    resp.insert_header(REQUEST_ID_HEADER, ctx.request_id.as_str())?;
    resp.insert_header("x-loopgate-idempotent-replay", "true")?;
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(Bytes::from(record.body.clone())), true)
        .await
}

/// Says who counted a `count_tokens` answer: `provider` (an
/// Anthropic-family target of the route) or `estimated` (the gateway).
pub const COUNT_HEADER: &str = "x-loopgate-count";

/// `count_tokens` answered by the gateway: Anthropic's shape,
/// `{"input_tokens": N}`, said to be the gateway's estimate.
pub async fn write_count(
    session: &mut Session,
    ctx: &mut RequestCtx,
    tokens: u64,
    would_deny: Option<loopgate_policy::DenyCode>,
) -> pingora::Result<()> {
    let body = serde_json::json!({ "input_tokens": tokens });
    let mut extra: Vec<(&'static str, String)> = vec![(COUNT_HEADER, "estimated".into())];
    if let Some(c) = would_deny {
        extra.push((WOULD_DENY_HEADER, c.as_str().to_string()));
    }
    write_json(
        session,
        ctx,
        200,
        serde_json::to_vec(&body).unwrap_or_default(),
        &extra,
    )
    .await
}

/// `GET /v1/models`: the models this agent may use that have a route, in the
/// OpenAI shape, or Anthropic's when the client sent `anthropic-version`.
pub async fn write_models(
    session: &mut Session,
    ctx: &mut RequestCtx,
    cfg: &Config,
    agent_idx: usize,
    would_deny: Option<loopgate_policy::DenyCode>,
) -> pingora::Result<()> {
    let agent = &cfg.agents[agent_idx];
    // Prefix routes cannot be enumerated; list the exact names only.
    let models: Vec<String> = cfg
        .routes
        .names()
        .filter(|m| !m.ends_with('*') && agent.models.allows(m))
        .collect();
    let anthropic = session
        .req_header()
        .headers
        .contains_key("anthropic-version");
    let body = if anthropic {
        serde_json::json!({
            "data": models.iter().map(|m| serde_json::json!({
                "type": "model", "id": m, "display_name": m, "created_at": "1970-01-01T00:00:00Z"
            })).collect::<Vec<_>>(),
            "has_more": false,
            "first_id": models.first(),
            "last_id": models.last(),
        })
    } else {
        serde_json::json!({
            "object": "list",
            "data": models.iter().map(|m| serde_json::json!({
                "id": m, "object": "model", "created": 0, "owned_by": "loopgate"
            })).collect::<Vec<_>>(),
        })
    };
    let extra: Vec<(&'static str, String)> = would_deny
        .map(|c| (WOULD_DENY_HEADER, c.as_str().to_string()))
        .into_iter()
        .collect();
    write_json(
        session,
        ctx,
        200,
        serde_json::to_vec(&body).unwrap_or_default(),
        &extra,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopgate_policy::{Deny, DenyCode};

    #[test]
    fn media_types_are_read_alike_whatever_their_case() {
        let with = |ct: &str| {
            let mut r = ResponseHeader::build(200, None).unwrap();
            r.insert_header("content-type", ct).unwrap();
            r
        };
        for ct in ["text/event-stream", "Text/Event-Stream; charset=utf-8"] {
            assert!(is_event_stream(&with(ct)), "{ct}");
        }
        assert!(has_media_type(
            &with("APPLICATION/JSON"),
            "application/json"
        ));
        assert!(!is_event_stream(&with("application/json")));
        assert!(!is_event_stream(&with("text/event")));
        assert!(!is_event_stream(&ResponseHeader::build(200, None).unwrap()));
    }

    #[test]
    fn json_errors_have_the_documented_shape() {
        let e = GatewayError::Denied(Deny::new(DenyCode::ModelNotAllowed, "no \"x\""));
        let v: serde_json::Value =
            serde_json::from_slice(&render_json(&e, "rid-1", false)).unwrap();
        assert_eq!(v["error"]["code"], "model_not_allowed");
        assert_eq!(v["error"]["type"], "permission_error");
        assert_eq!(v["error"]["message"], "no \"x\"");
        assert_eq!(v["error"]["request_id"], "rid-1");
        assert_eq!(v["error"]["retryable"], false);
        assert!(v["error"].get("upstream_failed").is_none());
        let t: serde_json::Value = serde_json::from_slice(&render_json(&e, "r", true)).unwrap();
        assert_eq!(t["error"]["upstream_failed"], false);
        assert_eq!(e.status(), 403);
    }

    #[test]
    fn messages_calls_get_anthropic_shaped_errors() {
        let e = GatewayError::Denied(loopgate_policy::Deny::new(
            loopgate_policy::DenyCode::RateLimited,
            "slow down",
        ));
        let v: serde_json::Value = serde_json::from_slice(&render_anthropic(&e, "rid")).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(v["error"]["code"], "rate_limited");
        assert_eq!(v["error"]["message"], "slow down");
        assert_eq!(v["error"]["request_id"], "rid");
        for (status, t) in [
            (400, "invalid_request_error"),
            (402, "billing_error"),
            (405, "invalid_request_error"),
            (502, "api_error"),
            (503, "overloaded_error"),
        ] {
            assert_eq!(anthropic_error_type(status), t);
        }
    }

    #[test]
    fn a_money_refusal_carries_its_level_and_amounts() {
        use loopgate_policy::{BudgetDetail, BudgetLevel};
        let d = Deny::new(DenyCode::BudgetExceeded, "over").with_budget(BudgetDetail {
            level: BudgetLevel::TeamMonth,
            limit: 900_000_000,
            reserve: 1_002,
        });
        let e = GatewayError::Denied(d);
        let v: serde_json::Value = serde_json::from_slice(&render_json(&e, "rid", false)).unwrap();
        assert_eq!(
            v["error"]["budget"],
            serde_json::json!({"level": "team_month", "limit_usd": 900.0, "reserved_usd": 0.001002})
        );
        assert_eq!((e.status(), e.error_type()), (402, "guard_error"));
        // Any other refusal has none.
        let e = GatewayError::Denied(Deny::new(DenyCode::BudgetExceeded, "tokens"));
        let v: serde_json::Value = serde_json::from_slice(&render_json(&e, "r", false)).unwrap();
        assert!(v["error"].get("budget").is_none());
    }

    #[test]
    fn rpc_errors_carry_the_code_and_answer_in_band_once_judged() {
        let d = Deny::new(DenyCode::ToolNotAllowed, "no").never_retryable();
        let e = GatewayError::Denied(d);
        let reply = RpcReply {
            id: serde_json::json!(3),
            batch: false,
        };
        let (status, body) = render_rpc(&e, Some(&reply), "req-1");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status, 200);
        assert_eq!(v["id"], 3);
        assert_eq!(v["error"]["code"], -32001);
        assert_eq!(v["error"]["data"]["loopgate_code"], "tool_not_allowed");
        assert_eq!(v["error"]["data"]["retryable"], false);
        // Before the body is judged: id null, the error's own status.
        let big = GatewayError::Denied(Deny::new(DenyCode::BodyTooLarge, "big"));
        let (status, body) = render_rpc(&big, None, "r");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!((status, v["id"].clone()), (413, serde_json::Value::Null));
        assert_eq!(v["jsonrpc"], "2.0");
        let batch = RpcReply {
            id: serde_json::json!("a"),
            batch: true,
        };
        let (_, body) = render_rpc(&e, Some(&batch), "r");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v[0]["id"], "a");
        let wrong = GatewayError::MethodNotAllowed {
            allow: "POST".into(),
            message: "m".into(),
        };
        let (status, body) = render_rpc(&wrong, None, "r");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (status, v["error"]["code"].clone()),
            (405, serde_json::json!(-32600))
        );
    }
}
