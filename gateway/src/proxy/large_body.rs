//! The large-body forwarder.
//!
//! Admission must read the whole body before choosing a peer. Pingora 0.9
//! forwards a body consumed in `request_filter` only through its retry
//! buffer, which holds 64 KiB; past that the body would silently not be
//! sent. So bodies that fit go the ordinary way (Pingora replays the
//! buffer), and larger ones are forwarded through a subrequest whose body
//! is the bytes already read and judged. The subrequest runs the same
//! hooks with the admission carried in its context ([`adopt`]), sends the
//! judged bytes on every attempt, and reports what it learned back
//! ([`report`]); its response is piped back unchanged. The split keeps the
//! common small request on the cheaper path.

use super::ctx::{Admission, RequestCtx, Role, SubReport};
use super::failure::map_transport_error;
use super::respond;
use crate::error::GatewayError;
use bytes::Bytes;
use pingora_proxy::subrequest::pipe::{pipe_subrequest, InputBody, InputBodyType};
use pingora_proxy::subrequest::{BodyMode, Ctx as SubrequestCtx};
use pingora_proxy::Session;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Bodies up to this size are replayed by Pingora's own retry buffer
/// (`BODY_BUF_LIMIT` in pingora-core); larger ones use a subrequest.
pub const RETRY_BUFFER_LIMIT: usize = 64 * 1024;

/// What a main request hands its large-body subrequest.
struct LargeBody {
    admission: Arc<Admission>,
    call: Option<super::call::Call>,
    body: Bytes,
    content_type: Option<http::HeaderValue>,
    report: Arc<Mutex<Option<SubReport>>>,
}

/// Whether this admitted body must go through a subrequest.
pub fn needed(session: &Session, adm: &Admission, body: &Bytes) -> bool {
    adm.body_read
        && (body.len() > RETRY_BUFFER_LIMIT || session.downstream_session.retry_buffer_truncated())
}

/// Forwards `body` through a subrequest (see the module docs) and takes
/// over what it reports.
pub async fn forward(
    session: &mut Session,
    ctx: &mut RequestCtx,
    admission: Arc<Admission>,
    body: Bytes,
) -> Result<(), GatewayError> {
    let spawner = session
        .subrequest_spawner
        .as_ref()
        .ok_or_else(|| GatewayError::Internal("subrequests are not available".into()))?;
    // The subrequest starts without a body (Pingora then clears its
    // framing headers) and `request_body_filter` injects the judged bytes
    // on every attempt, so fallbacks and retries resend the whole body.
    let content_type = session
        .req_header()
        .headers
        .get(http::header::CONTENT_TYPE)
        .cloned();
    let report = Arc::new(Mutex::new(None));
    let sub_ctx = SubrequestCtx::builder()
        .body_mode(BodyMode::NoBody)
        .user_ctx(Box::new(LargeBody {
            admission,
            call: ctx.call.clone(),
            body,
            content_type,
            report: report.clone(),
        }))
        .build();
    let (prepared, handle) = spawner.create_subrequest(session.as_downstream(), sub_ctx);
    ctx.role = Role::Forwarded;
    let piped = pipe_subrequest(
        session,
        prepared,
        handle,
        |task| Ok(Some(task)),
        InputBodyType::Preset(InputBody::NoBody),
    )
    .await;
    let piped = match piped {
        Ok(mut state) => {
            // Its `logging`, which reports, has run once this returns.
            if let Some(join) = state.join_handle.take() {
                let _ = join.await;
            }
            Ok(())
        }
        Err(err) => Err(err),
    };
    // What the subrequest learned belongs to this request's log and limits.
    let sub = report.lock().ok().and_then(|mut r| r.take());
    if let Some(r) = sub {
        ctx.served_by = r.served_by;
        ctx.sent_to = r.sent_to;
        ctx.fallback.from = r.fallback_from;
        ctx.upstream_status = r.upstream_status;
        ctx.ttfb = r.ttfb;
        ctx.fallback.attempts = r.attempts;
        ctx.reported_usage = r.usage;
        ctx.breaker_key = r.breaker_key;
        if ctx.error_code.is_none() {
            ctx.error_code = r.error_code;
        }
        if let Some(t) = r.upstream_time {
            ctx.upstream_first_at = Some(Instant::now() - t);
            ctx.upstream_done_at = Some(Instant::now());
        }
    }
    match piped {
        Ok(()) => Ok(()),
        Err(err) => {
            // The subrequest answers its own failures (fail_to_proxy runs
            // there); only a failure before any header needs an answer here.
            if err.state.header_received || respond::response_started(session) {
                log::debug!(
                    "request {}: large-body stream ended: {}",
                    ctx.request_id,
                    err.error
                );
                Ok(())
            } else {
                Err(map_transport_error(
                    &err.error,
                    ctx.served_by.as_deref().unwrap_or("?"),
                ))
            }
        }
    }
}

/// In a subrequest's `request_filter`: takes over the main request's
/// admission and body. `Err` for a subrequest that carries none (it is
/// refused: nothing without an admission goes upstream).
pub fn adopt(session: &Session, ctx: &mut RequestCtx) -> Result<(), GatewayError> {
    let large = session
        .subrequest_ctx
        .as_ref()
        .and_then(|s| s.user_ctx())
        .and_then(|u| u.downcast_ref::<LargeBody>())
        .ok_or_else(|| GatewayError::Internal("subrequest without admission".into()))?;
    let a = large.admission.clone();
    ctx.request_id = a.request_id.clone();
    ctx.agent = Some(a.agent.clone());
    ctx.call = large.call.clone();
    ctx.features = super::features::Features::arm(&a);
    ctx.admitted = Some(a);
    ctx.role = Role::Sub {
        body: large.body.clone(),
        content_type: large.content_type.clone(),
        report: large.report.clone(),
    };
    Ok(())
}

/// The judged body a subrequest sends on every attempt.
pub fn injected(ctx: &RequestCtx) -> Option<&Bytes> {
    match &ctx.role {
        Role::Sub { body, .. } => Some(body),
        _ => None,
    }
}

/// The content type a subrequest restores (its framing was cleared).
pub fn content_type(ctx: &RequestCtx) -> Option<&http::HeaderValue> {
    match &ctx.role {
        Role::Sub { content_type, .. } => content_type.as_ref(),
        _ => None,
    }
}

/// In a subrequest's `logging`: what it learned, for its main request.
/// `true` when this context is a subrequest (the main request logs).
pub fn report(ctx: &RequestCtx) -> bool {
    let Role::Sub { report, .. } = &ctx.role else {
        return false;
    };
    if let Ok(mut r) = report.lock() {
        *r = Some(SubReport {
            served_by: ctx.served_by.clone(),
            sent_to: ctx.sent_to.clone(),
            fallback_from: ctx.fallback.from.clone(),
            upstream_status: ctx.upstream_status,
            ttfb: ctx.ttfb,
            upstream_time: ctx.upstream_first_at.map(|t| {
                ctx.upstream_done_at
                    .unwrap_or_else(Instant::now)
                    .duration_since(t)
            }),
            attempts: ctx.fallback.attempts,
            usage: ctx.usage(),
            breaker_key: ctx.breaker_key.clone(),
            error_code: ctx.error_code,
        });
    }
    true
}
