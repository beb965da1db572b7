//! Admission of HTTP tool calls: `/tools/{tool}/{path}` on the proxy port.
//!
//! The agent's key decides which tools, methods and paths it may use; the
//! path is percent-decoded and checked before matching, so an encoded
//! traversal (`%2e%2e`, `%2f`) can never reach another path of the tool.
//! Bodies of any type are not read here: they stream through unchanged
//! (a size limit is checked on `Content-Length`).

use super::admit::{AdmitState, Admitted};
use super::ctx::Admission;
use crate::config::Config;
use crate::error::GatewayError;
use loopgate_policy::{Deny, DenyCode, IdemBegin, IdemOutcome, LimitRequest, Verdict};
use pingora_proxy::Session;
use sha2::Digest;
use std::sync::Arc;

/// `Some((tool, rest))` for a `/tools/...` path; `rest` keeps its leading `/`.
pub fn split(path: &str) -> Option<(&str, &str)> {
    let after = path.strip_prefix("/tools/")?;
    Some(match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, "/"),
    })
}

/// Decodes `raw` and refuses anything that could leave the tool's path or
/// that a second reader (the tool, a framework behind it) could read as
/// another path than the one judged here:
/// - `.`/`..` segments, also spelled with path parameters (`..;`, `.;x`)
///   that Tomcat, Jetty and Spring strip before resolving;
/// - empty segments (`//`, `/;/`) and control bytes;
/// - backslashes, and the escapes a second decoder would turn into
///   structure: `%2f` (`/`), `%5c` (`\`), `%3b` (`;`), `%25` (`%`, so
///   `%252e` never becomes `.` two decodes later);
/// - malformed escapes and non-UTF-8.
///
/// Returns the decoded path, used for matching.
pub fn normalize(raw: &str) -> Result<String, String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = raw
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("malformed percent-escape")?;
            if matches!(hex, b'/' | b'\\' | b';' | b'%') {
                return Err(format!(
                    "the escape `{}` is not allowed in a tool path",
                    &raw[i..i + 3]
                ));
            }
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let decoded = String::from_utf8(out).map_err(|_| "path is not UTF-8")?;
    if decoded.bytes().any(|b| b < 0x20 || b == 0x7f || b == b'\\') {
        return Err("control characters and backslashes are not allowed".into());
    }
    let segments: Vec<&str> = decoded.split('/').skip(1).collect();
    for (k, seg) in segments.iter().enumerate() {
        // What a servlet container resolves: the segment without its
        // `;parameters`.
        let name = seg.split(';').next().unwrap_or(seg);
        if name == "." || name == ".." {
            return Err("`.` and `..` segments are not allowed".into());
        }
        if name.is_empty() && (k + 1 < segments.len() || seg.contains(';')) {
            return Err("empty segments (`//`) are not allowed".into());
        }
    }
    Ok(decoded)
}

pub async fn admit_tool(
    session: &mut Session,
    cfg: &Config,
    state: &AdmitState<'_>,
    agent_idx: usize,
    request_id: &str,
    intake: &mut super::buffers::BodyIntake,
) -> Result<Admitted, GatewayError> {
    let rules = &cfg.agents[agent_idx];
    // An owned copy: the body may be read (idempotency) while these are in use.
    let req = session.req_header().clone();
    let path = req.uri.path();
    let (tool_name, rest) = split(path).unwrap_or(("", "/"));
    let tool = cfg.tools.get(tool_name).ok_or_else(|| {
        Deny::new(
            DenyCode::NotFound,
            format!("no such tool: `{}`", clip(tool_name)),
        )
    })?;
    let grant = cfg.tool_access[agent_idx].get(tool_name).ok_or_else(|| {
        Deny::new(
            DenyCode::ToolNotAllowed,
            format!("agent `{}` may not call tool `{tool_name}`", rules.name),
        )
    })?;
    if !grant.methods.contains(&req.method) {
        return Err(Deny::new(
            DenyCode::MethodNotAllowed,
            format!(
                "agent `{}` may not use {} on tool `{tool_name}`",
                rules.name, req.method
            ),
        )
        .into());
    }
    let decoded = normalize(rest)
        .map_err(|why| Deny::new(DenyCode::InvalidPath, format!("invalid tool path: {why}")))?;
    if !grant.paths.allows_path(&decoded) {
        return Err(Deny::new(
            DenyCode::PathNotAllowed,
            format!(
                "agent `{}` may not call `{}` on tool `{tool_name}`",
                rules.name,
                clip(&decoded)
            ),
        )
        .into());
    }
    if let Some(limit) = grant.max_body_bytes {
        let len = super::admit::declared_length(&req)?;
        let chunked = req.headers.contains_key(http::header::TRANSFER_ENCODING);
        match len {
            Some(n) if n > limit => {
                session.set_keepalive(None);
                return Err(Deny::new(
                    DenyCode::BodyTooLarge,
                    format!("request body exceeds the limit of {limit} bytes"),
                )
                .into());
            }
            None if chunked => {
                session.set_keepalive(None);
                return Err(Deny::new(
                    DenyCode::LengthRequired,
                    "this tool has a body size limit: send Content-Length",
                )
                .into());
            }
            _ => {}
        }
    }
    let query = req.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let tool_path = format!("{rest}{query}");
    let side_effecting = !matches!(
        req.method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    );
    let idem_key = req
        .headers
        .get("idempotency-key")
        .map(|v| super::ids::RequestIds::accept(v.as_bytes()).map(str::to_string));

    // Idempotency: hash the body, claim the key, or answer from the record.
    let mut body = bytes::Bytes::new();
    let mut idem = None;
    let mut unsure = Unsure {
        fail_open: tool.fail_open,
        code: None,
    };
    let mut body_read_sha: Option<[u8; 32]> = None;
    if let (Some(policy), true) = (&tool.idempotency, side_effecting) {
        match idem_key {
            Some(None) => {
                return Err(Deny::new(
                    DenyCode::IdempotencyKeyRequired,
                    "Idempotency-Key must be 1-128 characters of [A-Za-z0-9-_.:]",
                )
                .into())
            }
            None if policy.required => {
                return Err(Deny::new(
                    DenyCode::IdempotencyKeyRequired,
                    format!(
                        "tool `{tool_name}` requires an Idempotency-Key for {}",
                        req.method
                    ),
                )
                .into())
            }
            None => {}
            Some(Some(key)) => {
                let limit = grant.max_body_bytes.unwrap_or(1024 * 1024);
                body = super::admit::read_body(session, limit, intake).await?;
                // The record is the whole request: a key reused for another
                // method, path or query is a different request (422), never a
                // replay of the first one's answer.
                let mut h = sha2::Sha256::new();
                for part in [req.method.as_str().as_bytes(), tool_path.as_bytes()] {
                    h.update((part.len() as u64).to_be_bytes());
                    h.update(part);
                }
                h.update(&body);
                let sha: [u8; 32] = h.finalize().into();
                body_read_sha = Some(sha2::Sha256::digest(&body).into());
                let record_key = format!("{}:idem:{tool_name}:{key}", rules.name);
                let begin = state
                    .store
                    .idem_begin(
                        state.clock.now(),
                        &record_key,
                        sha,
                        policy.ttl,
                        policy.retry_after_failure,
                    )
                    .await
                    .map_err(|e| Deny::new(DenyCode::StateUnavailable, e.to_string()));
                let begin = match begin {
                    Ok(b) => Some(b),
                    Err(d) => {
                        unsure.note(d)?;
                        None // forwarded unprotected: fail_mode open says so
                    }
                };
                match begin {
                    None => {}
                    Some(begin) => match begin {
                    IdemBegin::Fresh => idem = Some((record_key, policy.max_record_bytes)),
                    IdemBegin::InFlight => {
                        return Err(Deny::new(
                            DenyCode::RequestInProgress,
                            "a request with this Idempotency-Key is still in progress",
                        )
                        .retry_after(std::time::Duration::from_secs(1))
                        .into())
                    }
                    IdemBegin::Mismatch => {
                        return Err(Deny::new(
                            DenyCode::IdempotencyKeyReused,
                            "this Idempotency-Key was used for a different request (method, path, query or body)",
                        )
                        .into())
                    }
                    IdemBegin::Ended(IdemOutcome::Done(record)) => return Ok(Admitted::Replay(record)),
                    IdemBegin::Ended(IdemOutcome::Failed) => {
                        return Err(Deny::new(
                            DenyCode::OutcomeUnknown,
                            "the first request with this Idempotency-Key failed after it was sent; it may have taken effect: check before repeating it",
                        )
                        .into())
                    }
                    IdemBegin::Ended(IdemOutcome::Unrecorded) => {
                        return Err(Deny::new(
                            DenyCode::OutcomeUnknown,
                            "the first request with this Idempotency-Key was answered, but the answer could not be recorded for replay",
                        )
                        .into())
                    }
                    },
                }
            }
        }
    }

    let mut verdict = Verdict::default();
    let agent_guards = &cfg.guards[agent_idx];
    let task = super::admit::task_id(session);
    // Everything after the idempotency claim; if any of it refuses (or cannot
    // read its state), the call was never sent, so the key is forgotten below.
    let checked = async {
        // Request limits (per minute, in flight) apply to tool calls too, and
        // first: a refused call leaves no task state behind (an agent over
        // its limits cannot grow the guards' maps), and what they took is
        // given back if a guard refuses after them.
        let taken = rules
            .admit_limits(
                state.store,
                state.clock.now(),
                &LimitRequest {
                    extra: &[],
                    estimated_prompt: 0,
                    max_tokens: Some(0),
                    task: None,
                },
                &mut verdict,
            )
            .await;
        let taken = match taken {
            Ok(t) => t,
            Err(d) => {
                unsure.note(d)?;
                loopgate_policy::LimitsTaken::none()
            }
        };
        let guarded = async {
        // The task's loop guard sees tool calls too: the same tool, method,
        // path and body in a cycle is stopped like a model loop.
        if let (Some(loops), Some(task)) = (&agent_guards.loops, task) {
            let call = serde_json::json!({
                "method": req.method.as_str(),
                "path": decoded,
                "query": req.uri.query(),
                "body_sha256": body_read_sha.map(hex::encode),
            });
            let key = format!("{}/{task}", rules.name);
            let what = format!("tool:{tool_name}");
            match super::guards::check_loop_value(state, rules, agent_guards, loops, &key, &what, &call).await {
                Ok(deny) => verdict.judge_external(rules, deny)?,
                Err(e) => unsure.note_error(e)?,
            }
        }

        // The task watchdog counts tool calls too. Red stops the task;
        // `degrade` has no cheaper model to offer a tool call: it only warns.
        let mut guard = None;
        if let (Some(wd), Some(task)) = (&agent_guards.watchdog, task) {
            let key = format!("{}/{task}", rules.name);
            match super::guards::watch(state, rules, wd, &key)
                .or_else(|e| unsure.note_error(e).map(|()| super::guards::Watch::Green))?
            {
                super::guards::Watch::Green => {}
                super::guards::Watch::Warn | super::guards::Watch::Degrade(_) => {
                    guard = Some("warn")
                }
                super::guards::Watch::Stop(deny) => verdict.judge_external(rules, Some(deny))?,
            }
        }

        // A task that kept getting the same failure from this tool is cut off
        // from it for a while.
        let isolation = task.map(|t| {
            (
                format!("{}/{t}/{tool_name}", rules.name),
                tool.isolate_after,
                tool.isolate_for,
            )
        });
        if let Some((key, _, _)) = &isolation {
            let isolated = match state.streaks.isolated(key, state.clock.now()) {
                Ok(i) => i,
                Err(_) => {
                    unsure.note(Deny::new(
                        DenyCode::PolicyUnavailable,
                        "tool isolation state unavailable",
                    ))?;
                    None
                }
            };
            if let Some(after) = isolated {
                let deny = Deny::new(
                    DenyCode::ToolIsolated,
                    format!(
                        "tool `{tool_name}` kept failing the same way for this task; isolated for now"
                    ),
                )
                .retry_after(after)
                .never_retryable();
                verdict.judge_external(rules, Some(deny))?;
            }
        }

        Ok::<_, GatewayError>((guard, isolation))
        }
        .await;
        match guarded {
            Ok((guard, isolation)) => Ok((guard, isolation, taken)),
            Err(e) => {
                super::admit::release(state, &taken).await;
                Err(e)
            }
        }
    }
    .await;
    let (guard, isolation, taken) = match checked {
        Ok(v) => v,
        Err(e) => {
            if let Some((key, _)) = &idem {
                let _ = state.store.idem_finish(state.clock.now(), key, None).await;
            }
            return Err(e);
        }
    };
    Ok(Admitted::Forward(
        Arc::new(Admission {
            request_id: request_id.to_string(),
            agent: rules.name.clone(),
            model: String::new(),
            route_name: Arc::from(tool.name.as_str()),
            route: tool.route.clone(),
            stream: false,
            would_deny: verdict.would_deny.map(|d| d.code),
            task_key: task.map(|t| format!("{}/{t}", rules.name)),
            guard,
            degraded_from: None,
            budget_room: None,
            // The raw (validated) path: the tool decodes it as we did.
            tool_path: Some(tool_path),
            body_read: idem.is_some(),
            idem,
            expect_json: tool.expect_json,
            isolation,
            fail_open: unsure.code,
            mcp: None,
            body_rewritten: false,
            forward_headers: cfg.forward_headers[agent_idx].clone(),
        }),
        body,
        taken,
    ))
}

/// `fail_mode` at work: a check that could not decide (its state was
/// unavailable) refuses under `closed`; under `open` it is noted and the
/// call goes on. Denials and open breakers never come here.
struct Unsure {
    fail_open: bool,
    code: Option<DenyCode>,
}

impl Unsure {
    fn note(&mut self, deny: Deny) -> Result<(), Deny> {
        let undecided = matches!(
            deny.code,
            DenyCode::StateUnavailable | DenyCode::PolicyUnavailable
        );
        if !(self.fail_open && undecided) {
            return Err(deny);
        }
        log::warn!("fail_mode open: forwarding although {}", deny.message);
        self.code.get_or_insert(deny.code);
        Ok(())
    }

    fn note_error(&mut self, e: GatewayError) -> Result<(), GatewayError> {
        match e {
            GatewayError::Denied(d) => self.note(d).map_err(GatewayError::Denied),
            other => Err(other),
        }
    }
}

fn clip(s: &str) -> &str {
    loopgate_policy::clip(s, 200)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What a servlet container behind a tool resolves: each segment
    /// decoded once more (a second decoder), its `;parameters` dropped, dot
    /// segments applied.
    fn second_reader(decoded: &str) -> Option<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        for seg in decoded.split('/').skip(1) {
            let again = normalize(&format!("/{seg}")).ok()?;
            let name = again[1..].split(';').next().unwrap_or("").to_string();
            match name.as_str() {
                "." => {}
                ".." => {
                    out.pop();
                }
                _ => out.push(name),
            }
        }
        Some(out)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Never panics; what it accepts, a second reader reads as the same
        /// segments, so a grant judged on one is the grant the tool serves.
        #[test]
        fn accepted_paths_read_the_same_to_a_second_reader(
            raw in proptest::collection::vec(
                prop_oneof![
                    Just("/"), Just("."), Just(".."), Just(";"), Just("%"), Just("%2e"),
                    Just("%2E"), Just("%2f"), Just("%5c"), Just("%25"), Just("%3b"), Just("\\"),
                    Just("a"), Just("city"), Just("%61"), Just("é"), Just("%c3%a9"), Just("%ff"),
                    Just("\u{0}"), Just("x=1"),
                ],
                0..12,
            )
        ) {
            let raw = format!("/{}", raw.concat());
            if let Ok(decoded) = normalize(&raw) {
                let segments: Vec<String> = decoded
                    .split('/')
                    .skip(1)
                    .map(|s| s.split(';').next().unwrap_or("").to_string())
                    .collect();
                prop_assert_eq!(second_reader(&decoded), Some(segments.clone()), "{}", raw);
                prop_assert!(!segments.iter().any(|s| s == "." || s == ".."), "{}", raw);
                // Segment-boundary grants agree with the segments read.
                let grant = loopgate_policy::PatternList::parse(&["/a/*"]).unwrap();
                if grant.allows_path(&decoded) {
                    prop_assert_eq!(segments.first().map(String::as_str), Some("a"), "{}", raw);
                }
            }
        }

        #[test]
        fn never_panics_on_any_text(raw in "\\PC{0,64}") {
            let _ = normalize(&raw);
            let _ = split(&raw);
        }
    }

    #[test]
    fn splits_tool_paths() {
        assert_eq!(
            split("/tools/weather/v1/forecast"),
            Some(("weather", "/v1/forecast"))
        );
        assert_eq!(split("/tools/weather"), Some(("weather", "/")));
        assert_eq!(split("/v1/chat/completions"), None);
    }

    #[test]
    fn traversal_in_any_spelling_is_refused() {
        for bad in [
            "/a/../b",
            "/..",
            "/a/./b",
            "/a//b",
            "/%2e%2e/admin",
            "/a%2f..%2fb",
            "/a%2F%2E%2E%2Fb",
            "/a\\b",
            "/a%5cb",
            "/a%00",
            "/%zz",
            "/%2",
            "/a%0d%0ab",
            "/v1/city/..;/..;/admin",
            "/v1/city/%2e%2e%3b/admin",
            "/v1/city/..;jsessionid=x/admin",
            "/v1/city/.;/admin",
            "/a/;/b",
            "/a%2fb",
            "/a%3bb",
            "/%252e%252e/admin",
            "/a%25b",
        ] {
            assert!(normalize(bad).is_err(), "{bad}");
        }
        assert_eq!(normalize("/v1/forecast").unwrap(), "/v1/forecast");
        assert_eq!(
            normalize("/v1/city/S%C3%A3o%20Paulo").unwrap(),
            "/v1/city/São Paulo"
        );
        assert_eq!(normalize("/orders/").unwrap(), "/orders/");
        assert_eq!(normalize("/").unwrap(), "/");
    }
}
