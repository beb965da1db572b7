//! Admission: the one pipeline every call goes through in
//! `request_filter`, its order in [`admit`]. Runs before anything goes
//! upstream; every refusal is answered there, never by failing a later
//! hook (Pingora would still contact the upstream after a
//! `request_body_filter` error).
//!
//! 1. identify the agent (its key);
//! 2. judge the call with its kind's rules (`model`, `tools`, `mcp`: each
//!    only judges its kind and says what the shared steps should count);
//! 3. a call whose every target has an open circuit is refused here (it
//!    could go nowhere, and must leave no state behind); then the agent's
//!    limits and budgets, and the kind's extra windows, in one
//!    store call;
//! 4. the task guards: loop guard, watchdog, tool isolation;
//! 5. one fail-mode decision for every step that could not read its state.
//!
//! What a later step refuses gives back what an earlier one took (the
//! limits' reservation, an idempotency claim).

use super::call::Call;
use super::ctx::{Admission, Plan, RequestCtx};
use super::env::Env;
use super::guards::{self, Watch};
use crate::config::runtime::Route;
use crate::config::Config;
use crate::error::GatewayError;
use bytes::{Bytes, BytesMut};
use loopgate_policy::predict::Forecast;
use loopgate_policy::{Deny, DenyCode, LimitRequest, LimitsTaken, Verdict, WindowTake};
use pingora_proxy::Session;
use std::sync::Arc;

/// Headers an agent may authenticate with, in order of preference. Parsed
/// names: a lookup or removal by `&str` parses the name on every call.
pub const AGENT_KEY_HEADERS: [http::HeaderName; 3] = [
    http::header::AUTHORIZATION,
    http::HeaderName::from_static("x-api-key"),
    http::HeaderName::from_static("x-agent-token"),
];

/// What admission decided for a request that passed it.
pub enum Admitted {
    /// Forward upstream with this body (already read in full, possibly
    /// degraded to another model), holding this on the agent's limits until
    /// the exchange ends.
    Forward(Arc<Admission>, Bytes, LimitsTaken),
    /// Answered by the gateway itself (the model list, a replay).
    Answered(Answer),
}

/// A call the gateway answers without the upstream.
pub enum Answer {
    /// `GET /v1/models`, for this agent.
    ListModels(usize, Option<DenyCode>),
    /// `count_tokens` on a route without an Anthropic-family target: the
    /// gateway's own count of the prompt's tokens.
    CountTokens(u64, Option<DenyCode>),
    /// A repeated idempotency key: the recorded tool response.
    Replay(loopgate_policy::IdemRecord),
}

/// A call its kind's rules allowed, and what the shared steps count.
pub struct Judged {
    pub route_name: Arc<str>,
    pub route: Arc<Route>,
    pub body: Bytes,
    pub body_read: bool,
    pub body_rewritten: bool,
    /// The call's `fail_mode`, with what the judge already tolerated.
    pub fail: FailMode,
    /// What the limits reserve: prompt estimate and output tokens, whether
    /// the task's token budget counts it, further windows (call rates).
    pub estimated_prompt: u64,
    pub max_tokens: u64,
    /// `max_tokens` is the budgets' default output, the body set none
    /// (per completion; a budget refusal says so).
    pub default_output: Option<u64>,
    pub task_budget: bool,
    pub extra: Vec<WindowTake>,
    /// A model call under a money budget: what it reserves.
    pub money: Option<loopgate_policy::MoneyAsk>,
    /// The call's fingerprint for the loop guard (`None`: not a guarded
    /// call).
    pub loop_call: Option<loopgate_breaker::Fingerprint>,
    /// Whether the watchdog counts the call.
    pub watched: bool,
    /// The share of its model's context window the prompt fills, when the
    /// watchdog may act on it.
    pub context_share: Option<f64>,
    /// The task's isolation streak for this tool: key, threshold, cool-down.
    pub isolation: Option<(String, u32, std::time::Duration)>,
    /// An idempotency claim taken while judging: forgotten if refused.
    pub idem_claim: Option<String>,
    pub plan: Plan,
}

/// What judging a call came to.
pub enum Judgement {
    Forward(Box<Judged>),
    Answer(Answer),
}

/// The agent and the call, for the kinds' judges.
pub struct Caller<'a> {
    pub cfg: &'a Config,
    pub agent_idx: usize,
    pub task: Option<&'a str>,
    /// The agent's room in the body memory, for what the call holds
    /// beside its body.
    pub room: &'a super::buffers::Room,
}

impl Caller<'_> {
    pub fn rules(&self) -> &loopgate_policy::AgentRules {
        &self.cfg.agents[self.agent_idx]
    }

    /// `agent/task`.
    pub fn task_key(&self) -> Option<String> {
        self.task.map(|t| format!("{}/{t}", self.rules().name))
    }

    /// The loop guard's configuration, when this call is guarded (it
    /// names a task and the agent's loop guard is on).
    pub fn loop_guard(&self) -> Option<&loopgate_breaker::LoopConfig> {
        self.task?;
        self.cfg.guards[self.agent_idx].loops.as_ref()
    }

    /// The lowest context occupancy the watchdog acts on, when it watches
    /// this call (it names a task and the agent has a watchdog).
    pub fn context_watch(&self) -> Option<f64> {
        self.task?;
        let wd = self.cfg.guards[self.agent_idx].watchdog.as_ref()?;
        match (wd.yellow.context_share, wd.red.context_share) {
            (Some(y), Some(r)) => Some(y.min(r)),
            (y, r) => y.or(r),
        }
    }
}

/// `fail_mode`, once for every step: a check that could not decide (its
/// state was unavailable) refuses under `closed`; under `open` it is
/// noted, answered in `x-loopgate-fail-open`, and the call goes on.
/// Denials and open breakers never come here.
pub struct FailMode {
    open: bool,
    pub noted: Option<DenyCode>,
}

impl FailMode {
    pub fn new(open: bool) -> FailMode {
        FailMode { open, noted: None }
    }

    /// `Ok(None)`: the step could not decide and `open` lets the call on.
    pub fn tolerate<T>(&mut self, r: Result<T, GatewayError>) -> Result<Option<T>, GatewayError> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(GatewayError::Denied(d))
                if self.open
                    && matches!(
                        d.code,
                        DenyCode::StateUnavailable | DenyCode::PolicyUnavailable
                    ) =>
            {
                log::warn!("fail_mode open: forwarding although {}", d.message);
                self.noted.get_or_insert(d.code);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// The admission pipeline (see the module docs for the order).
pub async fn admit(
    session: &mut Session,
    ctx: &mut RequestCtx,
    cfg: &Config,
    env: &Env<'_>,
    call: &Call,
    bodies: &Arc<super::buffers::BodyBuffers>,
) -> Result<Admitted, GatewayError> {
    // 1. The agent.
    let agent_idx = authenticate(session, cfg)?;
    let rules = &cfg.agents[agent_idx];
    ctx.agent = Some(rules.name.clone());
    let room = body_room(rules, bodies, cfg.connections.body_memory);
    ctx.intake.hold = Some(room.hold());
    // The one reader of the task id: what the required-header rule sees
    // present is what the guards key on, or the request is refused.
    let task = task_id(session)?.map(str::to_string);
    let caller = Caller {
        cfg,
        agent_idx,
        task: task.as_deref(),
        room: &room,
    };
    // 2. The call, by its kind's rules.
    let mut verdict = Verdict::default();
    let judged = match call {
        Call::Model(endpoint) => {
            super::model::judge(session, ctx, &caller, *endpoint, &mut verdict).await?
        }
        Call::Tool { tool, path } => {
            super::tools::judge(session, ctx, env, &caller, tool, path).await?
        }
        Call::Mcp { server } => {
            super::mcp::judge(session, ctx, env, &caller, server, &mut verdict).await?
        }
    };
    let mut j = match judged {
        Judgement::Forward(j) => j,
        Judgement::Answer(a) => return Ok(Admitted::Answered(a)),
    };
    let claim = j.idem_claim.take();
    let steps = shared_steps(env, &caller, &mut j, &mut verdict).await;
    let (taken, guarded, fail_open) = match steps {
        Ok(v) => v,
        Err(e) => {
            if let Some(key) = &claim {
                // Never sent: the key is free again.
                let _ = env.store.idem_finish(env.clock.now(), key, None).await;
            }
            return Err(e);
        }
    };
    if let Plan::Model(m) = &mut j.plan {
        m.budget_room = taken.budget_room;
        m.money_room = taken.money_room;
        m.settles = !taken.settle_keys.is_empty() || !taken.money_keys.is_empty();
    }
    // The fit is kept as long as the task's budget is.
    let spend_fit = prediction(&caller, &j).map(|_| rules.budgets.task_ttl);
    Ok(Admitted::Forward(
        Arc::new(Admission {
            request_id: ctx.request_id.clone(),
            agent: rules.name.clone(),
            route_name: j.route_name,
            route: j.route,
            would_deny: verdict.would_deny.map(|d| d.code),
            task_key: caller.task_key(),
            watch_ttl: cfg.guards[agent_idx].watchdog.as_ref().map(|w| w.idle_ttl),
            spend_fit,
            guard: guarded.guard,
            predicted_usd: guarded.predicted_usd,
            fail_open,
            forward_headers: cfg.forward_headers[agent_idx].clone(),
            body_read: j.body_read,
            body_rewritten: j.body_rewritten,
            plan: j.plan,
        }),
        j.body,
        taken,
    ))
}

/// The spend prediction a call takes part in: a model call of a task
/// whose agent predicts spend, with the agent's forecast and the task's
/// money budget (micro-dollars). Admission judges the prediction; each
/// settled step's cost then feeds the task's fit.
fn prediction<'c>(caller: &Caller<'c>, j: &Judged) -> Option<(&'c Forecast, u64)> {
    caller.task?;
    let wd = caller.cfg.guards[caller.agent_idx].watchdog.as_ref()?;
    let budget = caller.cfg.agents[caller.agent_idx].budgets.task_usd;
    Some((wd.predict.as_ref()?, budget.filter(|_| j.task_budget)?))
}

/// The agent's share of the memory bodies are read into: bodies beyond
/// what the agent may have in flight would only be refused by its limits
/// after they were read, so they are not read.
fn body_room(
    rules: &loopgate_policy::AgentRules,
    bodies: &Arc<super::buffers::BodyBuffers>,
    total: u64,
) -> super::buffers::Room {
    // Each body in the share comes with the read buffers its connection
    // holds while it arrives, which are charged with it.
    let share = rules
        .max_body_bytes
        .saturating_add(super::buffers::READ_BUFFERS)
        .saturating_mul(
            rules
                .limits
                .max_in_flight
                .unwrap_or(super::buffers::DEFAULT_BODIES_PER_AGENT)
                .max(1),
        );
    bodies.room(rules.name.clone(), share, total)
}

/// Steps 3 to 5: limits, then the task guards, under one fail mode. A call
/// whose every target has an open circuit is refused before both, and the
/// limits go before the guards, so a call either refuses leaves no task
/// state behind (a refused agent cannot grow it); what a guard then
/// refuses gives the reservation back.
async fn shared_steps(
    env: &Env<'_>,
    caller: &Caller<'_>,
    j: &mut Judged,
    verdict: &mut Verdict,
) -> Result<(LimitsTaken, Guarded, Option<DenyCode>), GatewayError> {
    let rules = caller.rules();
    // Every target's circuit is open: refused here, before the limits and
    // the guards make state for a call that cannot go anywhere.
    let open = super::routing::all_open(env.breakers, &j.route, &rules.name, env.clock.now())
        .map_err(|_| GatewayError::BreakerUnavailable)?;
    if let Some((retry_after, provider)) = open {
        return Err(GatewayError::CircuitOpen {
            provider: provider.to_string(),
            retry_after,
        });
    }
    let mut fail = std::mem::replace(&mut j.fail, FailMode::new(false));
    let limits = LimitRequest {
        extra: &j.extra,
        estimated_prompt: j.estimated_prompt,
        max_tokens: Some(j.max_tokens),
        task: caller.task.filter(|_| j.task_budget),
        money: j.money,
        default_output: j.default_output,
        // A token count is charged to no budget (see `model::count_tokens`).
        budgets: !matches!(&j.plan, Plan::Model(m) if m.endpoint == loopgate_policy::Endpoint::CountTokens),
    };
    let taken = rules
        .admit_limits(env.store, env.clock.now(), &limits, verdict)
        .await
        .map_err(GatewayError::from);
    let taken = fail.tolerate(taken)?.unwrap_or_else(LimitsTaken::none);
    match task_guards(env, caller, j, verdict, &mut fail, taken.task_budget_used).await {
        Ok(guard) => Ok((taken, guard, fail.noted)),
        Err(e) => {
            release(env, &taken).await;
            Err(e)
        }
    }
}

/// What the task guards add to an admitted call's answer.
#[derive(Debug, Default, Clone, Copy)]
pub struct Guarded {
    /// `x-loopgate-guard`: `warn` or `degraded`.
    pub guard: Option<&'static str>,
    /// `x-loopgate-predicted-usd`: the task's predicted spend.
    pub predicted_usd: Option<f64>,
}

/// Step 4: the task's loop guard, watchdog and tool isolation.
async fn task_guards(
    env: &Env<'_>,
    caller: &Caller<'_>,
    j: &mut Judged,
    verdict: &mut Verdict,
    fail: &mut FailMode,
    budget_used: Option<f64>,
) -> Result<Guarded, GatewayError> {
    let Some(key) = caller.task_key() else {
        return Ok(Guarded::default());
    };
    let rules = caller.rules();
    let agent_guards = &caller.cfg.guards[caller.agent_idx];
    if let (Some(loops), Some(fp)) = (&agent_guards.loops, j.loop_call) {
        let deny = guards::check_loop(env, rules, agent_guards, loops, &key, fp).await;
        if let Some(deny) = fail.tolerate(deny)? {
            verdict.judge_external(rules, deny)?;
        }
    }
    let mut out = Guarded::default();
    if let (Some(wd), true) = (&agent_guards.watchdog, j.watched) {
        let mut seen = guards::Observed {
            used: budget_used,
            context: j.context_share,
            predicted: None,
        };
        if let Some((f, budget)) = prediction(caller, j) {
            let predicted = fail.tolerate(guards::forecast(env, &key, budget, f).await)?;
            seen.predicted = predicted.flatten().map(|p| (p, budget));
            out.predicted_usd = seen.predicted.map(|(p, _)| p.predicted as f64 / 1e6);
        }
        match fail.tolerate(guards::watch(env, rules, wd, &key, seen).await)? {
            None | Some(Watch::Green) => {}
            Some(Watch::Warn) => out.guard = Some("warn"),
            Some(Watch::Stop(deny)) => verdict.judge_external(rules, Some(deny))?,
            Some(Watch::Degrade(to)) => {
                // Only a model call has a cheaper model to go to; any
                // other call is warned.
                out.guard = Some(match super::model::degrade(caller, j, &to).await? {
                    true => "degraded",
                    false => "warn",
                });
            }
        }
    }
    if let Some((streak, _, _)) = &j.isolation {
        let isolated = guards::isolated(env, streak).await;
        if let Some(after) = fail.tolerate(isolated)?.flatten() {
            let deny = Deny::new(
                DenyCode::ToolIsolated,
                format!(
                    "tool `{}` kept failing the same way for this task; isolated for now",
                    j.route_name
                ),
            )
            .retry_after(after)
            .never_retryable();
            verdict.judge_external(rules, Some(deny))?;
        }
    }
    Ok(out)
}

/// The agent behind the presented key: its index in `cfg.agents`.
pub fn authenticate(session: &Session, cfg: &Config) -> Result<usize, GatewayError> {
    let req = session.req_header();
    let key = AGENT_KEY_HEADERS.iter().find_map(|h| {
        let v = req.headers.get(h)?.as_bytes();
        let v = if h == http::header::AUTHORIZATION {
            strip_bearer(v)?
        } else {
            v
        };
        let v = v.trim_ascii();
        (!v.is_empty()).then_some(v)
    });
    let Some(key) = key else {
        return Err(Deny::new(
            DenyCode::MissingKey,
            "no gateway key: send `Authorization: Bearer <key>`, `x-api-key` or `x-agent-token`",
        )
        .into());
    };
    cfg.keys
        .lookup(key)
        .copied()
        .ok_or_else(|| Deny::new(DenyCode::UnknownKey, "the gateway key is not known").into())
}

fn strip_bearer(v: &[u8]) -> Option<&[u8]> {
    let v = v.trim_ascii();
    (v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ")).then(|| &v[7..])
}

/// The request body's declared length (`None` without `Content-Length`).
///
/// Anything but one `Content-Length` holding one decimal number is
/// refused: Pingora frames `2000000, 2000000` as 2,000,000 bytes, so a value
/// the gateway could not read would otherwise skip every size limit while
/// the body still went through. A `Content-Length` beside
/// `Transfer-Encoding` is refused too (two framings, two readers).
pub fn declared_length(req: &pingora::http::RequestHeader) -> Result<Option<u64>, GatewayError> {
    let bad = |why: &str| {
        GatewayError::Denied(
            Deny::new(
                DenyCode::InvalidRequest,
                format!("invalid request framing: {why}"),
            )
            .never_retryable(),
        )
    };
    let mut values = req.headers.get_all(http::header::CONTENT_LENGTH).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(bad("more than one Content-Length"));
    }
    if req.headers.contains_key(http::header::TRANSFER_ENCODING) {
        return Err(bad("both Content-Length and Transfer-Encoding"));
    }
    let digits = v.as_bytes().trim_ascii();
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(bad("Content-Length must be one decimal number"));
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| bad("Content-Length must be one decimal number"))
}

/// Longest request target (path and query) accepted. The gateway rebuilds
/// the target under a provider's or tool's base path, and `http::Uri` takes
/// at most 64 KiB: a longer one would fail there, after admission, as if
/// the upstream had failed. Agents' calls are far shorter.
pub const MAX_TARGET_BYTES: usize = 8 * 1024;

/// Refuses, before anything reads the request, a target too long to be
/// rebuilt and a request for a protocol switch: an upgraded connection
/// carries bytes no rule judges, and a `101` on a replayed body would leave
/// the agent's connection out of step with its answers.
pub fn check_target(req: &pingora::http::RequestHeader) -> Result<(), GatewayError> {
    let bad = |msg: String| {
        GatewayError::Denied(Deny::new(DenyCode::InvalidRequest, msg).never_retryable())
    };
    let len = req.uri.path_and_query().map_or(0, |pq| pq.as_str().len());
    if len > MAX_TARGET_BYTES {
        return Err(bad(format!(
            "the request target is {len} bytes; at most {MAX_TARGET_BYTES} are accepted"
        )));
    }
    let upgrade = req.headers.contains_key(http::header::UPGRADE)
        || req
            .headers
            .get_all(http::header::CONNECTION)
            .iter()
            .any(|v| {
                v.as_bytes()
                    .split(|b| *b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade"))
            });
    if upgrade {
        return Err(bad(
            "protocol upgrades are not allowed through the gateway".into()
        ));
    }
    Ok(())
}

/// Bodies larger than this are judged off the runtime's threads
/// ([`aside`]), whatever their kind.
pub const JUDGE_ASIDE_BYTES: usize = 256 * 1024;

/// Runs `work` (judging a large body) on the blocking pool, at most as
/// many at once as there are CPUs, so the runtime's threads go on serving
/// other requests meanwhile.
pub async fn aside<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, GatewayError> {
    static JUDGES: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    let judges = JUDGES.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        tokio::sync::Semaphore::new(cpus)
    });
    let _turn = judges
        .acquire()
        .await
        .map_err(|_| GatewayError::Internal("the judging pool is closed".into()))?;
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| GatewayError::Internal(format!("judging the body failed: {e}")))
}

/// Reads the whole body, refusing it as soon as it is known to exceed
/// `limit`: from `Content-Length` before reading anything, or while reading
/// a chunked body, without buffering the rest.
///
/// When the body is refused part-way, `linger` is set: the client is still
/// sending, and closing now would reset the connection before it reads our
/// 413. See [`linger`].
pub async fn read_body(
    session: &mut Session,
    limit: u64,
    intake: &mut super::buffers::BodyIntake,
) -> Result<Bytes, GatewayError> {
    let too_large = || {
        GatewayError::Denied(Deny::new(
            DenyCode::BodyTooLarge,
            format!("request body exceeds the limit of {limit} bytes"),
        ))
    };
    let declared = declared_length(session.req_header())?;
    if declared.is_some_and(|n| n > limit) {
        // The unread body stays on the wire: this connection cannot be
        // reused. A client that waits for 100 Continue sends nothing more.
        session.set_keepalive(None);
        intake.linger = !expects_continue(session);
        return Err(too_large());
    }
    // Charged before a byte is read (and before a waiting client is told
    // to send): the read buffers this connection holds while the body
    // arrives, and a declared body whole, which is what it will hold. A
    // body past the agent's share is refused as it arrives, nothing of it
    // read into memory (see `buffers`).
    let mut charged = declared.unwrap_or(0);
    if let Err(e) = intake.grow(super::buffers::READ_BUFFERS.saturating_add(charged)) {
        session.set_keepalive(None);
        return Err(e);
    }
    if expects_continue(session) {
        // It sends the body only after we said so, which we do only once
        // the cheap checks passed.
        session
            .downstream_session
            .write_continue_response()
            .await
            .map_err(|e| GatewayError::Internal(format!("cannot send 100 Continue: {e}")))?;
    }
    // Keep the first 64 KiB in Pingora's retry buffer: for bodies that fit,
    // Pingora replays it upstream itself (see `mod.rs` for the large case).
    session.downstream_session.enable_retry_buffering();
    // A small body usually arrives in one read: that chunk (Pingora's own
    // copy, sized to it) is kept as it is. Only a body read in several
    // pieces is gathered into one buffer.
    let mut first = Bytes::new();
    let mut gathered: Option<BytesMut> = None;
    let mut total = 0u64;
    loop {
        let Some(chunk) = read_chunk(session, intake, total).await? else {
            break;
        };
        total += chunk.len() as u64;
        if total > limit {
            session.set_keepalive(None);
            intake.linger = true;
            return Err(too_large());
        }
        // What keeping the body so far takes: the first chunk as it is,
        // then the gathering buffer's capacity (a declared body's length,
        // charged above; a chunked one's grows by doubling, up to the
        // limit). Counted before it is allocated; refused, the rest stays
        // unread (the connection closes: nothing lingers to read it off).
        let grows = gathered
            .as_ref()
            .filter(|buf| buf.capacity() - buf.len() < chunk.len());
        let keep = match (&gathered, grows) {
            (_, Some(buf)) => total
                .max((buf.capacity() as u64).saturating_mul(2))
                .min(limit),
            (Some(buf), None) => buf.capacity() as u64,
            (None, _) if first.is_empty() => total,
            (None, _) => declared.unwrap_or(0).clamp(total, limit),
        };
        if keep > charged {
            if let Err(e) = intake.grow(keep - charged) {
                session.set_keepalive(None);
                return Err(e);
            }
            charged = keep;
        }
        match gathered.as_mut() {
            Some(buf) => {
                if buf.capacity() - buf.len() < chunk.len() {
                    buf.reserve((keep as usize).saturating_sub(buf.len()));
                }
                buf.extend_from_slice(&chunk);
            }
            None if first.is_empty() => first = chunk,
            None => {
                let mut buf = BytesMut::with_capacity(keep as usize);
                buf.extend_from_slice(&first);
                buf.extend_from_slice(&chunk);
                gathered = Some(buf);
            }
        }
    }
    // The body is whole: its connection's read buffers are idle again. The
    // hold keeps counting the body itself (what was charged for it).
    intake.shrink(super::buffers::READ_BUFFERS);
    Ok(gathered.map_or(first, BytesMut::freeze))
}

/// `Expect: 100-continue`: the client waits to be told to send its body.
fn expects_continue(session: &Session) -> bool {
    session
        .req_header()
        .headers
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// The next piece of the body, `None` at its end. Every read waits at
/// most until the body's deadline, which its `total` bytes so far have
/// earned (see `BodyDeadline`).
async fn read_chunk(
    session: &mut Session,
    intake: &super::buffers::BodyIntake,
    total: u64,
) -> Result<Option<Bytes>, GatewayError> {
    let read = session.downstream_session.read_request_body();
    let read = match intake.deadline {
        Some(d) => match tokio::time::timeout_at(d.at(total), read).await {
            Ok(r) => r,
            Err(_) => {
                // The rest is still on its way: not reusable, and nothing
                // lingers for a client this slow.
                session.set_keepalive(None);
                return Err(d.expired());
            }
        },
        None => read.await,
    };
    read.map_err(|e| GatewayError::BadRequest(format!("could not read the request body: {e}")))
}

/// Bounds on reading and discarding a refused body after answering, so the
/// client receives the answer instead of a connection reset.
const LINGER_BYTES: usize = 64 * 1024 * 1024;
const LINGER_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// Reads and discards what the client is still sending, within bounds; the
/// connection is closed afterwards (keep-alive was already turned off).
pub async fn linger(session: &mut Session) {
    let drain = async {
        let mut seen = 0usize;
        while let Ok(Some(chunk)) = session.downstream_session.read_request_body().await {
            seen += chunk.len();
            if seen > LINGER_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
}

/// Gives back what a request took on its limits when a later check refused
/// it: the token and money reservations settle at zero (nothing was
/// sent, nothing spent), the in-flight slots are freed.
pub async fn release(env: &Env<'_>, taken: &LimitsTaken) {
    let settle: Vec<(&str, u64)> = taken
        .settle_keys
        .iter()
        .chain(&taken.money_keys)
        .map(|k| (&**k, 0))
        .collect();
    if let Err(e) = env
        .store
        .finish(env.clock.now(), &taken.lease, &settle)
        .await
    {
        log::warn!("limits not released after a refusal: {e}");
    }
}

/// The header that names an agent's task.
pub const TASK_ID_HEADER: http::HeaderName = http::HeaderName::from_static("x-agent-task-id");

/// The task id the agent sent (`x-agent-task-id`): `None` without one (an
/// empty value is none, as the required-header rule reads it: `missing_header`
/// where one is required); refused (400 `invalid_header`) when it is given
/// twice or is not 1-128
/// characters of `A-Z a-z 0-9 - _ . :`, never ignored (an ignored id would
/// switch the loop guard and the watchdog off for the request).
pub fn task_id(session: &Session) -> Result<Option<&str>, GatewayError> {
    task_id_of(&session.req_header().headers)
}

fn task_id_of(headers: &http::HeaderMap) -> Result<Option<&str>, GatewayError> {
    let mut values = headers.get_all(&TASK_ID_HEADER).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Deny::new(
            DenyCode::InvalidHeader,
            "`x-agent-task-id` is given more than once: send one",
        )
        .never_retryable()
        .into());
    }
    if v.as_bytes().trim_ascii().is_empty() {
        return Ok(None);
    }
    match super::ids::RequestIds::accept(v.as_bytes()) {
        Some(id) => Ok(Some(id)),
        None => Err(Deny::new(
            DenyCode::InvalidHeader,
            "`x-agent-task-id` must be 1 to 128 characters of A-Z, a-z, 0-9, `-`, `_`, `.` and `:`",
        )
        .never_retryable()
        .into()),
    }
}

#[cfg(test)]
mod task_id_props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any set of `x-agent-task-id` values: a task id is taken exactly
        /// when one value is sent and it is a valid token, and it is that
        /// value; every other case is refused, none is ignored.
        #[test]
        fn one_valid_task_id_or_refused(
            values in proptest::collection::vec(
                prop_oneof![
                    "[A-Za-z0-9._:-]{1,128}",
                    "[A-Za-z0-9._:-]{129,140}",
                    "[ -~]{0,20}",
                    "\\PC{1,8}",
                ],
                0..3,
            ),
        ) {
            let mut h = http::HeaderMap::new();
            let mut sent = Vec::new();
            for v in &values {
                if let Ok(v) = http::HeaderValue::from_str(v) {
                    sent.push(String::from_utf8_lossy(v.as_bytes()).into_owned());
                    h.append(TASK_ID_HEADER, v);
                }
            }
            let valid = |v: &str| {
                (1..=128).contains(&v.len())
                    && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
            };
            let blank = sent.len() == 1 && sent[0].trim().is_empty();
            match task_id_of(&h) {
                Ok(None) => prop_assert!(sent.is_empty() || blank),
                Ok(Some(id)) => {
                    prop_assert_eq!(sent.len(), 1);
                    prop_assert_eq!(id, sent[0].as_str());
                }
                Err(e) => {
                    prop_assert!(sent.len() > 1 || (sent.len() == 1 && !blank && !valid(&sent[0])));
                    prop_assert_eq!(e.status(), 400);
                }
            }
            // Both directions: a single valid value is always taken.
            if sent.len() == 1 && valid(&sent[0]) {
                prop_assert!(matches!(task_id_of(&h), Ok(Some(_))));
            }
        }
    }
}

#[cfg(test)]
mod framing_props {
    use super::*;
    use proptest::prelude::*;

    fn request(lengths: &[Vec<u8>], chunked: bool) -> Option<pingora::http::RequestHeader> {
        let mut req =
            pingora::http::RequestHeader::build("POST", b"/v1/chat/completions", None).ok()?;
        for l in lengths {
            let v = http::HeaderValue::from_bytes(l).ok()?;
            req.append_header(http::header::CONTENT_LENGTH, v).ok()?;
        }
        if chunked {
            req.insert_header(http::header::TRANSFER_ENCODING, "chunked")
                .ok()?;
        }
        Some(req)
    }

    /// What a length must be, read independently: one decimal number of
    /// 1-19 digits (every such number fits a u64), with optional
    /// whitespace (HTTP's OWS: spaces, tabs) around it.
    fn one_number(v: &[u8]) -> Option<u64> {
        let s = std::str::from_utf8(v).ok()?.trim_matches([' ', '\t']);
        if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    }

    /// Mostly lengths a client sends (19 digits, leading zeros and OWS
    /// included), the rest what a smuggler or a broken client would.
    fn length() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            6 => ("[ \t]{0,2}", "[0-9]{1,19}", "[ \t]{0,2}")
                .prop_map(|(a, d, b)| format!("{a}{d}{b}").into_bytes()),
            1 => "[0-9]{19}".prop_map(String::into_bytes),
            1 => "[0-9]{20,22}".prop_map(String::into_bytes),
            1 => "[0-9]{1,6}(, ?[0-9]{1,6})+".prop_map(String::into_bytes),
            1 => "[+-][0-9]{1,6}".prop_map(String::into_bytes),
            1 => "0[xX][0-9a-f]{1,4}".prop_map(String::into_bytes),
            1 => "[0-9 ,+-]{0,12}".prop_map(String::into_bytes),
            1 => proptest::collection::vec(any::<u8>(), 0..24),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Both directions: no header is no length; one header holding one
        /// number without Transfer-Encoding is that number (refusing it
        /// fails); anything else (two headers, a value that is not one
        /// number, Transfer-Encoding beside it) is refused.
        #[test]
        fn one_decimal_length_or_refused(
            lengths in prop_oneof![
                1 => proptest::collection::vec(length(), 0..=0),
                6 => proptest::collection::vec(length(), 1..=1),
                2 => proptest::collection::vec(length(), 2..=3),
            ],
            chunked in prop_oneof![3 => Just(false), 1 => Just(true)],
        ) {
            // Values no HTTP header can carry (CR, LF, NUL) never arrive.
            let Some(req) = request(&lengths, chunked) else { return Ok(()); };
            let expected = match &lengths[..] {
                [] => Some(None),
                [one] if !chunked => one_number(one).map(Some),
                _ => None,
            };
            let got = declared_length(&req);
            prop_assert_eq!(got.as_ref().ok().copied(), expected, "{:?} chunked {}: {:?}",
                lengths.iter().map(|l| String::from_utf8_lossy(l)).collect::<Vec<_>>(), chunked, got);
        }
    }
}
