//! The Pingora `ProxyHttp` implementation. The hooks only dispatch; what
//! happens lives by feature, not by phase:
//!
//! - `call`: what the request is (model, tool, MCP), decided once;
//! - `request`: `request_filter`'s work: framing, classifying, admission,
//!   then answering (model list, replay), forwarding, or the subrequest
//!   forwarder (`large_body`: bodies past Pingora's 64 KiB replay buffer,
//!   and answers held whole for their cost header);
//! - `admit`: the one admission pipeline, with `model`, `tools` and `mcp`
//!   judging their kind, `guards` the task guards;
//! - `upstream` and `attempt`: peer choice, the request as the upstream
//!   sees it, what each answer or failure means, the fallback policy;
//! - `features`: the exchange features (usage and the budget cut, the JSON
//!   check, idempotency records, MCP sessions and list filtering, tool
//!   streaks, task latency), each owning its per-request state;
//! - `header_names`: header names read one way in both directions (`_`
//!   spellings of the gateway's headers refused or removed);
//! - `respond`: everything the gateway writes itself, one renderer per
//!   wire format; `observe`: metrics and the access-log line.

mod admit;
mod attempt;
pub(crate) mod buffers;
mod call;
mod ctx;
mod env;
mod failure;
mod features;
mod guards;
mod header_names;
mod ids;
mod large_body;
mod mcp;
mod model;
mod observe;
mod request;
mod respond;
mod routing;
mod test_fault;
mod tools;
mod upstream;

pub use ctx::RequestCtx;

use crate::access_log::AccessLog;
use crate::config::Config;
use crate::metrics::Metrics;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use env::Env;
use features::End;
use ids::RequestIds;
use loopgate_breaker::BreakerSet;
use loopgate_policy::{Clock, StateStore};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::upstreams::peer::HttpPeer;
use pingora::Error;
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Gateway {
    config: Arc<ArcSwap<Config>>,
    ids: RequestIds,
    /// Limit and task guard state; outlives config reloads, so counters
    /// survive them.
    store: Arc<dyn StateStore>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    /// Circuit breakers by key; like the store, they outlive reloads.
    breakers: Arc<BreakerSet>,
    access_log: Arc<AccessLog>,
    /// Request bodies held while admission reads them (see `buffers`).
    bodies: Arc<buffers::BodyBuffers>,
    /// Open tasks under a money budget, for `/admin/spend`.
    spend: Arc<crate::spend::SpendBook>,
    /// Tests only: a gateway failure on purpose after routing (see
    /// `test_fault`); `None` unless `LOOPGATE_TEST_FAULT` is set.
    test_fault: Option<test_fault::TestFault>,
}

impl Gateway {
    pub fn new(
        config: Arc<ArcSwap<Config>>,
        store: Arc<dyn StateStore>,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        breakers: Arc<BreakerSet>,
        access_log: Arc<AccessLog>,
        spend: Arc<crate::spend::SpendBook>,
    ) -> Self {
        Gateway {
            config,
            ids: RequestIds::default(),
            store,
            clock,
            metrics,
            breakers,
            access_log,
            bodies: Arc::default(),
            spend,
            test_fault: test_fault::TestFault::from_env(),
        }
    }

    /// The shared state admission and the features consult.
    fn env(&self) -> Env<'_> {
        Env {
            store: self.store.as_ref(),
            clock: self.clock.as_ref(),
            metrics: &self.metrics,
            breakers: &self.breakers,
        }
    }
}

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
        let path = loopgate_policy::clip(req.uri.path(), 200);
        format!("{} {path} (request {})", req.method, ctx.request_id)
    }

    /// An MCP stream ended by its idle limit is no failure: Pingora's
    /// error line would say it was.
    fn suppress_error_log(&self, _session: &Session, ctx: &Box<RequestCtx>, _e: &Error) -> bool {
        ctx.features
            .mcp_stream
            .as_ref()
            .is_some_and(|s| s.idle_ended())
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
        Ok(self.take_request(session, ctx).await)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<Box<HttpPeer>> {
        self.next_peer(ctx)
    }

    fn fail_to_connect(
        &self,
        session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Box<RequestCtx>,
        e: Box<Error>,
    ) -> Box<Error> {
        self.connect_failed(session, ctx, e)
    }

    fn error_while_proxy(
        &self,
        _peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut Box<RequestCtx>,
        client_reused: bool,
    ) -> Box<Error> {
        self.proxy_failed(session, ctx, e, client_reused)
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        req: &mut RequestHeader,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        let done = match &self.test_fault {
            Some(f) => f
                .check(ctx.admitted.as_ref().map(|a| &*a.agent))
                .and_then(|()| self.rewrite_request(req, ctx)),
            None => self.rewrite_request(req, ctx),
        };
        done.map_err(|e| failure::gateway_fault(&ctx.request_id, "the upstream request", e))
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        if ctx.admitted.as_ref().is_some_and(|a| !a.body_read) {
            // A body streamed as it arrives: it keeps to its deadline.
            let more = body.as_ref().map_or(0, Bytes::len);
            ctx.intake
                .stream(session, more, end_of_stream)
                .map_err(|e| failure::answer(failure::LATE_BODY, e))?;
        }
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
        self.judge_answer(session, resp, ctx)?;
        if let (Some(adm), true) = (ctx.admitted.clone(), resp.status.as_u16() >= 200) {
            ctx.features.upstream_header(&self.env(), &adm, resp);
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        if !ctx.talks_upstream() {
            return Ok(());
        }
        let done = async {
            ctx.upstream_status = Some(resp.status.as_u16());
            respond::decision_headers(resp, ctx)?;
            if respond::is_event_stream(resp) {
                ctx.streaming = true;
                self.metrics.active_streams.inc();
            }
            match ctx.admitted.clone() {
                Some(adm) => ctx.features.response_header(&self.env(), &adm, resp).await,
                None => Ok(()),
            }
        }
        .await;
        done.map_err(|e| failure::gateway_fault(&ctx.request_id, "the response header", e))
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<Option<Duration>> {
        if let Some(adm) = ctx.admitted.clone() {
            ctx.features.response_body(&adm, body, end_of_stream)?;
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
        if let Some(adm) = ctx.admitted.clone() {
            let env = self.env();
            ctx.features
                .upstream_body(&env, &adm, body.as_ref(), end_of_stream)?;
        }
        if end_of_stream {
            ctx.upstream_done_at = Some(Instant::now());
        }
        self.check_total_timeout(ctx, end_of_stream)?;
        Ok(None)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Box<RequestCtx>,
    ) -> FailToProxy {
        // Pingora closes the agent's connection after a failed exchange
        // (whatever `can_reuse_downstream` says), so the answer must say
        // `connection: close`: one that says keep-alive and then closes
        // loses the agent's next request. A large-body subrequest answers
        // through its main request, which keeps the connection.
        if session.subrequest_ctx.is_none() {
            session.set_keepalive(None);
        }
        if ctx
            .features
            .mcp_stream
            .as_ref()
            .is_some_and(|s| s.idle_ended())
        {
            // An MCP server's stream that went quiet ends as if the server
            // had ended it (the last chunk): not an error, and the SDK
            // client opens another.
            if let Err(err) = session.write_response_body(None, true).await {
                log::debug!("request {}: cannot end the stream: {err}", ctx.request_id);
            }
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        }
        let error_code = respond::write_failure(session, ctx, e, &self.metrics).await;
        FailToProxy {
            error_code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Box<RequestCtx>) {
        // One reading of the state clock for the breaker, the limits and
        // the log line.
        let now = self.clock.now();
        self.settle_attempt(ctx, e);
        request::settle_limits(&self.env(), ctx, now).await;
        if ctx.streaming {
            self.metrics.active_streams.dec();
        }
        if let Some(adm) = ctx.admitted.clone().filter(|_| ctx.talks_upstream()) {
            let end = End {
                error: e,
                upstream_status: ctx.upstream_status,
                sent: ctx.upstream_first_at.is_some(),
                elapsed: ctx.started.elapsed(),
                usage: ctx.usage(),
                served_by: ctx.served_by.as_deref(),
            };
            ctx.features.done(&self.env(), &adm, &end).await;
        }
        // A subrequest reports to its main request, which logs once.
        if !large_body::report(ctx) {
            observe::record(self, session, ctx, now);
        }
    }
}
