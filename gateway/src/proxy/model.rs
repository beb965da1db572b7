//! The rules of model calls (the API endpoints): headers, then the body
//! read whole and judged (model, phrases, output limit, tools the model
//! is given), then the route. And the watchdog's degrade: the same call
//! sent to a cheaper model's route. The output limit is written per
//! attempt, for its target ([`output_edit`]). On a route of both API
//! families the body is translated here, once per target of the other
//! family ([`translate_plan`]), and every attempt sends those bytes.

use super::admit::{
    aside, read_body, Answer, Caller, FailMode, Judged, Judgement, JUDGE_ASIDE_BYTES,
};
use super::buffers::{Held, Room};
use super::ctx::{ModelPlan, Plan, RequestCtx};
use crate::config::runtime::Route;
use crate::config::spec::UnknownPrice;
use crate::error::GatewayError;
use bytes::Bytes;
use loopgate_breaker::{Fingerprint, Fingerprinter, LoopConfig};
use loopgate_policy::prompt::ContextCheck;
use loopgate_policy::{
    clip, inspect_body, inspect_body_with, replace_model, AgentRules, BodyFacts, Deny, DenyCode,
    Endpoint, MoneyAsk, PhraseMatcher, Verdict,
};
use loopgate_translate::request::{MaxTokensField, Options};
use pingora_proxy::Session;
use std::sync::Arc;

pub async fn judge(
    session: &mut Session,
    ctx: &mut RequestCtx,
    caller: &Caller<'_>,
    endpoint: Endpoint,
    verdict: &mut Verdict,
) -> Result<Judgement, GatewayError> {
    let rules = caller.rules();
    {
        let headers = &session.req_header().headers;
        rules.check_head(endpoint, |h| headers.get(h).map(|v| v.as_bytes()), verdict)?;
    }
    if !endpoint.has_body() {
        return Ok(Judgement::Answer(Answer::ListModels(
            caller.agent_idx,
            verdict.would_deny.as_ref().map(|d| d.code),
        )));
    }
    let body = read_body(session, rules.max_body_bytes, &mut ctx.intake).await?;
    // What judging allocates is charged like the body while it runs.
    let work = ctx
        .intake
        .judging(body.len() as u64 * super::buffers::JUDGING_PER_BODY_BYTE)?;
    // Held until the context guard has counted too (on a refusal, until
    // the request ends).
    // A token count is no step of a task: the loop guard never sees it.
    let loops = caller
        .loop_guard()
        .filter(|_| endpoint != Endpoint::CountTokens);
    let (facts, loop_call) = judge_body(endpoint, &body, rules, loops).await?;
    if facts.model.bytes().any(|b| b < 0x20 || b == 0x7f) {
        // It is echoed in headers and logs; no provider names a model so.
        return Err(Deny::new(
            DenyCode::InvalidRequest,
            "`model` must not contain control characters",
        )
        .never_retryable()
        .into());
    }
    let plan = rules.check_body(&facts, verdict)?;
    if endpoint == Endpoint::CountTokens {
        let judged = count_tokens(caller, facts, body, verdict).await;
        ctx.intake.shrink(work);
        return judged;
    }
    let (route_name, route) = find_route(caller, endpoint, &facts.model)?;
    let watch = caller.context_watch();
    let context_share =
        context_guard(endpoint, &route, &facts, &body, plan.output_tokens, watch).await?;
    ctx.intake.shrink(work);
    let money = money_ask(
        caller,
        endpoint,
        &route,
        &facts,
        plan.output_tokens,
        verdict,
    )?;
    let estimated_prompt = facts.estimated_prompt_tokens();
    // Without its usage a stream settles on the gateway's own count; the
    // provider's is exact, so a priced stream asks for it.
    let ask_usage = facts.stream
        && matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Completions)
        && route.call_price(&facts.model).is_ok()
        && loopgate_policy::rewrite::lacks_stream_usage(&body);
    let mut model_plan = ModelPlan {
        endpoint,
        model: facts.model,
        stream: facts.stream,
        degraded_from: None,
        budget_room: None,
        money_room: None,
        settles: false,
        estimated_prompt,
        reserved_output: match endpoint {
            Endpoint::Embeddings => 0,
            _ => plan.output_tokens,
        },
        output: plan.output,
        usage_chunk: false,
        ask_usage,
        native_only: None,
        translated: Translated::default(),
    };
    if route.translates(endpoint) {
        // Boxed: its state does not grow every model call's future.
        let phrases = rules.phrases.clone();
        let found = Box::pin(translate_plan(
            caller.room,
            &route,
            &mut model_plan,
            &body,
            phrases,
        ))
        .await?;
        // A blocked phrase translation decoded is judged as one the agent
        // wrote (dry-run included).
        verdict.judge_external(rules, rules.phrase_deny(found))?;
    }
    Ok(Judgement::Forward(Box::new(Judged {
        route_name,
        route,
        body,
        body_read: true,
        body_rewritten: false,
        // Model calls have no fail_mode: what cannot be decided is refused.
        fail: FailMode::new(false),
        estimated_prompt,
        max_tokens: plan.output_tokens,
        default_output: plan.default_output,
        task_budget: true,
        extra: Vec::new(),
        money,
        loop_call,
        watched: true,
        context_share,
        isolation: None,
        idem_claim: None,
        plan: Plan::Model(model_plan),
    })))
}

/// `POST /v1/messages/count_tokens`, judged like a Messages call (key,
/// paths, model, tools, phrases, body checks: done by the caller). Sent to
/// the Anthropic-family targets of the model's route only (the OpenAI API
/// has no such endpoint; the route is narrowed to them for this call),
/// and answered with `x-loopgate-count: provider`. A route without one is
/// answered by the gateway: the prompt's tokens as its tokenizer counts
/// them (its estimate where the model has none), `{"input_tokens": N}`,
/// `x-loopgate-count: estimated`. Either way the call is charged to no
/// budget and is no step for the loop guard or the watchdog: it takes
/// only the request rate and an in-flight slot.
async fn count_tokens(
    caller: &Caller<'_>,
    facts: BodyFacts,
    body: Bytes,
    verdict: &Verdict,
) -> Result<Judgement, GatewayError> {
    let (name, route) = caller.cfg.routes.find(&facts.model).ok_or_else(|| {
        Deny::new(
            DenyCode::UnknownModel,
            format!("no route for model `{}`", clip(&facts.model, 200)),
        )
    })?;
    let counting: Vec<&crate::config::runtime::Target> = route
        .targets
        .iter()
        .filter(|t| t.provider.serves(Endpoint::CountTokens))
        .collect();
    if counting.is_empty() {
        let estimate = facts.estimated_prompt_tokens();
        let model = route.sent_model(0, &facts.model).to_string();
        let small = body.len() <= JUDGE_ASIDE_BYTES;
        let count = move || {
            loopgate_policy::prompt::count_prompt(Endpoint::CountTokens, &model, &body, estimate).0
        };
        // Counting a large prompt's tokens is judging work.
        let tokens = if small { count() } else { aside(count).await? };
        return Ok(Judgement::Answer(Answer::CountTokens(
            tokens,
            verdict.would_deny.as_ref().map(|d| d.code),
        )));
    }
    let route = if counting.len() == route.targets.len() {
        route.clone()
    } else {
        // Only for this call: a count on a route of both families.
        Arc::new(Route {
            targets: counting
                .iter()
                .map(|t| crate::config::runtime::Target {
                    provider: t.provider.clone(),
                    weight: t.weight,
                    model: t.model.clone(),
                    chat_limit_field: t.chat_limit_field,
                })
                .collect(),
            max_attempts: route.max_attempts,
            max_total: route.max_total,
            models: route.models.clone(),
            has_anthropic: true,
            has_openai: false,
        })
    };
    Ok(Judgement::Forward(Box::new(Judged {
        route_name: Arc::from(name),
        route,
        body,
        body_read: true,
        body_rewritten: false,
        fail: FailMode::new(false),
        estimated_prompt: 0,
        max_tokens: 0,
        default_output: None,
        task_budget: false,
        extra: Vec::new(),
        money: None,
        loop_call: None,
        watched: false,
        context_share: None,
        isolation: None,
        idem_claim: None,
        plan: Plan::Model(ModelPlan {
            endpoint: Endpoint::CountTokens,
            model: facts.model,
            stream: false,
            degraded_from: None,
            budget_room: None,
            money_room: None,
            settles: false,
            estimated_prompt: 0,
            reserved_output: 0,
            output: loopgate_policy::OutputLimit::default(),
            usage_chunk: false,
            ask_usage: false,
            native_only: None,
            translated: Translated::default(),
        }),
    })))
}

/// The context window guard: the prompt plus the output limit per
/// completion (`max_tokens`, the agent's inserted limit or the default
/// output) must fit the window of the model the route's first target is
/// sent, when the catalog knows that window. Embeddings have no output.
/// Returns the share of the window the prompt fills when the watchdog
/// may act on it (it reaches `watch`).
async fn context_guard(
    endpoint: Endpoint,
    route: &Route,
    facts: &loopgate_policy::BodyFacts,
    body: &Bytes,
    output_tokens: u64,
    watch: Option<f64>,
) -> Result<Option<f64>, GatewayError> {
    let sent = route.sent_model(0, &facts.model);
    let Some((window, max_output)) = route.models.prices.window(sent) else {
        return Ok(None);
    };
    // The model never writes more than its own maximum.
    let output = match endpoint {
        Endpoint::Embeddings => 0,
        _ => (output_tokens / facts.choices()).min(max_output.unwrap_or(u64::MAX)),
    };
    let (estimate, messages) = (
        facts.estimated_prompt_tokens(),
        facts.messages.unwrap_or(0) as u64,
    );
    let check = move |model: &str, body: &[u8]| {
        ContextCheck {
            endpoint,
            model,
            window,
            output,
            estimate,
            messages,
            watch,
        }
        .check(body)
    };
    if body.len() <= JUDGE_ASIDE_BYTES {
        return Ok(check(sent, body)?);
    }
    // Counting a large prompt's tokens is judging work too.
    let (sent, body) = (sent.to_string(), body.clone());
    Ok(aside(move || check(&sent, &body)).await??)
}

/// What a model call reserves from its agent's money budgets, when any
/// applies: the prompt estimate at the input price plus the output limit
/// (`max_tokens` × `n`, the inserted limit, or `budgets.default_max_tokens`;
/// none for embeddings) at the output price. The price is the dearest of
/// the route's targets (a fallback may serve it), so the reservation
/// covers whichever answers. A target without a price is refused with 402
/// `price_unknown` under `on_unknown_price: deny`, or counted as free
/// under `zero`.
fn money_ask(
    caller: &Caller<'_>,
    endpoint: Endpoint,
    route: &Route,
    facts: &BodyFacts,
    output_tokens: u64,
    verdict: &mut Verdict,
) -> Result<Option<MoneyAsk>, Deny> {
    let rules = caller.rules();
    if !rules.money_budgeted() {
        return Ok(None);
    }
    let price = match (route.call_price(&facts.model), caller.cfg.on_unknown_price) {
        (Ok(p), _) => p,
        (Err(_), UnknownPrice::Zero) => route.known_price(&facts.model),
        (Err(sent), UnknownPrice::Deny) => {
            let deny = Deny::new(
                DenyCode::PriceUnknown,
                format!(
                    "model `{}` has no price, and agent `{}` spends under a money budget \
                     (on_unknown_price: deny); give it a price under `models:` or its provider",
                    clip(sent, 200),
                    rules.name
                ),
            )
            .never_retryable();
            verdict.judge_external(rules, Some(deny))?;
            // Dry-run: reported, and counted at the prices known.
            route.known_price(&facts.model)
        }
    };
    let output = match endpoint {
        Endpoint::Embeddings => 0,
        _ => output_tokens,
    };
    let prompt = facts.estimated_prompt_tokens();
    Ok(Some(MoneyAsk {
        reserve: price.reserve_micros(prompt, output),
        prompt: price.reserve_micros(prompt, 0),
        price,
    }))
}

/// Judges the body (facts, blocked phrases) and, when the task's loop
/// guard is on (`loops`), fingerprints it from the tokens of the same one
/// pass (as the agent sent it: the output limit is written per attempt).
///
/// A large body is judged on the blocking pool, at most as many at once
/// as there are CPUs: judging costs up to a few tens of milliseconds per
/// MiB of hostile text, and on a runtime thread it would hold up every
/// other request of that thread (another agent's small call waited out
/// whole judgings). Judging is linear and bounded (see `policy::body`),
/// so the pool's queue only makes hostile bodies wait for each other.
async fn judge_body(
    endpoint: Endpoint,
    body: &Bytes,
    rules: &AgentRules,
    loops: Option<&LoopConfig>,
) -> Result<(BodyFacts, Option<Fingerprint>), GatewayError> {
    if body.len() <= JUDGE_ASIDE_BYTES {
        return Ok(judge_now(endpoint, body, rules.phrases.as_deref(), loops)?);
    }
    let (body, phrases, loops) = (body.clone(), rules.phrases.clone(), loops.cloned());
    Ok(aside(move || judge_now(endpoint, &body, phrases.as_deref(), loops.as_ref())).await??)
}

/// [`judge_body`]'s work, on the calling thread.
fn judge_now(
    endpoint: Endpoint,
    body: &[u8],
    phrases: Option<&loopgate_policy::PhraseMatcher>,
    loops: Option<&LoopConfig>,
) -> Result<(BodyFacts, Option<Fingerprint>), Deny> {
    match loops {
        Some(cfg) => {
            let mut fp = Fingerprinter::new(endpoint.path(), cfg);
            let facts = inspect_body_with(endpoint, body, phrases, &mut fp)?;
            Ok((facts, Some(fp.finish())))
        }
        None => Ok((inspect_body(endpoint, body, phrases)?, None)),
    }
}

/// The route serving `model` on `endpoint`.
fn find_route(
    caller: &Caller<'_>,
    endpoint: Endpoint,
    model: &str,
) -> Result<(Arc<str>, Arc<Route>), GatewayError> {
    let (name, route) = caller.cfg.routes.find(model).ok_or_else(|| {
        Deny::new(
            DenyCode::UnknownModel,
            format!("no route for model `{}`", clip(model, 200)),
        )
    })?;
    // Every target speaks the agent's API, or (on a route of both
    // families) the other chat API, translated.
    if !route
        .targets
        .iter()
        .all(|t| t.provider.serves(endpoint) || t.provider.translates(endpoint))
    {
        return Err(GatewayError::UnsupportedEndpoint {
            model: model.to_string(),
        });
    }
    Ok((Arc::from(name), route.clone()))
}

/// The bodies of a translated call's attempts to providers of the other
/// API family, translated once at admission ([`translate_plan`]): every
/// attempt and fallback to a target resends the same bytes, and none
/// translates on the runtime's threads or uncharged.
#[derive(Default)]
pub struct Translated {
    /// By target: its body in its family (`None`: it speaks the agent's).
    bodies: Vec<Option<Bytes>>,
    /// What the bodies hold in the gateway's body memory, given back with
    /// the admission.
    _held: Option<Held>,
    /// The agent's room, for the translated answer a target sends back
    /// (`features::translate`).
    pub room: Option<Room>,
}

impl std::fmt::Debug for Translated {
    /// Sizes only: the bodies carry the agent's prompt.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sizes: Vec<Option<usize>> = self
            .bodies
            .iter()
            .map(|b| b.as_ref().map(Bytes::len))
            .collect();
        f.debug_struct("Translated")
            .field("bodies", &sizes)
            .finish_non_exhaustive()
    }
}

/// What a target's body is written from: the judged call.
#[derive(Clone, Copy)]
struct Sent<'p> {
    endpoint: Endpoint,
    model: &'p str,
    /// The model the agent named (before a degrade).
    named: &'p str,
    output: loopgate_policy::OutputLimit,
}

impl<'p> Sent<'p> {
    fn of(plan: &'p ModelPlan) -> Sent<'p> {
        Sent {
            endpoint: plan.endpoint,
            model: &plan.model,
            named: plan.degraded_from.as_deref().unwrap_or(&plan.model),
            output: plan.output,
        }
    }
}

/// On a route whose targets speak both API families: the body every
/// target of the other family is sent, translated once here. A body the
/// other family cannot read faithfully is sent as written to the targets
/// of the agent's family and never to the others (`native_only`: a
/// fallback across families is given up for this call, never a field
/// dropped); a route with no target of the agent's family refuses it
/// before anything is sent (400 `untranslatable_request`, naming the
/// field). Sets the OpenAI agent's `stream_options.include_usage` (its
/// translated stream ends with a usage chunk only if it asked).
/// Same-family routes: nothing done.
///
/// What translation makes is judged as the agent's body was (the same
/// `inspect_body`, in the target family: blocked phrases, nesting depth,
/// duplicate keys, the tool-bearing shapes): translation decodes text the
/// first judging saw still encoded, the JSON inside a tool call's
/// `arguments` string (`\\u0069gnore` is `ignore` once it is Anthropic's
/// `input` object, and an `arguments` nested 100 deep becomes a body 100
/// deep), so a refusal of the translated body refuses the call before
/// anything is sent. This second judging runs only on routes that
/// translate.
///
/// Judging work: translation parses the body into a tree and builds the
/// other family's, so what both may hold (twice the tree's bound,
/// `policy::json::parse_cost`: a body of tiny objects makes a tree a
/// hundred times its size) is charged like judging while it runs, and a
/// large body is translated off the runtime's threads. The translated
/// bodies are charged for as long as the admission holds them.
async fn translate_plan(
    room: &Room,
    route: &Arc<Route>,
    plan: &mut ModelPlan,
    body: &Bytes,
    phrases: Option<Arc<PhraseMatcher>>,
) -> Result<Option<usize>, GatewayError> {
    plan.usage_chunk = false;
    plan.native_only = None;
    plan.translated = Translated::default();
    if !route.translates(plan.endpoint) {
        return Ok(None);
    }
    let mut work = room.hold();
    work.judging(loopgate_policy::json::parse_cost(body).saturating_mul(2))?;
    let held = room.hold();
    let translated = if body.len() <= JUDGE_ASIDE_BYTES {
        translate_all(route, Sent::of(plan), body, held, phrases.as_deref())?
    } else {
        let (route, body) = (route.clone(), body.clone());
        let (endpoint, output) = (plan.endpoint, plan.output);
        let (model, named) = (plan.model.clone(), Sent::of(plan).named.to_string());
        aside(move || {
            let sent = Sent {
                endpoint,
                model: &model,
                named: &named,
                output,
            };
            translate_all(&route, sent, &body, held, phrases.as_deref())
        })
        .await??
    };
    drop(work);
    let (bodies, usage_chunk, held, found) = match translated {
        Ok(t) => t,
        Err(why)
            if route
                .targets
                .iter()
                .any(|t| t.provider.serves(plan.endpoint)) =>
        {
            plan.native_only = Some(Arc::from(why.to_string()));
            return Ok(None);
        }
        Err(why) => {
            return Err(Deny::new(
                DenyCode::UntranslatableRequest,
                format!(
                    "this route sends the request to a provider of the other API family, and {why}"
                ),
            )
            .never_retryable()
            .into())
        }
    };
    plan.usage_chunk = usage_chunk;
    plan.translated = Translated {
        bodies,
        _held: Some(held),
        room: Some(room.clone()),
    };
    Ok(found)
}

/// The bodies of [`translate_all`], by target, the OpenAI agent's
/// `include_usage`, what holds the bodies' bytes, and the first blocked
/// phrase found in a translated body.
type TranslatedAll = (Vec<Option<Bytes>>, bool, Held, Option<usize>);

/// [`translate_plan`]'s work, on the calling thread: each target of the
/// other family's body (renamed and limited for it, then translated),
/// one translation shared by targets whose input and options agree; the
/// bytes kept are counted in `held`. `Ok(Err(why))`: the body cannot be
/// translated faithfully (what the caller does with that depends on the
/// route); `Err`: the gateway could not do the work, or the translated
/// body is refused as the agent's would be. A blocked phrase (of
/// `phrases`, the agent's) found in it is returned for the call's verdict.
fn translate_all(
    route: &Route,
    sent: Sent<'_>,
    body: &[u8],
    mut held: Held,
    phrases: Option<&PhraseMatcher>,
) -> Result<Result<TranslatedAll, loopgate_translate::Untranslatable>, GatewayError> {
    let from = super::features::translate::endpoint_family(sent.endpoint).ok_or_else(|| {
        GatewayError::Internal("a translated route on a non-chat endpoint".into())
    })?;
    let mut bodies: Vec<Option<Bytes>> = Vec::with_capacity(route.targets.len());
    let mut made: Vec<(Option<Vec<u8>>, Options, Bytes)> = Vec::new();
    let mut usage_chunk = false;
    let mut found = None;
    for target in 0..route.targets.len() {
        if !sends_translated(route, target, sent.endpoint) {
            bodies.push(None);
            continue;
        }
        let input = agent_body(route, target, sent, body)?;
        let opts = options(route, target, sent);
        if let Some((_, _, same)) = made.iter().find(|(i, o, _)| *i == input && *o == opts) {
            bodies.push(Some(same.clone()));
            continue;
        }
        let t = match loopgate_translate::request::translate(
            from,
            input.as_deref().unwrap_or(body),
            &opts,
        ) {
            Ok(t) => t,
            Err(why) => return Ok(Err(why)),
        };
        usage_chunk = t.usage_chunk;
        let out = serde_json::to_vec(&t.body)
            .map(Bytes::from)
            .map_err(|_| GatewayError::Internal("cannot write the translated body".into()))?;
        drop(t);
        held.grow_beside(out.len() as u64, "the translated request")?;
        // Judged like the agent's body: what decoding `arguments` made
        // must pass the same checks (see `translate_plan`).
        let to = match from {
            loopgate_translate::Family::OpenAi => Endpoint::Messages,
            loopgate_translate::Family::Anthropic => Endpoint::ChatCompletions,
        };
        found = found.or(inspect_body(to, &out, phrases)?.blocked_phrase);
        bodies.push(Some(out.clone()));
        made.push((input, opts, out));
    }
    Ok(Ok((bodies, usage_chunk, held, found)))
}

/// Whether attempt `target` of a call on `endpoint` goes to a provider of
/// the other family.
fn sends_translated(route: &Route, target: usize, endpoint: Endpoint) -> bool {
    route.translates(endpoint)
        && route
            .targets
            .get(target)
            .is_some_and(|t| t.provider.translates(endpoint))
}

/// The watchdog's red `degrade`: the call goes to `to`'s route with the
/// model renamed in the body (translated again for that route's targets
/// of the other family). `false`: not a model call, or already `to`
/// (then it is only warned).
pub async fn degrade(caller: &Caller<'_>, j: &mut Judged, to: &str) -> Result<bool, GatewayError> {
    let Plan::Model(m) = &mut j.plan else {
        return Ok(false);
    };
    if m.model == to {
        return Ok(false);
    }
    let Some(renamed) = replace_model(&j.body, to) else {
        return Ok(false);
    };
    let (name, route) = find_route(caller, m.endpoint, to)?;
    let renamed = Bytes::from(renamed);
    m.degraded_from = Some(std::mem::replace(&mut m.model, to.to_string()));
    let phrases = caller.rules().phrases.clone();
    // The body was judged, translated, under the call's verdict at
    // admission; a degrade renames the model only, so a phrase found again
    // was found then (and only reported, under dry-run).
    let _found = Box::pin(translate_plan(caller.room, &route, m, &renamed, phrases)).await?;
    j.body = renamed;
    j.body_rewritten = true;
    j.route_name = name;
    j.route = route;
    Ok(true)
}

/// The body attempt `target` of an admitted model call sends, when it
/// differs from `base` (the judged body): for a target of the other
/// family, its translation made at admission; otherwise the target's
/// model name, the output limit under the field the target reads,
/// capped at its model's maximum (see `loopgate_policy::output`), and a
/// stream's request for its usage ([`ModelPlan::ask_usage`]). `Err`
/// when the body cannot be rewritten (it was judged a JSON object, so
/// never in practice).
pub fn attempt_body(
    route: &Route,
    target: usize,
    plan: &ModelPlan,
    base: &Bytes,
) -> Result<Option<Bytes>, GatewayError> {
    if sends_translated(route, target, plan.endpoint) {
        return match plan.translated.bodies.get(target) {
            Some(Some(body)) => Ok(Some(body.clone())),
            _ => Err(GatewayError::Internal(
                "no translated body for this target".into(),
            )),
        };
    }
    let body = agent_body(route, target, Sent::of(plan), base)?;
    if plan.ask_usage {
        let asked = loopgate_policy::rewrite::with_stream_usage(body.as_deref().unwrap_or(base));
        if let Some(asked) = asked {
            return Ok(Some(Bytes::from(asked)));
        }
    }
    Ok(body.map(Bytes::from))
}

/// The body `target` is sent in the agent's family, when it differs from
/// `base`: renamed and limited for it.
fn agent_body(
    route: &Route,
    target: usize,
    sent: Sent<'_>,
    base: &[u8],
) -> Result<Option<Vec<u8>>, GatewayError> {
    let rename = route.targets.get(target).and_then(|t| t.model.as_deref());
    if rename.is_none() && sent.output == loopgate_policy::OutputLimit::default() {
        // No limit in the body and none to set: nothing to look up.
        return Ok(None);
    }
    let model = rename.unwrap_or(sent.model);
    let edit = route
        .target_output(target, sent.endpoint, model, sent.named)
        .and_then(|t| sent.output.edit(&t));
    if rename.is_none() && edit.is_none() {
        return Ok(None);
    }
    let cannot = || GatewayError::Internal("cannot rewrite the body for this target".into());
    let mut body = match rename {
        Some(model) => replace_model(base, model).ok_or_else(cannot)?,
        None => base.to_vec(),
    };
    if let Some(edit) = edit {
        body = loopgate_policy::rewrite::apply_limit_edit(&body, &edit).ok_or_else(cannot)?;
    }
    Ok(Some(body))
}

/// How the body is translated for `target`, a provider of the other
/// family. Anthropic's required `max_tokens`, when the agent set none and
/// no agent limit was inserted: the model's output maximum from `models:`
/// or the price catalog, else 4096. An OpenAI target gets the limit under
/// the field it reads.
fn options(route: &Route, target: usize, sent: Sent<'_>) -> Options {
    let model = route.sent_model(target, sent.model);
    let default_max_tokens = route
        .models
        .find(model)
        .and_then(|m| m.max_output_tokens)
        .or_else(|| route.models.prices.window(model).and_then(|(_, m)| m))
        .unwrap_or(4096);
    let field = route
        .target_output(target, Endpoint::ChatCompletions, model, sent.named)
        .map(|t| t.field);
    Options {
        default_max_tokens,
        openai_max_tokens_field: match field {
            Some(loopgate_policy::LimitField::MaxCompletionTokens) => {
                MaxTokensField::MaxCompletionTokens
            }
            _ => MaxTokensField::MaxTokens,
        },
    }
}
