//! The Pingora `ProxyHttp` implementation: a thin adapter that maps proxy
//! phases to Loopgate's concerns.
//!
//! - `request_filter`: admission (agent, path, body, model, route). Every
//!   denial is answered here, before any upstream contact.
//! - `upstream_peer`: the admitted provider's address and timeouts.
//! - `upstream_request_filter`: credential swap and request id.
//! - `response_filter` / body filters: request id back, total deadline.
//! - `fail_to_proxy`: transport errors mapped to Loopgate's JSON errors.
//!
//! ## Bodies larger than 64 KiB
//! Admission must read the whole body before choosing a peer. Pingora 0.9
//! forwards a body consumed in `request_filter` only through its retry
//! buffer, which holds 64 KiB; past that the body would silently not be sent.
//! So bodies that fit go the ordinary way (Pingora replays the buffer), and
//! larger ones are forwarded through a subrequest whose body is the bytes we
//! already read and judged (`InputBodyType::Preset`). The subrequest runs the
//! same hooks below with the admission carried in its context, and its
//! response is piped back unchanged. The split keeps the common small request
//! on the cheaper path.

mod admit;
mod buffers;
mod ctx;
mod guards;
mod ids;
mod mcp;
mod observe;
mod respond;
mod routing;
mod tools;

use ctx::SubReport;
pub use ctx::{Admission, RequestCtx};

use crate::access_log::AccessLog;
use crate::config::{Config, ProviderKind};
use crate::error::GatewayError;
use crate::metrics::Metrics;
use admit::Admitted;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use ctx::Attempt;
use ids::RequestIds;
use loopgate_breaker::{BreakerSet, FailureKind, FailureStreaks, Outcome, State};
use loopgate_policy::{
    replace_model, Clock, DenyCode, IdemOutcome, IdemRecord, StateStore, UsageScanner, Watchdog,
};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorSource, ErrorType};
use pingora_proxy::subrequest::pipe::{pipe_subrequest, InputBody, InputBodyType};
use pingora_proxy::subrequest::{BodyMode, Ctx as SubrequestCtx};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a pooled provider connection is kept idle.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Bodies up to this size are replayed by Pingora's own retry buffer
/// (`BODY_BUF_LIMIT` in pingora-core); larger ones use a subrequest.
const RETRY_BUFFER_LIMIT: usize = 64 * 1024;

pub struct Gateway {
    config: Arc<ArcSwap<Config>>,
    ids: RequestIds,
    /// Limit state; outlives config reloads, so counters survive them.
    store: Arc<dyn StateStore>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    /// Circuit breakers by key; like the store, they outlive reloads.
    breakers: Arc<BreakerSet>,
    access_log: Arc<AccessLog>,
    /// Per-task guard state; like the store, it outlives reloads.
    watchdog: Watchdog,
    streaks: FailureStreaks,
    /// Request bodies held while admission reads them (see `buffers`).
    bodies: Arc<buffers::BodyBuffers>,
}

impl Gateway {
    pub fn new(
        config: Arc<ArcSwap<Config>>,
        store: Arc<dyn StateStore>,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        breakers: Arc<BreakerSet>,
        access_log: Arc<AccessLog>,
    ) -> Self {
        Gateway {
            config,
            ids: RequestIds::default(),
            store,
            clock,
            metrics,
            breakers,
            access_log,
            watchdog: Watchdog::new(),
            streaks: FailureStreaks::new(),
            bodies: Arc::default(),
        }
    }

    /// Reports the current attempt as failed (once), and remembers the
    /// error to answer with if no attempt is left.
    fn fail_attempt(&self, ctx: &mut RequestCtx, kind: FailureKind, error: GatewayError) {
        if let Some(att) = ctx.attempt.take() {
            let name = &att.picked.provider.name;
            ctx.fallback_from.get_or_insert_with(|| name.clone());
            log::debug!(
                "request {}: provider `{name}` failed: {}",
                ctx.request_id,
                kind.as_str()
            );
            let recorded = self.breakers.record(
                &att.picked.key,
                att.picked.ticket,
                Outcome::Failure(kind),
                None,
                self.clock.now(),
            );
            if let Ok(Some(t)) = recorded {
                self.metrics.transition(&att.picked.key, &t);
            }
        }
        ctx.last_failure = Some(error);
    }

    /// Feeds a task's tool answer into its failure streak (tool isolation).
    fn record_tool_streak(&self, e: Option<&Error>, ctx: &RequestCtx) {
        if ctx.forwarded_by_subrequest || ctx.upstream_first_at.is_none() {
            return; // not the context that talked to the tool, or never sent
        }
        let Some((key, threshold, cooldown)) =
            ctx.admitted.as_ref().and_then(|a| a.isolation.clone())
        else {
            return;
        };
        let failure = match (ctx.upstream_status, e) {
            (Some(s), _) if s >= 400 => Some(u64::from(s)),
            (None, Some(err)) if *err.esource() != ErrorSource::Downstream => Some(1000),
            _ => None,
        };
        if self
            .streaks
            .record(&key, failure, threshold, cooldown, self.clock.now())
        {
            log::warn!("tool isolated for task `{key}`: {threshold} identical failures in a row");
        }
    }

    /// Records how an idempotent tool call ended, once, in the context that
    /// talked to the tool (the subrequest, for a large body).
    async fn finish_idempotency(&self, e: Option<&Error>, ctx: &mut RequestCtx) {
        if ctx.forwarded_by_subrequest {
            return;
        }
        let Some((key, _)) = ctx.admitted.as_ref().and_then(|a| a.idem.clone()) else {
            return;
        };
        let upstream_failed = e.is_some_and(|e| *e.esource() != ErrorSource::Downstream);
        let outcome = match ctx.idem_capture.take() {
            Some(cap) if cap.complete && !cap.truncated && !upstream_failed => {
                Some(IdemOutcome::Done(IdemRecord {
                    status: cap.status,
                    content_type: cap.content_type,
                    body: cap.body,
                }))
            }
            Some(_) => Some(IdemOutcome::Unrecorded),
            // Sent but unanswered: it may have acted. Never sent: forget it.
            None if ctx.upstream_first_at.is_some() => Some(IdemOutcome::Failed),
            None => None,
        };
        if let Err(err) = self
            .store
            .idem_finish(self.clock.now(), &key, outcome)
            .await
        {
            log::warn!("request {}: idempotency record: {err}", ctx.request_id);
        }
    }

    /// Reports the current attempt as a success (the upstream answered and,
    /// if it streamed, finished).
    fn succeed_attempt(&self, ctx: &mut RequestCtx, now: Duration) {
        if let Some(att) = ctx.attempt.take() {
            let recorded = self.breakers.record(
                &att.picked.key,
                att.picked.ticket,
                Outcome::Success,
                att.ttfb,
                now,
            );
            if let Ok(Some(t)) = recorded {
                self.metrics.transition(&att.picked.key, &t);
            }
        }
    }

    /// Whether a failed attempt may be followed by another: nothing went to
    /// the agent yet, the route's retry budget has room, and a target that
    /// was not tried has a breaker that is not open.
    fn can_fallback(&self, session: &Session, ctx: &RequestCtx) -> bool {
        let Some(adm) = ctx.admitted.as_ref() else {
            return false;
        };
        let route = &adm.route;
        if respond::response_started(session)
            || ctx.attempts >= route.max_attempts
            || ctx
                .first_attempt_at
                .is_some_and(|t| t.elapsed() >= route.max_total)
        {
            return false;
        }
        let now = self.clock.now();
        (0..route.targets.len())
            .filter(|i| !ctx.tried.contains(i))
            .any(|i| {
                let key = routing::breaker_key(&route.targets[i].provider, &adm.agent);
                !matches!(
                    self.breakers.peek(&key, now),
                    Ok(Some((State::Open, _, _))) | Err(_)
                )
            })
    }

    async fn admit_main(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<bool, GatewayError> {
        let cfg = self.config.load_full();
        // Framing first: a body whose length two readers could disagree on
        // is refused before anything else reads it.
        if let Err(e) = admit::declared_length(session.req_header()) {
            session.set_keepalive(None);
            return Err(e);
        }
        admit::check_target(session.req_header())?;
        let is_mcp = mcp::split(session.req_header().uri.path()).is_some();
        let is_tool = is_mcp || tools::split(session.req_header().uri.path()).is_some();
        let endpoint = if is_tool {
            None
        } else {
            Some(admit::endpoint_of(session)?)
        };
        let agent_idx = admit::authenticate(session, &cfg)?;
        let rules = &cfg.agents[agent_idx];
        ctx.agent = Some(rules.name.clone());
        // Bodies beyond what the agent may have in flight would only be
        // refused by its limits after they were read: they are not read.
        let share = rules.max_body_bytes.saturating_mul(
            rules
                .limits
                .max_in_flight
                .unwrap_or(buffers::DEFAULT_BODIES_PER_AGENT)
                .max(1),
        );
        ctx.intake.hold = Some(
            self.bodies
                .hold(rules.name.clone(), share, buffers::TOTAL_BYTES),
        );
        let state = admit::AdmitState {
            store: self.store.as_ref(),
            clock: self.clock.as_ref(),
            streaks: &self.streaks,
            watchdog: &self.watchdog,
            metrics: &self.metrics,
        };
        let admitted = match endpoint {
            Some(endpoint) => {
                admit::admit(
                    session,
                    &cfg,
                    &state,
                    agent_idx,
                    endpoint,
                    &ctx.request_id,
                    &mut ctx.intake,
                )
                .await?
            }
            None if is_mcp => {
                mcp::admit_mcp(
                    session,
                    &cfg,
                    &state,
                    agent_idx,
                    &ctx.request_id,
                    &mut ctx.intake,
                    &mut ctx.mcp_audit,
                )
                .await?
            }
            None => {
                tools::admit_tool(
                    session,
                    &cfg,
                    &state,
                    agent_idx,
                    &ctx.request_id,
                    &mut ctx.intake,
                )
                .await?
            }
        };
        match admitted {
            Admitted::Rpc { status, body, deny } => {
                respond::write_rpc_error(session, ctx, status, body, &deny)
                    .await
                    .map_err(|e| GatewayError::Internal(format!("cannot answer: {e}")))?;
                Ok(true)
            }
            Admitted::Replay(record) => {
                ctx.replayed = true;
                respond::write_replay(session, ctx, &record)
                    .await
                    .map_err(|e| GatewayError::Internal(format!("cannot replay: {e}")))?;
                Ok(true)
            }
            Admitted::ListModels(agent_idx, verdict) => {
                let would_deny = verdict.would_deny.map(|d| d.code);
                if let Some(code) = would_deny {
                    self.metrics.would_deny(code);
                }
                respond::write_models(session, ctx, &cfg, agent_idx, would_deny)
                    .await
                    .map_err(|e| GatewayError::Internal(format!("cannot write model list: {e}")))?;
                Ok(true)
            }
            Admitted::Forward(admission, body, taken) => {
                ctx.bytes_in = body.len();
                if let Some(code) = admission.would_deny {
                    self.metrics.would_deny(code);
                }
                ctx.settle_keys = taken.settle_keys;
                if taken.lease.degraded {
                    self.metrics.state_degraded.inc();
                }
                if let Some(code) = admission.fail_open {
                    self.metrics
                        .fail_open
                        .with_label_values(&[admission.route_name.as_ref(), code.as_str()])
                        .inc();
                }
                ctx.lease = Some(taken.lease);
                if admission.degraded_from.is_some() || admission.body_rewritten {
                    // The watchdog rewrote the model: Pingora's replay holds
                    // the agent's original body, so every attempt sends ours.
                    ctx.original_body = Some(body.clone());
                    ctx.send_original = true;
                } else if admission.route.targets.iter().any(|t| t.model.is_some()) {
                    // Targets rename the model: each attempt rewrites the judged body.
                    ctx.original_body = Some(body.clone());
                }
                ctx.admitted = Some(admission.clone());
                if !admission.body_read {
                    // A tool's body was not read: it streams through as sent.
                    return Ok(false);
                }
                if body.len() <= RETRY_BUFFER_LIMIT
                    && !session.downstream_session.retry_buffer_truncated()
                {
                    return Ok(false);
                }
                self.forward_large(session, ctx, admission, body).await?;
                Ok(true)
            }
        }
    }

    /// MCP answers: binds a new session to the agent that initialized it,
    /// and arms the list filter for `*/list` results.
    async fn mcp_response(
        &self,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        call: &mcp::McpCall,
        ct: Option<&str>,
    ) -> pingora::Result<()> {
        let ok = (200..300).contains(&resp.status.as_u16());
        if call.binds_session && ok {
            let sid = resp
                .headers
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            if let (Some(sid), Some(agent)) = (sid, ctx.agent.clone()) {
                let key = mcp::session_key(&call.server, &sid);
                let bound = self
                    .store
                    .record_swap(
                        self.clock.now(),
                        &key,
                        None,
                        agent.as_bytes().to_vec(),
                        mcp::SESSION_TTL,
                    )
                    .await;
                match bound {
                    Ok(true) => {}
                    // Already bound (a server reusing an id): the owner stays.
                    Ok(false) => log::warn!(
                        "request {}: MCP server `{}` reused a session id",
                        ctx.request_id,
                        call.server
                    ),
                    // Unbound, the session is refused later (fail closed).
                    Err(e) => log::warn!("request {}: session not bound: {e}", ctx.request_id),
                }
            }
        }
        if ok && !call.lists.is_empty() {
            if let Some(ct) = ct
                .filter(|c| c.starts_with("application/json") || c.starts_with("text/event-stream"))
            {
                ctx.mcp_rewriter = Some(mcp::ListRewriter::new(call, ct));
                // Filtering changes the length.
                resp.remove_header("content-length");
                resp.insert_header("transfer-encoding", "chunked")?;
            }
        }
        Ok(())
    }

    /// Forwards an admitted request whose body exceeds the retry buffer
    /// through a subrequest fed with the judged bytes (see module docs).
    async fn forward_large(
        &self,
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
        let request_type = session
            .req_header()
            .headers
            .get(http::header::CONTENT_TYPE)
            .cloned();
        let report = Arc::new(std::sync::Mutex::new(None));
        let sub_ctx = SubrequestCtx::builder()
            .body_mode(BodyMode::NoBody)
            .user_ctx(Box::new(LargeBody {
                admission,
                body,
                content_type: request_type,
                report: report.clone(),
            }))
            .build();
        let (prepared, handle) = spawner.create_subrequest(session.as_downstream(), sub_ctx);
        ctx.forwarded_by_subrequest = true;
        let piped = pipe_subrequest(
            session,
            prepared,
            handle,
            |task| Ok(Some(task)),
            InputBodyType::Preset(InputBody::NoBody),
        )
        .await;
        let outcome = match piped {
            Ok(mut state) => {
                if let Some(join) = state.join_handle.take() {
                    let _ = join.await;
                }
                Ok(())
            }
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
                    Err(map_transport_error(&err.error, &admission_provider(ctx)))
                }
            }
        };
        // What the subrequest learned belongs to this request's log and limits.
        let sub = report.lock().ok().and_then(|mut r| r.take());
        if let Some(r) = sub {
            ctx.served_by = r.served_by;
            ctx.fallback_from = r.fallback_from;
            ctx.upstream_status = r.upstream_status;
            ctx.ttfb = r.ttfb;
            ctx.attempts = r.attempts;
            ctx.usage = r.usage;
            ctx.breaker_key = r.breaker_key;
            if ctx.error_code.is_none() {
                ctx.error_code = r.error_code;
            }
            if let Some(t) = r.upstream_time {
                ctx.upstream_first_at = Some(Instant::now() - t);
                ctx.upstream_done_at = Some(Instant::now());
            }
        }
        outcome
    }
}

/// What a main request hands its large-body subrequest.
struct LargeBody {
    admission: Arc<Admission>,
    body: Bytes,
    content_type: Option<http::HeaderValue>,
    report: Arc<std::sync::Mutex<Option<SubReport>>>,
}

fn admission_provider(ctx: &RequestCtx) -> String {
    ctx.attempt
        .as_ref()
        .map(|a| a.picked.provider.name.to_string())
        .or_else(|| ctx.served_by.as_deref().map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

/// Seconds from a `Retry-After` header (the delay form).
fn retry_after_secs(resp: &ResponseHeader) -> Option<u64> {
    resp.headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The SSE event that ends a broken stream, in the provider's format, so an
/// agent sees an error instead of a silent cut.
fn sse_error_event(kind: Option<ProviderKind>, e: &GatewayError, request_id: &str) -> Bytes {
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

/// Largest 2xx tool body checked for `expect_json`; larger ones pass unjudged.
const JSON_CHECK_LIMIT: usize = 4 * 1024 * 1024;

/// A stream cut because it outgrew its token budget.
const BUDGET_CUT: ErrorType = ErrorType::Custom("budget_cut");

/// The gateway failed to build what it sends (an upstream request, a
/// response header): its own fault, never the provider's, so no breaker
/// counts it and no other target is tried.
const GATEWAY_FAULT: ErrorType = ErrorType::Custom("gateway_fault");

/// Turns a hook's own failure into [`GATEWAY_FAULT`], remembering the
/// answer (500 internal_error) for `fail_to_proxy`.
fn gateway_fault(ctx: &mut RequestCtx, what: &str, e: Box<Error>) -> Box<Error> {
    if e.etype() == &GATEWAY_FAULT || e.etype() == &FALLBACK || e.etype() == &UNREADABLE {
        return e;
    }
    log::warn!("request {}: could not build {what}: {e}", ctx.request_id);
    ctx.pending_error
        .get_or_insert_with(|| GatewayError::Internal(format!("could not build {what}")));
    Error::because(GATEWAY_FAULT, format!("could not build {what}"), e)
}

/// An upstream answer the gateway could not read (see
/// `upstream_response_filter`), on the last attempt: answered 502.
const UNREADABLE: ErrorType = ErrorType::Custom("unreadable_answer");

/// Whether the gateway reads this exchange's response body: usage on model
/// calls, list filtering on MCP, the JSON check and idempotency records on
/// tools. Only a plain tool call's answer passes unread.
fn needs_inspection(adm: Option<&Admission>) -> bool {
    adm.is_none_or(|a| {
        a.tool_path.is_none() || a.mcp.is_some() || a.expect_json || a.idem.is_some()
    })
}

/// Marks an upstream answer (5xx, 429) that is discarded for a fallback.
const FALLBACK: ErrorType = ErrorType::Custom("fallback");

fn content_type(resp: &ResponseHeader) -> Option<&str> {
    resp.headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
}

/// Whether a connect failure was the gateway's own: Pingora reports a local
/// socket it could not create or bind (out of descriptors, ephemeral ports,
/// buffers) as `SocketError`/`BindError`, wrapped in `InternalError` by its
/// connector. The provider was never reached, so it is not its failure.
fn local_shortage(e: &Error) -> bool {
    let local = |t: &ErrorType| matches!(t, ErrorType::SocketError | ErrorType::BindError);
    local(e.etype())
        || (e.etype() == &ErrorType::InternalError
            && e.cause
                .as_ref()
                .and_then(|c| {
                    // Boxed errors become causes boxed once more.
                    c.downcast_ref::<Box<Error>>()
                        .map(|b| &**b)
                        .or_else(|| c.downcast_ref::<Error>())
                })
                .is_some_and(|c| local(c.etype())))
}

/// Maps a Pingora transport error to the error Loopgate answers with.
fn map_transport_error(e: &Error, provider: &str) -> GatewayError {
    use ErrorType::*;
    if local_shortage(e) {
        return GatewayError::Overloaded(
            "the gateway has no free connection to the provider right now (out of local sockets); retry shortly".into(),
        );
    }
    match e.etype() {
        ConnectTimedout | ConnectRefused | ConnectNoRoute | TLSWantX509Lookup
        | TLSHandshakeFailure | TLSHandshakeTimedout | InvalidCert | HandshakeError
        | ConnectError | ConnectProxyFailure => GatewayError::UpstreamUnreachable(format!(
            "could not connect to provider `{provider}` ({})",
            e.etype().as_str()
        )),
        ReadTimedout | WriteTimedout => {
            GatewayError::UpstreamTimeout(format!("provider `{provider}` did not answer in time"))
        }
        _ => match e.esource() {
            ErrorSource::Downstream => GatewayError::BadRequest(format!(
                "request could not be read ({})",
                e.etype().as_str()
            )),
            ErrorSource::Upstream => GatewayError::UpstreamFailed(format!(
                "the exchange with provider `{provider}` failed ({})",
                e.etype().as_str()
            )),
            ErrorSource::Internal | ErrorSource::Unset => {
                GatewayError::Internal(format!("gateway error ({})", e.etype().as_str()))
            }
        },
    }
}

const TOTAL_TIMEOUT: ErrorType = ErrorType::Custom("total_timeout");

#[async_trait]
impl ProxyHttp for Gateway {
    /// Boxed: Pingora keeps the context inline in its per-request future,
    /// whose layout holds it more than once, so a held stream paid for the
    /// ~1 KB context about three times (heaptrack, benches/streams).
    type CTX = Box<RequestCtx>;

    fn new_ctx(&self) -> Box<RequestCtx> {
        Box::new(RequestCtx::new())
    }

    /// What Pingora's own error lines name the request by: method, path
    /// (clipped) and request id, never the query (tool arguments travel
    /// there) or any header.
    fn request_summary(&self, session: &Session, ctx: &Box<RequestCtx>) -> String {
        let req = session.req_header();
        format!(
            "{} {} (request {})",
            req.method,
            loopgate_policy::clip(req.uri.path(), 200),
            ctx.request_id
        )
    }

    fn allow_spawning_subrequest(&self, session: &Session, _ctx: &Box<RequestCtx>) -> bool {
        // Only a main request forwards a large body; subrequests never nest.
        session.subrequest_ctx.is_none()
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<bool> {
        if let Some(sub) = session.subrequest_ctx.as_ref() {
            // A subrequest carrying a large body the main request admitted.
            let large = sub.user_ctx().and_then(|u| u.downcast_ref::<LargeBody>());
            ctx.is_subrequest = true;
            return match large {
                Some(large) => {
                    let a = large.admission.clone();
                    ctx.request_id = a.request_id.clone();
                    ctx.agent = Some(a.agent.clone());
                    ctx.admitted = Some(a);
                    ctx.injected_body = Some((large.body.clone(), large.content_type.clone()));
                    ctx.report = Some(large.report.clone());
                    Ok(false)
                }
                None => {
                    let e = GatewayError::Internal("subrequest without admission".into());
                    respond::write_error(session, ctx, &e).await;
                    Ok(true)
                }
            };
        }
        ctx.request_id = match session
            .req_header()
            .headers
            .get(respond::REQUEST_ID_HEADER)
            .and_then(|v| RequestIds::accept(v.as_bytes()))
        {
            Some(id) => id.to_string(),
            None => self.ids.generate(),
        };
        match self.admit_main(session, ctx).await {
            Ok(answered) => Ok(answered),
            Err(e) => {
                self.metrics.denied(e.code());
                respond::write_error(session, ctx, &e).await;
                if ctx.intake.linger {
                    admit::linger(session).await;
                }
                Ok(true)
            }
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<Box<HttpPeer>> {
        let Some(adm) = ctx.admitted.clone() else {
            // Fail closed: nothing without an admission goes upstream.
            ctx.pending_error = Some(GatewayError::Internal(
                "request reached upstream selection without admission".into(),
            ));
            return Err(Error::new(ErrorType::InternalError));
        };
        let route = &adm.route;
        let now = self.clock.now();
        // One reading of the monotonic clock serves the whole attempt.
        let started = Instant::now();
        let first_at = *ctx.first_attempt_at.get_or_insert(started);
        let picked = if let Some(i) = ctx.retry_same.take() {
            // A pooled connection had gone stale: the same target again on a
            // fresh connection; not a new attempt.
            let provider = route.targets[i].provider.clone();
            let key = routing::breaker_key(&provider, &adm.agent);
            match self.breakers.acquire(&key, &provider.breaker, now) {
                Ok((Ok(ticket), _)) => routing::Picked {
                    target: i,
                    provider,
                    key,
                    ticket,
                },
                Ok((Err(rejected), _)) => {
                    ctx.pending_error = Some(GatewayError::CircuitOpen {
                        provider: provider.name.to_string(),
                        retry_after: rejected.retry_after,
                    });
                    return Err(Error::new(ErrorType::Custom("circuit_open")));
                }
                Err(_) => {
                    ctx.pending_error = Some(GatewayError::BreakerUnavailable);
                    return Err(Error::new(ErrorType::InternalError));
                }
            }
        } else {
            if ctx.attempts >= route.max_attempts
                || (ctx.attempts > 0 && started.duration_since(first_at) >= route.max_total)
            {
                ctx.pending_error = ctx.last_failure.take();
                return Err(Error::new(ErrorType::Custom("retry_budget_exhausted")));
            }
            let mut transitions = Vec::new();
            let choice = routing::choose(
                &self.breakers,
                route,
                &adm.agent,
                &ctx.tried,
                now,
                &mut transitions,
            );
            for (key, t) in &transitions {
                self.metrics.transition(key, t);
            }
            match choice {
                Ok(routing::Choice::Go(p)) => p,
                Ok(routing::Choice::AllOpen {
                    retry_after,
                    provider,
                }) => {
                    // The log says which breaker refused: the first target's.
                    ctx.breaker_key = route
                        .targets
                        .first()
                        .map(|t| routing::breaker_key(&t.provider, &adm.agent));
                    // After a real failure, that failure is the better answer.
                    ctx.pending_error = Some(ctx.last_failure.take().unwrap_or(
                        GatewayError::CircuitOpen {
                            provider,
                            retry_after,
                        },
                    ));
                    return Err(Error::new(ErrorType::Custom("circuit_open")));
                }
                Ok(routing::Choice::Exhausted) => {
                    ctx.pending_error = ctx.last_failure.take();
                    return Err(Error::new(ErrorType::Custom("no_target_left")));
                }
                Err(_) => {
                    ctx.pending_error = Some(GatewayError::BreakerUnavailable);
                    return Err(Error::new(ErrorType::InternalError));
                }
            }
        };
        if !ctx.tried.contains(&picked.target) {
            ctx.tried.push(picked.target);
            ctx.attempts += 1;
            if ctx.attempts > 1 {
                self.metrics
                    .retries
                    .with_label_values(&[&picked.provider.name])
                    .inc();
            }
        }
        if picked.ticket.probe {
            self.metrics
                .half_open_probes
                .with_label_values(&[&picked.key])
                .inc();
        }
        ctx.breaker_key = Some(picked.key.clone());
        let p = picked.provider.clone();
        let Some(addr) = p.addr.load_full() else {
            self.breakers.abandon(&picked.key, picked.ticket);
            ctx.pending_error = Some(GatewayError::UpstreamUnreachable(format!(
                "provider `{}`: host `{}` is not resolved yet",
                p.name, p.host
            )));
            return Err(Error::new(ErrorType::ConnectNoRoute));
        };
        // The body this attempt sends: renamed for this target, or the
        // judged body of a large-body subrequest, or Pingora's own replay.
        let base = ctx
            .injected_body
            .as_ref()
            .map(|(b, _)| b.clone())
            .or_else(|| ctx.original_body.clone());
        ctx.attempt_body = match (&route.targets[picked.target].model, base) {
            (Some(model), Some(base)) => match replace_model(&base, model) {
                Some(renamed) => Some(Bytes::from(renamed)),
                None => Some(base),
            },
            (None, base) if ctx.injected_body.is_some() || ctx.send_original => base,
            _ => None,
        };
        // SNI only matters for TLS; a plain peer takes no copy of the host.
        let sni = if p.tls { p.host.clone() } else { String::new() };
        let mut peer = HttpPeer::new(*addr, p.tls, sni);
        let o = &mut peer.options;
        o.connection_timeout = Some(p.timeouts.connect);
        o.total_connection_timeout = Some(p.timeouts.connect);
        o.read_timeout = Some(p.timeouts.read);
        o.write_timeout = Some(p.timeouts.read);
        // Kept although it arms one more timer on every release to the pool
        // (~1.4k instructions a request, callgrind): Pingora's pool notices a
        // provider's FIN or RST on an idle connection, but not a NAT or load
        // balancer that silently forgot it. Reusing such a connection hangs
        // until the read timeout; never reusing one idle this long avoids it.
        o.idle_timeout = Some(POOL_IDLE_TIMEOUT);
        ctx.attempt = Some(Attempt {
            picked,
            started,
            ttfb: None,
        });
        Ok(Box::new(peer))
    }

    fn fail_to_connect(
        &self,
        session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Box<RequestCtx>,
        mut e: Box<Error>,
    ) -> Box<Error> {
        let ge = map_transport_error(&e, &admission_provider(ctx));
        if let GatewayError::Overloaded(_) = ge {
            // No provider was reached: its breaker must not count this, and
            // another target would meet the same shortage.
            if let Some(att) = ctx.attempt.take() {
                self.breakers.abandon(&att.picked.key, att.picked.ticket);
            }
            // At most one line a second: a shortage hits every request.
            static LOGGED_AT: AtomicU64 = AtomicU64::new(u64::MAX);
            let second = self.clock.now().as_secs();
            if LOGGED_AT.swap(second, Ordering::Relaxed) != second {
                log::warn!(
                    "request {}: no local socket for the upstream connection \
                     (answered 503 gateway_overloaded): {e}",
                    ctx.request_id
                );
            }
            ctx.last_failure = Some(ge);
            e.set_retry(false);
            return e;
        }
        self.fail_attempt(ctx, FailureKind::Connect, ge);
        e.set_retry(self.can_fallback(session, ctx));
        e
    }

    fn error_while_proxy(
        &self,
        _peer: &HttpPeer,
        session: &mut Session,
        mut e: Box<Error>,
        ctx: &mut Box<RequestCtx>,
        client_reused: bool,
    ) -> Box<Error> {
        if e.etype() == &FALLBACK {
            // upstream_response_filter already judged and recorded it.
            e.set_retry(true);
            return e;
        }
        if e.etype() == &GATEWAY_FAULT {
            // Ours: the provider is not blamed, the attempt is not counted.
            if let Some(att) = ctx.attempt.take() {
                self.breakers.abandon(&att.picked.key, att.picked.ticket);
            }
            e.set_retry(false);
            return e;
        }
        if e.etype() == &UNREADABLE {
            // Recorded as the provider's failure in upstream_response_filter.
            e.set_retry(false);
            return e;
        }
        if e.etype() == &BUDGET_CUT {
            // Our decision, not the provider's failure.
            self.succeed_attempt(ctx, self.clock.now());
            e.set_retry(false);
            return e;
        }
        let started = respond::response_started(session);
        if *e.esource() == ErrorSource::Downstream {
            // The agent went away or broke its side: not the provider's fault.
            if started {
                self.succeed_attempt(ctx, self.clock.now());
            } else if let Some(att) = ctx.attempt.take() {
                self.breakers.abandon(&att.picked.key, att.picked.ticket);
            }
            e.set_retry(false);
            return e;
        }
        let stale = client_reused
            && !started
            && ctx.stale_retries < 2
            && matches!(
                e.etype(),
                ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError
            );
        if stale {
            // The provider had closed a pooled connection: same target on a
            // fresh one, not counted as a failure.
            if let Some(att) = ctx.attempt.take() {
                self.breakers.abandon(&att.picked.key, att.picked.ticket);
                ctx.retry_same = Some(att.picked.target);
            }
            ctx.stale_retries += 1;
            e.set_retry(true);
            return e;
        }
        let timeout = matches!(
            e.etype(),
            ErrorType::ReadTimedout | ErrorType::WriteTimedout
        ) || e.etype() == &TOTAL_TIMEOUT;
        let kind = if timeout {
            FailureKind::Timeout
        } else if started {
            FailureKind::StreamBroken
        } else {
            FailureKind::ServerError
        };
        let ge = map_transport_error(&e, &admission_provider(ctx));
        self.fail_attempt(ctx, kind, ge);
        e.set_retry(!started && self.can_fallback(session, ctx));
        e
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        req: &mut RequestHeader,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        let done = async {
            let Some(att) = ctx.attempt.as_ref() else {
                return Err(Error::explain(ErrorType::InternalError, "no attempt"));
            };
            let p = att.picked.provider.clone();
            // The agent's credential never leaves the gateway.
            for h in &admit::AGENT_KEY_HEADERS {
                req.remove_header(h);
            }
            // Nor do headers that re-scope the gateway's credential or speak for
            // the gateway (see `SCOPING_HEADERS`): one pass over the names, as
            // an agent usually sends none of them.
            let allowed = ctx
                .admitted
                .as_ref()
                .map_or(&[][..], |a| a.forward_headers.as_slice());
            let strip: Vec<http::HeaderName> = req
                .headers
                .keys()
                .filter(|h| {
                    let n = h.as_str();
                    crate::config::runtime::NEVER_FORWARDED.contains(&n)
                        || (crate::config::runtime::SCOPING_HEADERS.contains(&n)
                            && !allowed.contains(h))
                })
                .cloned()
                .collect();
            for h in &strip {
                req.remove_header(h);
            }
            let tool_path = ctx.admitted.as_ref().and_then(|a| a.tool_path.clone());
            if ctx.admitted.as_ref().is_some_and(|a| a.body_read) {
                // The body was already received in full (we may have sent 100 Continue).
                req.remove_header(&http::header::EXPECT);
            }
            p.authorize(req)?;
            // A body we send ourselves needs framing that matches it exactly.
            if let Some(body) = &ctx.attempt_body {
                req.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?;
                req.remove_header(&http::header::TRANSFER_ENCODING);
            }
            if let Some((_, Some(ct))) = &ctx.injected_body {
                req.insert_header(http::header::CONTENT_TYPE, ct.clone())?;
            }
            req.insert_header("host", p.authority_value.clone())?;
            // The gateway reads answers (usage, MCP lists, tool records): ask for
            // them unencoded rather than pass through what it cannot inspect.
            req.insert_header(http::header::ACCEPT_ENCODING, "identity")?;
            req.insert_header(respond::REQUEST_ID_HEADER, ctx.request_id.as_str())?;
            if let Some(tp) = tool_path {
                let uri = format!("{}{}", p.base_path, tp)
                    .parse::<http::Uri>()
                    .map_err(|e| Error::because(ErrorType::InternalError, "tool uri", e))?;
                req.set_uri(uri);
            } else if !p.base_path.is_empty() {
                let pq = req.uri.path_and_query().map_or("/", |pq| pq.as_str());
                let uri = format!("{}{}", p.base_path, pq)
                    .parse::<http::Uri>()
                    .map_err(|e| Error::because(ErrorType::InternalError, "upstream uri", e))?;
                req.set_uri(uri);
            }
            let now = Instant::now();
            ctx.upstream_started = Some(now);
            ctx.upstream_first_at.get_or_insert(now);
            Ok(())
        }
        .await;
        done.map_err(|e| gateway_fault(ctx, "the upstream request", e))
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        // Our body for this attempt (renamed model, or the large-body
        // subrequest's judged bytes) replaces what Pingora replays. The
        // request body was read in full before, so the whole replay arrives
        // in the call that ends the stream.
        if let Some(ours) = &ctx.attempt_body {
            *body = Some(if end_of_stream {
                ours.clone()
            } else {
                Bytes::new()
            });
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        let status = resp.status.as_u16();
        let Some(att) = ctx.attempt.as_mut() else {
            return Ok(());
        };
        let provider = att.picked.provider.clone();
        // What the gateway could not read must not pass as if judged: a
        // switch of protocols nobody asked for (agents' upgrades are refused
        // at admission), or a body encoding it cannot inspect (it asked for
        // `identity`) on an answer whose body it judges.
        let unreadable = if status == 101 {
            Some("switched protocols unasked".to_string())
        } else if status >= 200 && needs_inspection(ctx.admitted.as_deref()) {
            resp.headers
                .get(http::header::CONTENT_ENCODING)
                .filter(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
                .map(|v| {
                    format!(
                        "answered with Content-Encoding `{}`, which the gateway cannot inspect",
                        loopgate_policy::clip(&String::from_utf8_lossy(v.as_bytes()), 40)
                    )
                })
        } else {
            None
        };
        if let Some(why) = unreadable {
            self.fail_attempt(
                ctx,
                FailureKind::ServerError,
                GatewayError::UpstreamFailed(format!("provider `{}` {why}", provider.name)),
            );
            if self.can_fallback(session, ctx) {
                return Err(Error::explain(FALLBACK, "unreadable answer; falling back"));
            }
            ctx.pending_error = ctx.last_failure.take();
            return Err(Error::explain(UNREADABLE, why));
        }
        let Some(att) = ctx.attempt.as_mut() else {
            return Ok(());
        };
        if status < 200 {
            return Ok(());
        }
        att.ttfb = Some(att.started.elapsed());
        let ttfb = att.ttfb;
        let key = att.picked.key.clone();
        let failure = match status {
            429 => Some(FailureKind::RateLimited),
            500..=599 => Some(FailureKind::ServerError),
            _ => None,
        };
        if let Some(kind) = failure {
            self.fail_attempt(
                ctx,
                kind,
                GatewayError::UpstreamFailed(format!(
                    "provider `{}` answered {status}",
                    provider.name
                )),
            );
            if let Some(secs) = retry_after_secs(resp).filter(|_| status == 429) {
                // The provider said when to come back: out of rotation till then.
                let hold = Duration::from_secs(secs).min(provider.breaker.max_open_for);
                let reason = format!("provider answered 429 with Retry-After: {secs}");
                if let Ok(Some(t)) = self.breakers.hold_open(
                    &key,
                    &provider.breaker,
                    self.clock.now(),
                    hold,
                    &reason,
                ) {
                    self.metrics.transition(&key, &t);
                }
            }
            if self.can_fallback(session, ctx) {
                return Err(Error::explain(
                    FALLBACK,
                    format!(
                        "provider `{}` answered {status}; falling back",
                        provider.name
                    ),
                ));
            }
            // The last attempt: the provider's own answer goes through unchanged.
            // (Its failure was recorded above; re-arm nothing.)
        }
        // An MCP server may answer with an SSE stream: JSON-RPC events, not
        // one JSON body.
        let sse = content_type(resp).is_some_and(|c| c.starts_with("text/event-stream"));
        let mcp = ctx.admitted.as_ref().is_some_and(|a| a.mcp.is_some());
        if (200..300).contains(&status)
            && ctx.admitted.as_ref().is_some_and(|a| a.expect_json)
            && !(mcp && (sse || status == 202))
        {
            ctx.json_check = Some(Vec::new());
        }
        ctx.served_by = Some(provider.name.clone());
        ctx.served_kind = Some(provider.kind);
        ctx.ttfb = ttfb;
        ctx.breaker_key = Some(key);
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        let done = async {
            if ctx.forwarded_by_subrequest {
                return Ok(());
            }
            ctx.upstream_status = Some(resp.status.as_u16());
            // Only the gateway speaks in `x-loopgate-*`: an upstream cannot
            // forge one of its decisions.
            let forged: Vec<http::HeaderName> = resp
                .headers
                .keys()
                .filter(|h| h.as_str().starts_with("x-loopgate-"))
                .cloned()
                .collect();
            for h in &forged {
                resp.remove_header(h);
            }
            resp.insert_header(respond::REQUEST_ID_HEADER, ctx.request_id.as_str())?;
            if let Some(p) = &ctx.served_by {
                // The attempt that answered carries its provider's prebuilt value;
                // a last attempt that failed (5xx, 429) was already settled, so
                // then the name is copied in.
                match &ctx.attempt {
                    Some(att) => resp.insert_header(
                        respond::PROVIDER_HEADER,
                        att.picked.provider.name_value.clone(),
                    )?,
                    None => resp.insert_header(respond::PROVIDER_HEADER, p.as_ref())?,
                }
                if let Some(from) = ctx.fallback_from.as_ref().filter(|f| *f != p) {
                    resp.insert_header(respond::FALLBACK_HEADER, from.as_ref())?;
                }
            }
            if let Some(adm) = ctx.admitted.as_ref() {
                if let Some(code) = adm.would_deny {
                    resp.insert_header(respond::WOULD_DENY_HEADER, code.as_str())?;
                }
                if let Some(code) = adm.fail_open {
                    resp.insert_header(respond::FAIL_OPEN_HEADER, code.as_str())?;
                }
                if let Some(g) = adm.guard {
                    resp.insert_header(respond::GUARD_HEADER, g)?;
                }
                if let Some(from) = &adm.degraded_from {
                    resp.insert_header(respond::DEGRADED_HEADER, format!("{from}->{}", adm.model))?;
                }
            }
            if ctx.lease.as_ref().is_some_and(|l| l.degraded) {
                // Admitted on this instance's share of the limits: Redis was away.
                resp.append_header(respond::DEGRADED_HEADER, "state")?;
            }
            // Usage feeds token metrics and limit settlement; read it as it passes.
            let ct = content_type(resp);
            if ct.is_some_and(|c| c.starts_with("text/event-stream")) {
                ctx.streaming = true;
                self.metrics.active_streams.inc();
            }
            if ctx.admitted.as_ref().is_some_and(|a| a.tool_path.is_none()) {
                ctx.usage_scanner = Some(UsageScanner::for_content_type(ct));
            }
            if ctx.admitted.as_ref().is_some_and(|a| a.idem.is_some()) {
                ctx.idem_capture = Some(ctx::IdemCapture {
                    status: resp.status.as_u16(),
                    content_type: ct.map(str::to_string),
                    ..Default::default()
                });
            }
            if let Some(call) = ctx.admitted.as_ref().and_then(|a| a.mcp.clone()) {
                // Owned: the header map is changed while it is used.
                let ct = ct.map(str::to_string);
                self.mcp_response(resp, ctx, &call, ct.as_deref()).await?;
            }
            Ok(())
        }
        .await;
        done.map_err(|e| gateway_fault(ctx, "the response header", e))
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<Option<Duration>> {
        if let Some(rw) = ctx.mcp_rewriter.as_mut() {
            let chunk = body.take().unwrap_or_default();
            match rw.feed(&chunk, end_of_stream) {
                Ok(out) => *body = (!out.is_empty()).then_some(out),
                Err(why) => {
                    log::warn!("request {}: {why}; answer cut", ctx.request_id);
                    return Err(Error::explain(UNREADABLE, why));
                }
            }
        }
        Ok(None)
    }

    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<Option<Duration>> {
        if let Some(scanner) = ctx.usage_scanner.as_mut() {
            if let Some(b) = body {
                scanner.feed(b);
            }
            // A stream that outgrows its task's budget is cut here, with a
            // proper error event (fail_to_proxy); the overshoot is at most
            // one upstream read.
            let room = ctx.admitted.as_ref().and_then(|a| a.budget_room);
            if let Some(room) = room.filter(|r| !end_of_stream && scanner.events() > *r) {
                let produced = scanner.events();
                let adm = ctx.admitted.clone();
                let agent = adm.as_ref().map_or("-", |a| a.agent.as_ref());
                log::warn!(
                    "request {}: stream cut after ~{produced} tokens: budget room was {room}",
                    ctx.request_id
                );
                self.metrics.budget_cuts.with_label_values(&[agent]).inc();
                ctx.pending_error = Some(GatewayError::Denied(
                    loopgate_policy::Deny::new(
                        DenyCode::BudgetExceeded,
                        format!(
                            "stream cut after about {produced} tokens: the token budget had room for {room}"
                        ),
                    )
                    .never_retryable(),
                ));
                ctx.usage = Some(loopgate_policy::Usage {
                    input_tokens: 0,
                    output_tokens: produced,
                });
                ctx.usage_scanner = None;
                return Err(Error::explain(
                    BUDGET_CUT,
                    "token budget exhausted mid-stream",
                ));
            }
            if end_of_stream {
                ctx.usage = scanner.finish();
                ctx.usage_scanner = None;
            }
        }
        if let (Some(buf), Some(b)) = (ctx.json_check.as_mut(), body.as_ref()) {
            if buf.len() + b.len() > JSON_CHECK_LIMIT {
                ctx.json_check = None;
            } else {
                buf.extend_from_slice(b);
            }
        }
        if let (Some(cap), Some(max)) = (
            ctx.idem_capture.as_mut(),
            ctx.admitted
                .as_ref()
                .and_then(|a| a.idem.as_ref())
                .map(|(_, m)| *m),
        ) {
            if let Some(b) = body {
                if cap.body.len() + b.len() > max {
                    cap.truncated = true;
                    cap.body = Vec::new();
                } else if !cap.truncated {
                    cap.body.extend_from_slice(b);
                }
            }
            cap.complete = end_of_stream;
        }
        if end_of_stream {
            ctx.upstream_done_at = Some(Instant::now());
        }
        // The per-read timeout bounds stalls; this bounds the whole exchange.
        if let (Some(att), Some(start)) = (&ctx.attempt, ctx.upstream_started) {
            let provider = &att.picked.provider;
            if !end_of_stream && start.elapsed() > provider.timeouts.total {
                return Err(Error::explain(
                    TOTAL_TIMEOUT,
                    format!("provider `{}` exceeded its total timeout", provider.name),
                ));
            }
        }
        Ok(None)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Box<RequestCtx>,
    ) -> FailToProxy {
        let ge = ctx
            .pending_error
            .take()
            .or_else(|| ctx.last_failure.take())
            .unwrap_or_else(|| map_transport_error(e, &admission_provider(ctx)));
        let dead_client = *e.esource() == ErrorSource::Downstream
            && matches!(
                e.etype(),
                ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed
            );
        let error_code = if dead_client {
            ctx.error_code = Some(ge.code());
            0
        } else if respond::response_started(session) {
            // Mid-stream: end an event stream with an error event in the
            // provider's format rather than a silent cut.
            ctx.error_code = Some(ge.code());
            let sse = session
                .response_written()
                .and_then(|r| r.headers.get(http::header::CONTENT_TYPE))
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
            if sse {
                let event = sse_error_event(ctx.served_kind, &ge, &ctx.request_id);
                if let Err(err) = session.write_response_body(Some(event), true).await {
                    log::debug!("request {}: cannot end the stream: {err}", ctx.request_id);
                }
            }
            0
        } else {
            self.metrics.denied(ge.code());
            respond::write_error(session, ctx, &ge).await
        };
        FailToProxy {
            error_code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Box<RequestCtx>) {
        // One reading of the state clock for the breaker, the limits and
        // the log line.
        let now = self.clock.now();
        // An attempt still open here ended without a failure hook: the
        // exchange completed (or the agent left after it started).
        if ctx.attempt.is_some() {
            let unusable = ctx
                .json_check
                .take()
                .is_some_and(|b| serde_json::from_slice::<serde::de::IgnoredAny>(&b).is_err());
            match e {
                // "200 but unusable": a tool that must answer JSON did not.
                None if unusable => self.fail_attempt(
                    ctx,
                    FailureKind::ServerError,
                    GatewayError::UpstreamFailed(
                        "the tool answered 2xx with a body that is not JSON".into(),
                    ),
                ),
                None => self.succeed_attempt(ctx, now),
                Some(err) if *err.esource() == ErrorSource::Downstream => {
                    self.succeed_attempt(ctx, now)
                }
                Some(_) => self.fail_attempt(
                    ctx,
                    FailureKind::StreamBroken,
                    GatewayError::UpstreamFailed("stream ended abnormally".into()),
                ),
            }
        }
        // Return what the request held on its limits, exactly once: settle
        // the token estimate with the reported usage, free the slot.
        // One store call (one round trip on Redis) for both.
        if let Some(lease) = ctx.lease.take() {
            let settle: Vec<(&str, u64)> = match ctx.usage {
                Some(usage) => ctx
                    .settle_keys
                    .iter()
                    .map(|k| (&**k, usage.total()))
                    .collect(),
                None => Vec::new(),
            };
            if let Err(err) = self.store.finish(now, &lease, &settle).await {
                log::warn!("request {}: {err}", ctx.request_id);
            }
        }
        if ctx.streaming {
            self.metrics.active_streams.dec();
        }
        self.finish_idempotency(e, ctx).await;
        self.record_tool_streak(e, ctx);
        if ctx.is_subrequest {
            // The main request logs this exchange once, with what we learned.
            if let Some(slot) = &ctx.report {
                if let Ok(mut r) = slot.lock() {
                    *r = Some(SubReport {
                        served_by: ctx.served_by.clone(),
                        fallback_from: ctx.fallback_from.clone(),
                        upstream_status: ctx.upstream_status,
                        ttfb: ctx.ttfb,
                        upstream_time: ctx.upstream_first_at.map(|t| {
                            ctx.upstream_done_at
                                .unwrap_or_else(Instant::now)
                                .duration_since(t)
                        }),
                        attempts: ctx.attempts,
                        usage: ctx.usage,
                        breaker_key: ctx.breaker_key.clone(),
                        error_code: ctx.error_code,
                    });
                }
            }
            return;
        }
        if let Some(key) = ctx.admitted.as_ref().and_then(|a| a.task_key.as_deref()) {
            self.watchdog.latency(key, ctx.started.elapsed());
        }
        observe::record(self, session, e, ctx, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_socket_shortages_are_told_from_provider_failures() {
        let emfile = || std::io::Error::from_raw_os_error(24);
        // As Pingora's connector reports a socket it could not create.
        let socket = Error::because(ErrorType::SocketError, "failed to create socket", emfile());
        let wrapped = Error::because(ErrorType::InternalError, "Fail to connect to x", socket);
        assert!(local_shortage(&wrapped));
        // Out of ephemeral ports.
        let ports = Error::because(ErrorType::BindError, "Fail to connect to x", emfile());
        assert!(local_shortage(&ports));
        // The provider's side: refused, timed out, unreachable.
        for t in [
            ErrorType::ConnectRefused,
            ErrorType::ConnectTimedout,
            ErrorType::ConnectNoRoute,
            ErrorType::ConnectError,
        ] {
            assert!(!local_shortage(&Error::new(t)));
        }
        // Some other internal error is not a socket shortage.
        let other = Error::because(
            ErrorType::InternalError,
            "x",
            Error::new(ErrorType::ConnectError),
        );
        assert!(!local_shortage(&other));
        assert!(!local_shortage(&Error::new(ErrorType::InternalError)));
        // The mapping every hook answers with follows the same line.
        assert_eq!(
            map_transport_error(&wrapped, "p").code(),
            "gateway_overloaded"
        );
        assert_eq!(
            map_transport_error(&ports, "p").code(),
            "gateway_overloaded"
        );
        let refused = Error::new(ErrorType::ConnectRefused);
        assert_eq!(
            map_transport_error(&refused, "p").code(),
            "upstream_unreachable"
        );
    }
}
