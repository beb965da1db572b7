//! `request_filter`'s work: the request id, framing, what the call is,
//! the admission pipeline, and then one of three outcomes: the gateway
//! answers (a refusal, the model list, a replay), the call is forwarded
//! the ordinary way, or its large body goes through a subrequest.
//! Also the end of the request's hold on its agent's limits.

use super::call::Call;
use super::ctx::RequestCtx;
use super::env::Env;
use super::features::Features;
use super::ids::RequestIds;
use super::{admit, large_body, respond, Gateway};
use crate::connections::BodyDeadline;
use crate::error::GatewayError;
use admit::{Admitted, Answer};
use pingora_proxy::Session;
use std::time::Duration;

impl Gateway {
    /// `true`: the gateway answered and nothing goes upstream.
    pub(super) async fn take_request(&self, session: &mut Session, ctx: &mut RequestCtx) -> bool {
        if session.subrequest_ctx.is_some() {
            // A subrequest carrying a large body its main request admitted.
            return match large_body::adopt(session, ctx) {
                Ok(()) => false,
                Err(e) => {
                    respond::write_error(session, ctx, &e).await;
                    true
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
        match self.admit_request(session, ctx).await {
            Ok(answered) => answered,
            Err(e) => {
                self.metrics.denied(e.code());
                respond::write_error(session, ctx, &e).await;
                if ctx.intake.linger {
                    admit::linger(session).await;
                }
                true
            }
        }
    }

    async fn admit_request(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<bool, GatewayError> {
        let cfg = self.config.load_full();
        // The body (read here or streamed upstream) has a deadline too.
        ctx.intake.deadline = Some(BodyDeadline::new(&cfg.connections, ctx.started));
        // What the call is, once: every later step (and every error's wire
        // format) reads it from here.
        let call = Call::classify(session.req_header());
        ctx.call = call.as_ref().ok().cloned();
        // Framing first: a body whose length two readers could disagree on
        // is refused before anything else reads it.
        if let Err(e) = admit::declared_length(session.req_header()) {
            session.set_keepalive(None);
            return Err(e);
        }
        admit::check_target(session.req_header())?;
        super::header_names::check_request(session.req_header())?;
        let call = call?;
        let env = self.env();
        let admitted = admit::admit(session, ctx, &cfg, &env, &call, &self.bodies).await?;
        let (adm, body, taken) = match admitted {
            Admitted::Answered(Answer::ListModels(agent_idx, would_deny)) => {
                if let Some(code) = would_deny {
                    self.metrics.would_deny(code);
                }
                respond::write_models(session, ctx, &cfg, agent_idx, would_deny)
                    .await
                    .map_err(|e| GatewayError::Internal(format!("cannot write model list: {e}")))?;
                return Ok(true);
            }
            Admitted::Answered(Answer::CountTokens(tokens, would_deny)) => {
                if let Some(code) = would_deny {
                    self.metrics.would_deny(code);
                }
                respond::write_count(session, ctx, tokens, would_deny)
                    .await
                    .map_err(|e| GatewayError::Internal(format!("cannot write the count: {e}")))?;
                return Ok(true);
            }
            Admitted::Answered(Answer::Replay(record)) => {
                ctx.replayed = true;
                respond::write_replay(session, ctx, &record)
                    .await
                    .map_err(|e| GatewayError::Internal(format!("cannot replay: {e}")))?;
                return Ok(true);
            }
            Admitted::Forward(adm, body, taken) => (adm, body, taken),
        };
        ctx.bytes_in = body.len();
        if let Some(code) = adm.would_deny {
            self.metrics.would_deny(code);
        }
        ctx.settle_keys = taken.settle_keys;
        ctx.money_keys = taken.money_keys;
        for (level, ratio) in &taken.money_used {
            self.metrics.budget_used(&adm.agent, *level, *ratio);
            if *level == loopgate_policy::BudgetLevel::Task {
                let task = adm.task_key.as_deref().and_then(|k| k.split_once('/'));
                if let Some((_, task)) = task {
                    self.spend.saw_task(&adm.agent, task, self.clock.now());
                }
            }
        }
        if taken.lease.degraded {
            self.metrics.state_degraded.inc();
        }
        if let Some(code) = adm.fail_open {
            self.metrics
                .fail_open
                .with_label_values(&[adm.route_name.as_ref(), code.as_str()])
                .inc();
        }
        ctx.lease = Some(taken.lease);
        if adm.body_rewritten {
            // Admission changed the body: Pingora's replay holds the
            // agent's original, so every attempt sends ours.
            ctx.original_body = Some(body.clone());
            ctx.send_original = true;
        } else if adm.model().is_some() {
            // A target may rename the model or need the output limit
            // written its way: each attempt rewrites the judged body.
            ctx.original_body = Some(body.clone());
        }
        ctx.admitted = Some(adm.clone());
        let hold = large_body::holds_answer(&cfg, &adm);
        if hold || large_body::needed(session, &adm, &body) {
            large_body::forward(session, ctx, adm, body, hold).await?;
            return Ok(true);
        }
        if !adm.body_read {
            // Pingora streams the body upstream as it reads it: its first
            // read waits at most until the deadline.
            ctx.intake.stream(session, 0, false)?;
        }
        ctx.features = Features::arm(&adm);
        Ok(false)
    }
}

/// Returns what the request held on its limits, exactly once: settles the
/// reservations ([`settled_usage`]) and frees the slot, in one store call
/// (one round trip on Redis).
pub async fn settle_limits(env: &Env<'_>, ctx: &mut RequestCtx, now: Duration) {
    let Some(lease) = ctx.lease.take() else {
        return;
    };
    let settle: Vec<(&str, u64)> = match settled_usage(ctx) {
        Some(usage) => {
            let cost = spent_micros(ctx, &usage);
            let tokens = ctx.settle_keys.iter().map(|k| (&**k, usage.total()));
            let money = ctx.money_keys.iter().map(|k| (&**k, cost));
            tokens.chain(money).collect()
        }
        None => Vec::new(),
    };
    if let Err(err) = env.store.finish(now, &lease, &settle).await {
        log::warn!("request {}: {err}", ctx.request_id);
    }
}

/// What a call's budgets settle on (`None`: the reservation stands):
/// - the usage the provider reported;
/// - a model call none of whose requests went out (every connection
///   failed, every breaker was open): nothing, it was never sent;
/// - a model call answered with usage the gateway could not read (an
///   OpenAI stream without it, a stream the agent left, a JSON answer past
///   the usage reader's cap): never below what the gateway saw, the prompt
///   estimate and the larger of the output reserved and the output it
///   counted in what it relayed;
/// - sent but never answered: the reservation.
fn settled_usage(ctx: &RequestCtx) -> Option<loopgate_policy::Usage> {
    if let Some(usage) = ctx.usage() {
        return Some(usage);
    }
    let m = ctx.admitted.as_deref()?.model()?;
    if ctx.never_sent() {
        return Some(loopgate_policy::Usage::default());
    }
    ctx.served_by.as_ref()?;
    Some(loopgate_policy::Usage {
        input_tokens: m.estimated_prompt,
        output_tokens: ctx.relayed_output().max(m.reserved_output),
        ..loopgate_policy::Usage::default()
    })
}

/// What `usage` cost, in micro-dollars, at the price of the target that
/// answered: settles the money budgets (down to what the call cost, or up
/// when it cost more than reserved). A model without a price is 0 (only
/// reachable under `on_unknown_price: zero`, or dry-run).
fn spent_micros(ctx: &RequestCtx, usage: &loopgate_policy::Usage) -> u64 {
    if ctx.money_keys.is_empty() {
        return 0;
    }
    let (Some(adm), Some(served)) = (ctx.admitted.as_deref(), ctx.served_by.as_deref()) else {
        return 0;
    };
    adm.cost_micros(served, usage).unwrap_or(0)
}
