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
mod ctx;
mod ids;
mod respond;

pub use ctx::{Admission, RequestCtx};

use crate::config::{Config, ProviderKind};
use crate::error::GatewayError;
use crate::metrics::Metrics;
use admit::Admitted;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use ids::RequestIds;
use loopgate_policy::{Clock, StateStore, UsageScanner};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::HttpTask;
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorSource, ErrorType};
use pingora_proxy::subrequest::pipe::{pipe_subrequest, InputBody, InputBodyType};
use pingora_proxy::subrequest::{BodyMode, Ctx as SubrequestCtx};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
}

impl Gateway {
    pub fn new(
        config: Arc<ArcSwap<Config>>,
        store: Arc<dyn StateStore>,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Gateway {
            config,
            ids: RequestIds::default(),
            store,
            clock,
            metrics,
        }
    }

    async fn admit_main(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<bool, GatewayError> {
        let cfg = self.config.load_full();
        let endpoint = admit::endpoint_of(session)?;
        let agent_idx = admit::authenticate(session, &cfg)?;
        ctx.agent = Some(cfg.agents[agent_idx].name.clone());
        let state = admit::AdmitState {
            store: self.store.as_ref(),
            clock: self.clock.as_ref(),
        };
        let admitted = admit::admit(
            session,
            &cfg,
            &state,
            agent_idx,
            endpoint,
            &ctx.request_id,
            &mut ctx.linger,
        )
        .await?;
        match admitted {
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
            Admitted::Forward(admission, body, lease) => {
                if let Some(code) = admission.would_deny {
                    self.metrics.would_deny(code);
                }
                let rules = &cfg.agents[agent_idx];
                if rules.limits.tokens_per_minute.is_some() && lease.holds_window(&rules.tpm_key())
                {
                    ctx.tpm_key = Some(rules.tpm_key());
                }
                ctx.lease = Some(lease);
                ctx.admitted = Some(admission.clone());
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
        let sub_ctx = SubrequestCtx::builder()
            .body_mode(BodyMode::NoBody)
            .user_ctx(Box::new(LargeBody {
                admission,
                body,
                content_type: request_type,
            }))
            .build();
        let (prepared, handle) = spawner.create_subrequest(session.as_downstream(), sub_ctx);
        ctx.forwarded_by_subrequest = true;
        // The main request's body filters do not see piped tasks; read the
        // usage here instead, without altering what is forwarded.
        let mut scanner: Option<UsageScanner> = None;
        let wants_usage = ctx.tpm_key.is_some();
        let piped = pipe_subrequest(
            session,
            prepared,
            handle,
            |task| {
                if wants_usage {
                    match &task {
                        HttpTask::Header(resp, _) => {
                            scanner = Some(UsageScanner::for_content_type(content_type(resp)));
                        }
                        HttpTask::Body(Some(bytes), _) => {
                            if let Some(s) = scanner.as_mut() {
                                s.feed(bytes);
                            }
                        }
                        _ => {}
                    }
                }
                Ok(Some(task))
            },
            InputBodyType::Preset(InputBody::NoBody),
        )
        .await;
        ctx.usage = scanner.as_mut().and_then(UsageScanner::finish);
        match piped {
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
        }
    }
}

/// What a main request hands its large-body subrequest.
struct LargeBody {
    admission: Arc<Admission>,
    body: Bytes,
    content_type: Option<http::HeaderValue>,
}

fn admission_provider(ctx: &RequestCtx) -> String {
    ctx.admitted
        .as_ref()
        .map_or_else(|| "?".to_string(), |a| a.provider.name.clone())
}

fn content_type(resp: &ResponseHeader) -> Option<&str> {
    resp.headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
}

/// Maps a Pingora transport error to the error Loopgate answers with.
fn map_transport_error(e: &Error, provider: &str) -> GatewayError {
    use ErrorType::*;
    match e.etype() {
        ConnectTimedout | ConnectRefused | ConnectNoRoute | TLSWantX509Lookup
        | TLSHandshakeFailure | TLSHandshakeTimedout | InvalidCert | HandshakeError
        | ConnectError | BindError | SocketError | ConnectProxyFailure => {
            GatewayError::UpstreamUnreachable(format!(
                "could not connect to provider `{provider}` ({})",
                e.etype().as_str()
            ))
        }
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
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::new()
    }

    fn allow_spawning_subrequest(&self, session: &Session, _ctx: &RequestCtx) -> bool {
        // Only a main request forwards a large body; subrequests never nest.
        session.subrequest_ctx.is_none()
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
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
                if ctx.linger {
                    admit::linger(session).await;
                }
                Ok(true)
            }
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Box<HttpPeer>> {
        let Some(adm) = ctx.admitted.as_ref() else {
            // Fail closed: nothing without an admission goes upstream.
            ctx.pending_error = Some(GatewayError::Internal(
                "request reached upstream selection without admission".into(),
            ));
            return Err(Error::new(ErrorType::InternalError));
        };
        let p = &adm.provider;
        let Some(addr) = p.addr.load_full() else {
            ctx.pending_error = Some(GatewayError::UpstreamUnreachable(format!(
                "provider `{}`: host `{}` is not resolved yet",
                p.name, p.host
            )));
            return Err(Error::new(ErrorType::ConnectNoRoute));
        };
        let mut peer = HttpPeer::new(*addr, p.tls, p.host.clone());
        let o = &mut peer.options;
        o.connection_timeout = Some(p.timeouts.connect);
        o.total_connection_timeout = Some(p.timeouts.connect);
        o.read_timeout = Some(p.timeouts.read);
        o.write_timeout = Some(p.timeouts.read);
        o.idle_timeout = Some(Duration::from_secs(90));
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        req: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        let Some(adm) = ctx.admitted.as_ref() else {
            return Err(Error::explain(ErrorType::InternalError, "no admission"));
        };
        let p = &adm.provider;
        // The agent's credential never leaves the gateway.
        for h in admit::AGENT_KEY_HEADERS {
            req.remove_header(h);
        }
        // The body was already received in full (we may have sent 100 Continue).
        req.remove_header("expect");
        if let Some(key) = &p.api_key {
            match p.kind {
                ProviderKind::Anthropic => {
                    req.insert_header("x-api-key", key.expose())?;
                }
                ProviderKind::Openai | ProviderKind::OpenaiCompatible => {
                    req.insert_header("authorization", format!("Bearer {}", key.expose()))?;
                }
            }
        }
        if p.kind == ProviderKind::Anthropic && !req.headers.contains_key("anthropic-version") {
            req.insert_header("anthropic-version", p.anthropic_version.as_str())?;
        }
        if let Some((body, content_type)) = &ctx.injected_body {
            req.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?;
            req.remove_header(&http::header::TRANSFER_ENCODING);
            if let Some(ct) = content_type {
                req.insert_header(http::header::CONTENT_TYPE, ct.clone())?;
            }
        }
        req.insert_header("host", p.authority.as_str())?;
        req.insert_header(respond::REQUEST_ID_HEADER, ctx.request_id.as_str())?;
        if !p.base_path.is_empty() {
            let pq = req.uri.path_and_query().map_or("/", |pq| pq.as_str());
            let uri = format!("{}{}", p.base_path, pq)
                .parse::<http::Uri>()
                .map_err(|e| Error::because(ErrorType::InternalError, "upstream uri", e))?;
            req.set_uri(uri);
        }
        ctx.upstream_started = Some(Instant::now());
        Ok(())
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        // Large-body subrequest: it has no body of its own; send the judged
        // bytes once per attempt (called once, at end of stream, per attempt).
        if let Some((judged, _)) = &ctx.injected_body {
            if end_of_stream {
                *body = Some(judged.clone());
            }
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        if ctx.forwarded_by_subrequest {
            return Ok(());
        }
        ctx.upstream_status = Some(resp.status.as_u16());
        resp.insert_header(respond::REQUEST_ID_HEADER, ctx.request_id.as_str())?;
        if let Some(code) = ctx.admitted.as_ref().and_then(|a| a.would_deny) {
            resp.insert_header(respond::WOULD_DENY_HEADER, code.as_str())?;
        }
        if ctx.tpm_key.is_some() {
            ctx.usage_scanner = Some(UsageScanner::for_content_type(content_type(resp)));
        }
        Ok(())
    }

    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Option<Duration>> {
        if let Some(scanner) = ctx.usage_scanner.as_mut() {
            if let Some(b) = body {
                scanner.feed(b);
            }
            if end_of_stream {
                ctx.usage = scanner.finish();
                ctx.usage_scanner = None;
            }
        }
        // The per-read timeout bounds stalls; this bounds the whole exchange.
        if let (Some(adm), Some(start)) = (&ctx.admitted, ctx.upstream_started) {
            if !end_of_stream && start.elapsed() > adm.provider.timeouts.total {
                return Err(Error::explain(
                    TOTAL_TIMEOUT,
                    format!(
                        "provider `{}` exceeded its total timeout",
                        adm.provider.name
                    ),
                ));
            }
        }
        Ok(None)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let ge = ctx
            .pending_error
            .take()
            .unwrap_or_else(|| map_transport_error(e, &admission_provider(ctx)));
        let dead_client = *e.esource() == ErrorSource::Downstream
            && matches!(
                e.etype(),
                ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed
            );
        let error_code = if dead_client {
            ctx.error_code = Some(ge.code());
            0
        } else {
            respond::write_error(session, ctx, &ge).await
        };
        FailToProxy {
            error_code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        // Return what the request held on its limits, exactly once: settle
        // the token estimate with the reported usage, free the slot.
        if let Some(lease) = ctx.lease.take() {
            let now = self.clock.now();
            if let (Some(key), Some(usage)) = (&ctx.tpm_key, ctx.usage) {
                if let Err(err) = self.store.settle(now, &lease, key, usage.total()).await {
                    log::warn!("request {}: {err}", ctx.request_id);
                }
            }
            if let Err(err) = self.store.release(&lease).await {
                log::warn!("request {}: {err}", ctx.request_id);
            }
        }
        // The structured access log arrives with the observability work;
        // until then a debug line per request, never with secrets or prompts.
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let adm = ctx.admitted.as_deref();
        log::debug!(
            "request_id={} sub={} agent={} endpoint={} model={} provider={} stream={} body_bytes={} status={} error={} transport_error={} elapsed_ms={}",
            ctx.request_id,
            ctx.is_subrequest,
            ctx.agent.as_deref().unwrap_or("-"),
            adm.map_or("-", |a| a.endpoint.path()),
            adm.map_or("-", |a| a.model.as_str()),
            adm.map_or("-", |a| a.provider.name.as_str()),
            adm.is_some_and(|a| a.stream),
            adm.map_or(0, |a| a.body_len),
            status,
            ctx.error_code.unwrap_or("-"),
            e.map_or("-", |e| e.etype().as_str()),
            ctx.started.elapsed().as_millis()
        );
    }
}
