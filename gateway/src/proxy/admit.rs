//! Admission in `request_filter`: identify the agent, read and judge the
//! body, pick the route. Runs before anything goes upstream; every refusal
//! is answered here, never by failing a later hook (Pingora would still
//! contact the upstream after a `request_body_filter` error).

use super::ctx::Admission;
use super::guards;
use crate::config::Config;
use crate::error::GatewayError;
use crate::metrics::Metrics;
use bytes::{Bytes, BytesMut};
use loopgate_policy::{
    inspect_body, replace_model, Clock, Deny, DenyCode, Endpoint, LimitRequest, LimitsTaken,
    StateStore, Verdict, Watchdog,
};
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
    /// `GET /v1/models`: answered by the gateway for this agent.
    ListModels(usize, Verdict),
    /// A repeated idempotency key: the recorded tool response, replayed.
    Replay(loopgate_policy::IdemRecord),
    /// An MCP message the gateway answers itself: a JSON-RPC error body.
    Rpc {
        status: u16,
        body: Vec<u8>,
        deny: loopgate_policy::Deny,
    },
}

/// The endpoint a request addresses, or the denial for an unknown one.
pub fn endpoint_of(session: &Session) -> Result<Endpoint, GatewayError> {
    let req = session.req_header();
    let endpoint = Endpoint::from_path(req.uri.path()).ok_or_else(|| {
        Deny::new(
            DenyCode::NotFound,
            format!(
                "no such endpoint: {} {}",
                req.method,
                truncate(req.uri.path(), 200)
            ),
        )
    })?;
    if req.method.as_str() != endpoint.method() {
        return Err(Deny::new(
            DenyCode::MethodNotAllowed,
            format!("{} only accepts {}", endpoint.path(), endpoint.method()),
        )
        .into());
    }
    Ok(endpoint)
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
    // A client that asked to wait (`Expect: 100-continue`) sends the body only
    // after we said so, which we do only once the cheap checks passed.
    let expects_continue = session
        .req_header()
        .headers
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if declared.is_some_and(|n| n > limit) {
        // The unread body stays on the wire: this connection cannot be reused.
        session.set_keepalive(None);
        intake.linger = !expects_continue;
        return Err(too_large());
    }
    if expects_continue {
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
        let chunk = session
            .downstream_session
            .read_request_body()
            .await
            .map_err(|e| {
                GatewayError::BadRequest(format!("could not read the request body: {e}"))
            })?;
        let Some(chunk) = chunk else { break };
        total += chunk.len() as u64;
        if total > limit {
            session.set_keepalive(None);
            intake.linger = true;
            return Err(too_large());
        }
        // Counted before it is kept; refused, the rest stays unread (the
        // connection closes: nothing lingers to read it off).
        if let Err(e) = intake.grow(chunk.len() as u64) {
            session.set_keepalive(None);
            return Err(e);
        }
        match gathered.as_mut() {
            Some(buf) => buf.extend_from_slice(&chunk),
            None if first.is_empty() => first = chunk,
            None => {
                let cap = declared.unwrap_or(0).clamp(total, limit) as usize;
                let mut buf = BytesMut::with_capacity(cap);
                buf.extend_from_slice(&first);
                buf.extend_from_slice(&chunk);
                gathered = Some(buf);
            }
        }
    }
    Ok(gathered.map_or(first, BytesMut::freeze))
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

/// Judges an authenticated request in the documented order (see the
/// `policy` crate); on success returns what to forward.
pub async fn admit(
    session: &mut Session,
    cfg: &Config,
    state: &AdmitState<'_>,
    agent_idx: usize,
    endpoint: Endpoint,
    request_id: &str,
    intake: &mut super::buffers::BodyIntake,
) -> Result<Admitted, GatewayError> {
    let rules = &cfg.agents[agent_idx];
    let mut verdict = Verdict::default();
    {
        let headers = &session.req_header().headers;
        rules.check_head(
            endpoint,
            |h| headers.get(h).map(|v| v.as_bytes()),
            &mut verdict,
        )?;
    }
    if !endpoint.has_body() {
        return Ok(Admitted::ListModels(agent_idx, verdict));
    }
    let body = read_body(session, rules.max_body_bytes, intake).await?;
    let facts = inspect_body(endpoint, &body, rules.phrases.as_deref())?;
    if facts.model.bytes().any(|b| b < 0x20 || b == 0x7f) {
        // It is echoed in headers and logs; no provider names a model so.
        return Err(Deny::new(
            DenyCode::InvalidRequest,
            "`model` must not contain control characters",
        )
        .never_retryable()
        .into());
    }
    let plan = rules.check_body(&facts, &mut verdict)?;
    // An agent that set no output limit gets its own: the provider's
    // default can be far above it. The body changes, so every attempt
    // sends ours.
    let mut body = body;
    let mut rewritten = false;
    if let Some((field, limit)) = plan.insert_max_tokens {
        let Some(with) = loopgate_policy::rewrite::insert_field(&body, field, &limit) else {
            return Err(GatewayError::Internal("cannot set the output limit".into()));
        };
        body = Bytes::from(with);
        rewritten = true;
    }
    let find_route = |model: &str| {
        let found = cfg.routes.find(model).ok_or_else(|| {
            Deny::new(
                DenyCode::UnknownModel,
                format!("no route for model `{}`", truncate(model, 200)),
            )
        })?;
        // All targets of a route speak one API family (checked at load).
        if !found.1.targets.iter().all(|t| t.provider.serves(endpoint)) {
            return Err(GatewayError::UnsupportedEndpoint {
                model: model.to_string(),
            });
        }
        Ok::<_, GatewayError>(found)
    };
    let (mut route_name, mut route) = find_route(&facts.model)?;
    let mut model = facts.model.clone();

    // Limits before the task guards: a request the limits refuse leaves no
    // loop or watchdog state behind (a refused agent cannot grow it), and
    // what the guards then refuse gives its reservation back.
    let task = task_id(session);
    let task_key = task.map(|t| format!("{}/{t}", rules.name));
    let limit_req = LimitRequest {
        extra: &[],
        estimated_prompt: facts.estimated_prompt_tokens(),
        max_tokens: Some(plan.output_tokens),
        task,
    };
    let taken = rules
        .admit_limits(state.store, state.clock.now(), &limit_req, &mut verdict)
        .await?;
    if let (Some(used), Some(key)) = (taken.task_budget_used, &task_key) {
        state.watchdog.budget_used(key, used);
    }
    let guarded = async {
        // Agent guards, per task: loops, then the watchdog.
        let agent_guards = &cfg.guards[agent_idx];
        if let (Some(loops), Some(key)) = (&agent_guards.loops, &task_key) {
            let deny =
                guards::check_loop(state, rules, agent_guards, loops, key, endpoint, &body).await?;
            verdict.judge_external(rules, deny)?;
        }
        let mut guard = None;
        let mut degraded_from = None;
        if let (Some(wd), Some(key)) = (&agent_guards.watchdog, &task_key) {
            match guards::watch(state, rules, wd, key)? {
                guards::Watch::Green => {}
                guards::Watch::Warn => guard = Some("warn"),
                guards::Watch::Stop(deny) => verdict.judge_external(rules, Some(deny))?,
                guards::Watch::Degrade(to) if to != model => {
                    let (name, r) = find_route(&to)?;
                    if let Some(rewritten) = replace_model(&body, &to) {
                        body = Bytes::from(rewritten);
                        degraded_from = Some(std::mem::replace(&mut model, to));
                        route_name = name;
                        route = r;
                        guard = Some("degraded");
                    }
                }
                guards::Watch::Degrade(_) => guard = Some("warn"),
            }
        }
        Ok::<_, GatewayError>((guard, degraded_from, model, route_name, route, body))
    }
    .await;
    let (guard, degraded_from, model, route_name, route, body) = match guarded {
        Ok(v) => v,
        Err(e) => {
            release(state, &taken).await;
            return Err(e);
        }
    };
    Ok(Admitted::Forward(
        Arc::new(Admission {
            request_id: request_id.to_string(),
            agent: rules.name.clone(),
            model,
            route_name: Arc::from(route_name),
            route: route.clone(),
            stream: facts.stream,
            would_deny: verdict.would_deny.map(|d| d.code),
            task_key,
            guard,
            degraded_from,
            budget_room: taken.budget_room,
            tool_path: None,
            body_read: true,
            idem: None,
            expect_json: false,
            isolation: None,
            fail_open: None,
            mcp: None,
            body_rewritten: rewritten,
            forward_headers: cfg.forward_headers[agent_idx].clone(),
        }),
        body,
        taken,
    ))
}

/// Gives back what a request took on its limits when a later check refused
/// it: the token reservations settle at zero (nothing was spent), the
/// in-flight slots are freed.
pub async fn release(state: &AdmitState<'_>, taken: &LimitsTaken) {
    let settle: Vec<(&str, u64)> = taken.settle_keys.iter().map(|k| (&**k, 0)).collect();
    if let Err(e) = state
        .store
        .finish(state.clock.now(), &taken.lease, &settle)
        .await
    {
        log::warn!("limits not released after a refusal: {e}");
    }
}

/// The header that names an agent's task.
pub const TASK_ID_HEADER: http::HeaderName = http::HeaderName::from_static("x-agent-task-id");

/// The task id the agent sent (`x-agent-task-id`), when it is a sane token.
pub fn task_id(session: &Session) -> Option<&str> {
    let v = session.req_header().headers.get(&TASK_ID_HEADER)?;
    super::ids::RequestIds::accept(v.as_bytes())
}

/// The shared state admission consults besides the config snapshot.
pub struct AdmitState<'a> {
    pub store: &'a dyn StateStore,
    pub clock: &'a dyn Clock,
    pub streaks: &'a loopgate_breaker::FailureStreaks,
    pub watchdog: &'a Watchdog,
    pub metrics: &'a Metrics,
}

/// Cuts agent-controlled text echoed in messages to a bounded length.
fn truncate(s: &str, max: usize) -> &str {
    loopgate_policy::clip(s, max)
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// A length is read only from one header holding one decimal
        /// number, and it is that number; anything else is refused.
        #[test]
        fn one_decimal_length_or_refused(
            lengths in proptest::collection::vec(
                prop_oneof![
                    "[0-9]{1,20}".prop_map(String::into_bytes),
                    "[0-9 ,+-]{0,12}".prop_map(String::into_bytes),
                    proptest::collection::vec(any::<u8>(), 0..24),
                ],
                0..3,
            ),
            chunked in any::<bool>(),
        ) {
            let Some(req) = request(&lengths, chunked) else { return Ok(()); };
            match declared_length(&req) {
                Ok(None) => prop_assert!(lengths.is_empty()),
                Ok(Some(n)) => {
                    prop_assert_eq!(lengths.len(), 1);
                    prop_assert!(!chunked);
                    let text = std::str::from_utf8(lengths[0].trim_ascii()).unwrap();
                    prop_assert!(text.bytes().all(|b| b.is_ascii_digit()));
                    prop_assert_eq!(text.parse::<u64>().ok(), Some(n));
                }
                Err(_) => prop_assert!(!lengths.is_empty()),
            }
        }
    }
}
