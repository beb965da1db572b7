//! Responses Loopgate writes itself: its JSON errors and the model list.

use super::ctx::RequestCtx;
use crate::config::Config;
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
pub const DEGRADED_HEADER: &str = "x-loopgate-degraded";
/// Forwarded under `fail_mode: open`: why the gateway could not decide.
pub const FAIL_OPEN_HEADER: &str = "x-loopgate-fail-open";

/// Writes `e` as Loopgate's JSON error. Returns the status written, or 0 when
/// nothing could be written (a response had already started, or the client
/// is gone).
pub async fn write_error(session: &mut Session, ctx: &mut RequestCtx, e: &GatewayError) -> u16 {
    ctx.error_code = Some(e.code());
    if response_started(session) {
        return 0;
    }
    let status = e.status();
    let mut extra: Vec<(&'static str, String)> = vec![(ERROR_HEADER, e.code().to_string())];
    if let Some(secs) = e.retry_after_secs() {
        extra.push(("retry-after", secs.to_string()));
    }
    if let Some(code) = e.deny_code() {
        if code == loopgate_policy::DenyCode::MethodNotAllowed {
            if let Some(ep) = loopgate_policy::Endpoint::from_path(session.req_header().uri.path())
            {
                extra.push(("allow", ep.method().to_string()));
            }
        }
    }
    let tool_call = super::tools::split(session.req_header().uri.path()).is_some();
    let body = e.body_for(&ctx.request_id, tool_call);
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

/// Answers an MCP message with the gateway's JSON-RPC error.
pub async fn write_rpc_error(
    session: &mut Session,
    ctx: &mut RequestCtx,
    status: u16,
    body: Vec<u8>,
    deny: &loopgate_policy::Deny,
) -> pingora::Result<()> {
    ctx.error_code = Some(deny.code.as_str());
    let mut extra: Vec<(&'static str, String)> = vec![(ERROR_HEADER, deny.code.as_str().into())];
    if let Some(after) = deny.retry_after {
        extra.push(("retry-after", after.as_secs().max(1).to_string()));
    }
    write_json(session, ctx, status, body, &extra).await
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
