//! The upstream exchange of an admitted request: which target each attempt
//! goes to (breakers, weights, fallback order), the request as the
//! upstream sees it (its credential, never the agent's), and what each
//! answer or failure means for the attempt, its breaker and the fallback
//! policy ([`super::attempt`]).

use super::attempt::Attempt;
use super::ctx::RequestCtx;
use super::failure::{
    answer, map_transport_error, FALLBACK, GATEWAY_FAULT, REFUSED, TOTAL_TIMEOUT, UNREADABLE,
};
use super::{large_body, respond, routing, Gateway};
use crate::error::GatewayError;
use loopgate_breaker::FailureKind;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorSource, ErrorType};
use pingora_proxy::Session;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Longest a pooled provider connection is kept idle.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

impl Gateway {
    /// The peer of the next attempt; `Err` (with the answer as its cause)
    /// when none may be made.
    pub(super) fn next_peer(&self, ctx: &mut RequestCtx) -> pingora::Result<Box<HttpPeer>> {
        let Some(adm) = ctx.admitted.clone() else {
            // Fail closed: nothing without an admission goes upstream.
            return Err(answer(
                ErrorType::InternalError,
                GatewayError::Internal(
                    "request reached upstream selection without admission".into(),
                ),
            ));
        };
        let route = &adm.route;
        let now = self.clock.now();
        // One reading of the monotonic clock serves the whole attempt.
        let started = Instant::now();
        ctx.fallback.first_at.get_or_insert(started);
        if let Some((m, why)) = adm.model().and_then(|m| Some((m, m.native_only.as_ref()?))) {
            // The other family cannot read this body (admission decided):
            // its targets count as tried, so no attempt or fallback goes
            // there.
            if ctx.fallback.attempts == 0 {
                log::debug!(
                    "request {}: served by `{}`'s own API family only: {why}",
                    ctx.request_id,
                    adm.agent
                );
            }
            for (i, t) in route.targets.iter().enumerate() {
                if !t.provider.serves(m.endpoint) && !ctx.fallback.tried.contains(&i) {
                    ctx.fallback.tried.push(i);
                }
            }
        }
        let picked = match ctx.fallback.retry_same.take() {
            // A pooled connection had gone stale: the same target again on
            // a fresh connection; not a new attempt.
            Some(i) => self.pick_again(route, i, &adm.agent, now)?,
            None => self.pick(ctx, route, &adm.agent, started, now)?,
        };
        if ctx.fallback.count(picked.target) {
            self.metrics
                .retries
                .with_label_values(&[&picked.provider.name])
                .inc();
        }
        if picked.ticket.probe {
            self.metrics
                .half_open_probes
                .with_label_values(&[&picked.key])
                .inc();
        }
        ctx.breaker_key = Some(picked.key.clone());
        let p = picked.provider.clone();
        let target = picked.target;
        let attempt = Attempt::new(picked, started, self.breakers.clone());
        let Some(addr) = p.addr.load_full() else {
            drop(attempt); // its ticket goes back: the provider was never tried
            return Err(answer(
                ErrorType::ConnectNoRoute,
                GatewayError::UpstreamUnreachable(format!(
                    "provider `{}`: host `{}` is not resolved yet",
                    p.name, p.host
                )),
            ));
        };
        ctx.attempt_body = attempt_body(ctx, &adm, target)?;
        let mut peer = peer_for(&p, *addr);
        if let Some(s) = &ctx.features.mcp_stream {
            // The server's own stream waits for it to speak: silence is
            // bounded by its idle limit, not by the read timeout.
            peer.options.read_timeout = Some(s.idle);
        }
        ctx.attempt = Some(attempt);
        // Named again once this attempt's request is sent.
        ctx.sent_to = None;
        Ok(peer)
    }

    fn pick_again(
        &self,
        route: &crate::config::runtime::Route,
        i: usize,
        agent: &str,
        now: Duration,
    ) -> pingora::Result<routing::Picked> {
        let provider = route.targets[i].provider.clone();
        let key = routing::breaker_key(&provider, agent);
        match self.breakers.acquire(&key, &provider.breaker, now) {
            Ok((Ok(ticket), _)) => Ok(routing::Picked {
                target: i,
                provider,
                key,
                ticket,
            }),
            Ok((Err(rejected), _)) => Err(answer(
                REFUSED,
                GatewayError::CircuitOpen {
                    provider: provider.name.to_string(),
                    retry_after: rejected.retry_after,
                },
            )),
            Err(_) => Err(answer(REFUSED, GatewayError::BreakerUnavailable)),
        }
    }

    fn pick(
        &self,
        ctx: &mut RequestCtx,
        route: &crate::config::runtime::Route,
        agent: &str,
        started: Instant,
        now: Duration,
    ) -> pingora::Result<routing::Picked> {
        let last = |ctx: &mut RequestCtx| {
            let e = ctx.fallback.last_failure.take().unwrap_or_else(|| {
                GatewayError::Internal("no attempt is left and none failed".into())
            });
            answer(REFUSED, e)
        };
        if !ctx.fallback.budget_left(route, started) {
            return Err(last(ctx));
        }
        let mut transitions = Vec::new();
        let choice = routing::choose(
            &self.breakers,
            route,
            agent,
            &ctx.fallback.tried,
            ctx.fallback.attempts == 0,
            now,
            &mut transitions,
        );
        for (key, t) in &transitions {
            self.metrics.transition(key, t);
        }
        match choice {
            Ok(routing::Choice::Go(p)) => Ok(p),
            Ok(routing::Choice::AllOpen {
                retry_after,
                provider,
            }) => {
                // The log says which breaker refused: the first target's.
                ctx.breaker_key = route
                    .targets
                    .first()
                    .map(|t| routing::breaker_key(&t.provider, agent));
                // After a real failure, that failure is the better answer.
                let e = ctx
                    .fallback
                    .last_failure
                    .take()
                    .unwrap_or(GatewayError::CircuitOpen {
                        provider,
                        retry_after,
                    });
                Err(answer(REFUSED, e))
            }
            Ok(routing::Choice::Exhausted) => Err(last(ctx)),
            Err(_) => Err(answer(REFUSED, GatewayError::BreakerUnavailable)),
        }
    }

    /// The request as the attempt's upstream sees it.
    pub(super) fn rewrite_request(
        &self,
        req: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        let Some(att) = ctx.attempt.as_ref() else {
            return Err(Error::explain(ErrorType::InternalError, "no attempt"));
        };
        let p = att.picked.provider.clone();
        // The agent's credential never leaves the gateway.
        for h in &super::admit::AGENT_KEY_HEADERS {
            req.remove_header(h);
        }
        // Nor do headers that re-scope the gateway's credential or speak for
        // the gateway (see `SCOPING_HEADERS`): one pass over the names, as
        // an agent usually sends none of them.
        let adm = ctx.admitted.as_deref();
        let allowed = adm.map_or(&[][..], |a| a.forward_headers.as_slice());
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
        if adm.is_some_and(|a| a.body_read) {
            // The body was already received in full (we may have sent 100 Continue).
            req.remove_header(&http::header::EXPECT);
        }
        p.authorize(req)?;
        // A body we send ourselves needs framing that matches it exactly.
        if let Some(body) = &ctx.attempt_body {
            req.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?;
            req.remove_header(&http::header::TRANSFER_ENCODING);
        }
        if let Some(ct) = large_body::content_type(ctx) {
            req.insert_header(http::header::CONTENT_TYPE, ct.clone())?;
        }
        req.insert_header("host", p.authority_value.clone())?;
        // The gateway reads answers (usage, MCP lists, tool records): ask for
        // them unencoded rather than pass through what it cannot inspect.
        req.insert_header(http::header::ACCEPT_ENCODING, "identity")?;
        req.insert_header(respond::REQUEST_ID_HEADER, ctx.request_id.as_str())?;
        // A call translated for a provider of the other API family goes to
        // that family's chat endpoint (the agent's query is not its API's).
        let translated = adm.is_some_and(|a| {
            a.model()
                .is_some_and(|m| a.route.translates(m.endpoint) && p.translates(m.endpoint))
        });
        if translated && p.kind != crate::config::ProviderKind::Anthropic {
            // The agent's Anthropic headers mean nothing to an OpenAI server.
            req.remove_header("anthropic-version");
            req.remove_header("anthropic-beta");
        }
        let target = match adm.and_then(|a| a.target()) {
            _ if translated => {
                let family = super::features::translate::kind_family(p.kind);
                Some(format!("{}{}", p.base_path, family.chat_path()))
            }
            Some(t) => Some(format!("{}{t}", p.base_path)),
            None if !p.base_path.is_empty() => {
                let pq = req.uri.path_and_query().map_or("/", |pq| pq.as_str());
                Some(format!("{}{pq}", p.base_path))
            }
            None => None,
        };
        if let Some(t) = target {
            let uri = t
                .parse::<http::Uri>()
                .map_err(|e| Error::because(ErrorType::InternalError, "upstream uri", e))?;
            req.set_uri(uri);
        }
        let now = Instant::now();
        ctx.upstream_started = Some(now);
        ctx.upstream_first_at.get_or_insert(now);
        ctx.sent_to = ctx.attempt.as_ref().map(|a| a.picked.provider.name.clone());
        Ok(())
    }

    /// Judges the upstream's answer header: a failure (5xx, 429, an answer
    /// the gateway cannot read) ends the attempt and, while the fallback
    /// policy allows, is discarded for another target ([`FALLBACK`]).
    pub(super) fn judge_answer(
        &self,
        session: &Session,
        resp: &ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        let status = resp.status.as_u16();
        let Some(provider) = ctx.attempt.as_ref().map(|a| a.picked.provider.clone()) else {
            return Ok(());
        };
        let unreadable = unreadable(ctx, resp);
        if let Some(why) = unreadable {
            let e = GatewayError::UpstreamFailed(format!("provider `{}` {why}", provider.name));
            self.fail_attempt(ctx, FailureKind::ServerError, e);
            if self.may_retry(session, ctx) {
                return Err(Error::explain(FALLBACK, "unreadable answer; falling back"));
            }
            let e = ctx.fallback.last_failure.take();
            return Err(match e {
                Some(e) => answer(UNREADABLE, e),
                None => Error::explain(UNREADABLE, why),
            });
        }
        let Some(att) = ctx.attempt.as_mut().filter(|_| status >= 200) else {
            return Ok(());
        };
        att.ttfb = Some(att.started.elapsed());
        let ttfb = att.ttfb;
        let key = att.picked.key.clone();
        let failure = match status {
            429 => Some(FailureKind::RateLimited),
            500..=599 => Some(FailureKind::ServerError),
            _ => None,
        };
        if let Some(kind) = failure {
            let e = GatewayError::UpstreamFailed(format!(
                "provider `{}` answered {status}",
                provider.name
            ));
            self.fail_attempt(ctx, kind, e);
            if status == 429 {
                self.hold_for_retry_after(resp, &key, &provider);
            }
            if self.may_retry(session, ctx) {
                return Err(Error::explain(
                    FALLBACK,
                    format!(
                        "provider `{}` answered {status}; falling back",
                        provider.name
                    ),
                ));
            }
            // The last attempt: the provider's own answer goes through
            // unchanged (its failure was recorded above).
        }
        ctx.served_by = Some(provider.name.clone());
        ctx.served_kind = Some(provider.kind);
        if let Some(t) = ctx.features.translate.as_mut() {
            t.serve(provider.kind);
        }
        ctx.ttfb = ttfb;
        ctx.breaker_key = Some(key);
        if ctx.features.mcp_stream.is_some() && status < 300 && respond::is_event_stream(resp) {
            // The server answered its stream: that is what its breaker
            // learns. The stream's later silence, its idle end or the
            // agent leaving say nothing about the server's health. (A 2xx
            // that is no event stream is judged like any answer.)
            self.succeed_attempt(ctx);
        }
        Ok(())
    }

    /// A 429 that says when to come back: the target's breaker holds it
    /// out of rotation till then (at most the breaker's longest opening).
    fn hold_for_retry_after(
        &self,
        resp: &ResponseHeader,
        key: &str,
        provider: &crate::config::runtime::Provider,
    ) {
        let Some(secs) = retry_after_secs(resp) else {
            return;
        };
        let hold = Duration::from_secs(secs).min(provider.breaker.max_open_for);
        let reason = format!("provider answered 429 with Retry-After: {secs}");
        if let Ok(Some(t)) =
            self.breakers
                .hold_open(key, &provider.breaker, self.clock.now(), hold, &reason)
        {
            self.metrics.transition(key, &t);
        }
    }

    /// A connection could not be made: the provider's failure, unless the
    /// gateway itself was out of sockets.
    pub(super) fn connect_failed(
        &self,
        session: &Session,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        let ge = map_transport_error(&e, &provider_name(ctx));
        if let GatewayError::Overloaded(_) = ge {
            // No provider was reached: its breaker must not count this (the
            // attempt's ticket goes back), and another target would meet
            // the same shortage.
            ctx.attempt = None;
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
            ctx.fallback.last_failure = Some(ge);
            e.set_retry(false);
            return e;
        }
        self.fail_attempt(ctx, FailureKind::Connect, ge);
        e.set_retry(self.may_retry(session, ctx));
        e
    }

    /// The exchange failed after connecting: whose fault, and may another
    /// attempt follow.
    pub(super) fn proxy_failed(
        &self,
        session: &Session,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
        client_reused: bool,
    ) -> Box<Error> {
        let started = respond::response_started(session);
        let retry = match e.etype() {
            // Judged and recorded where it was raised.
            t if t == &FALLBACK => true,
            t if t == &UNREADABLE => false,
            // Ours: the provider is not blamed (the ticket goes back).
            t if t == &GATEWAY_FAULT => {
                ctx.attempt = None;
                false
            }
            // Our decision (a budget cut, a refusal): not the provider's failure.
            _ if GatewayError::cause_of(&e).is_some() => {
                self.succeed_attempt(ctx);
                false
            }
            // The agent went away or broke its side.
            _ if *e.esource() == ErrorSource::Downstream => {
                if started {
                    self.succeed_attempt(ctx);
                } else {
                    ctx.attempt = None;
                }
                false
            }
            ErrorType::ReadTimedout
                if started && ctx.streaming && ctx.features.mcp_stream.is_some() =>
            {
                // The server's own stream was silent for its idle limit:
                // ended cleanly, a failure of nothing (`mcp_stream`).
                if let Some(s) = ctx.features.mcp_stream.as_mut() {
                    s.idled();
                }
                ctx.attempt = None;
                false
            }
            ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError
                if client_reused && !started && ctx.fallback.retry_stale(&mut ctx.attempt) =>
            {
                // The provider had closed a pooled connection: the same
                // target on a fresh one, not counted as a failure.
                true
            }
            t => {
                let kind = if matches!(t, ErrorType::ReadTimedout | ErrorType::WriteTimedout)
                    || t == &TOTAL_TIMEOUT
                {
                    FailureKind::Timeout
                } else if started {
                    FailureKind::StreamBroken
                } else {
                    FailureKind::ServerError
                };
                let ge = map_transport_error(&e, &provider_name(ctx));
                self.fail_attempt(ctx, kind, ge);
                !started && self.may_retry(session, ctx)
            }
        };
        e.set_retry(retry);
        e
    }

    /// In `logging`: an attempt still open ended without a failure hook:
    /// the exchange completed (or the agent left after it started), unless
    /// a tool that must answer JSON did not ("200 but unusable").
    pub(super) fn settle_attempt(&self, ctx: &mut RequestCtx, e: Option<&Error>) {
        if ctx.attempt.is_none() {
            return;
        }
        let unusable = ctx
            .features
            .json_check
            .as_mut()
            .is_some_and(|j| j.unusable());
        match e {
            None if unusable => self.fail_attempt(
                ctx,
                FailureKind::ServerError,
                GatewayError::UpstreamFailed(
                    "the tool answered 2xx with a body that is not JSON".into(),
                ),
            ),
            None => self.succeed_attempt(ctx),
            Some(err) if *err.esource() == ErrorSource::Downstream => self.succeed_attempt(ctx),
            Some(_) => self.fail_attempt(
                ctx,
                FailureKind::StreamBroken,
                GatewayError::UpstreamFailed("stream ended abnormally".into()),
            ),
        }
    }

    /// The per-read timeout bounds stalls; this bounds the whole exchange.
    pub(super) fn check_total_timeout(&self, ctx: &RequestCtx, end: bool) -> pingora::Result<()> {
        if let (Some(att), Some(start)) = (&ctx.attempt, ctx.upstream_started) {
            let provider = &att.picked.provider;
            if !end && start.elapsed() > provider.timeouts.total {
                return Err(Error::explain(
                    TOTAL_TIMEOUT,
                    format!("provider `{}` exceeded its total timeout", provider.name),
                ));
            }
        }
        Ok(())
    }

    fn fail_attempt(&self, ctx: &mut RequestCtx, kind: FailureKind, e: GatewayError) {
        let att = ctx.attempt.take();
        ctx.fallback
            .failed(att, kind, e, &self.metrics, self.clock.now());
    }

    fn succeed_attempt(&self, ctx: &mut RequestCtx) {
        if let Some(att) = ctx.attempt.take() {
            att.succeed(&self.metrics, self.clock.now());
        }
    }

    fn may_retry(&self, session: &Session, ctx: &RequestCtx) -> bool {
        ctx.admitted.as_ref().is_some_and(|adm| {
            ctx.fallback.may_retry(
                &adm.route,
                &adm.agent,
                &self.breakers,
                self.clock.now(),
                respond::response_started(session),
            )
        })
    }
}

/// The provider of the attempt under way (or the one that served).
pub fn provider_name(ctx: &RequestCtx) -> String {
    ctx.attempt
        .as_ref()
        .map(|a| a.picked.provider.name.to_string())
        .or_else(|| ctx.served_by.as_deref().map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

/// The body an attempt sends itself: renamed for this target, or the
/// judged body of a large-body subrequest, or the original when Pingora
/// cannot replay it; `None` lets Pingora send (or replay) the body.
fn attempt_body(
    ctx: &RequestCtx,
    adm: &super::ctx::Admission,
    target: usize,
) -> pingora::Result<Option<bytes::Bytes>> {
    let injected = large_body::injected(ctx).cloned();
    let base = injected.clone().or_else(|| ctx.original_body.clone());
    let for_target = match (adm.model(), &base) {
        (Some(plan), Some(base)) => super::model::attempt_body(&adm.route, target, plan, base)
            .map_err(|e| answer(GATEWAY_FAULT, e))?,
        _ => None,
    };
    Ok(match (for_target, base) {
        (Some(body), _) => Some(body),
        (None, base) if injected.is_some() || ctx.send_original => base,
        _ => None,
    })
}

/// The connection settings of one provider.
fn peer_for(p: &crate::config::runtime::Provider, addr: std::net::SocketAddr) -> Box<HttpPeer> {
    // SNI only matters for TLS; a plain peer takes no copy of the host.
    let sni = if p.tls { p.host.clone() } else { String::new() };
    let mut peer = HttpPeer::new(addr, p.tls, sni);
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
    Box::new(peer)
}

/// What the gateway could not read must not pass as if judged: a switch
/// of protocols nobody asked for (agents' upgrades are refused at
/// admission), a redirect, or a body encoding it cannot inspect (it asked
/// for `identity`) on an answer whose body it judges. `Some(why)` for
/// those.
///
/// A redirect (3xx but `304 Not Modified`, which names no other place):
/// a model endpoint, a tool or an MCP server never sends its caller
/// elsewhere, and relayed, the agent's SDK would follow the `Location`
/// and re-send the whole request (prompt, arguments) to a place no rule
/// judged. So it is the upstream's failure, counted by its breaker, and a
/// fallback may follow; the `Location` is never echoed. A tool configured
/// with `pass_redirects: true` is the one exception.
fn unreadable(ctx: &RequestCtx, resp: &ResponseHeader) -> Option<String> {
    let status = resp.status.as_u16();
    if status == 101 {
        return Some("switched protocols unasked".to_string());
    }
    let relayed = || {
        ctx.admitted
            .as_deref()
            .is_some_and(|a| a.passes_redirects())
    };
    if (300..400).contains(&status) && status != 304 && !relayed() {
        return Some(format!(
            "answered a redirect ({status}), which the gateway neither follows nor relays"
        ));
    }
    if status < 200 || !needs_inspection(ctx) {
        return None;
    }
    resp.headers
        .get(http::header::CONTENT_ENCODING)
        .filter(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
        .map(|v| {
            format!(
                "answered with Content-Encoding `{}`, which the gateway cannot inspect",
                loopgate_policy::clip(&String::from_utf8_lossy(v.as_bytes()), 40)
            )
        })
}

/// Whether the gateway reads this exchange's response body: usage on model
/// calls, list filtering on MCP, the JSON check and idempotency records on
/// tools. Only a plain tool call's answer passes unread.
fn needs_inspection(ctx: &RequestCtx) -> bool {
    let f = &ctx.features;
    ctx.admitted.is_none()
        || f.usage.is_some()
        || f.json_check.is_some()
        || f.idempotency.is_some()
        || f.mcp_lists.is_some()
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
