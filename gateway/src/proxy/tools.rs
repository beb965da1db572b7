//! The rules of HTTP tool calls: `/tools/{tool}/{path}` on the proxy port.
//!
//! The agent's key decides which tools, methods and paths it may use; the
//! path is percent-decoded and checked before matching, so an encoded
//! traversal (`%2e%2e`, `%2f`) can never reach another path of the tool.
//! Bodies of any type are not read here: they stream through unchanged
//! (a size limit is checked on `Content-Length`).

use super::admit::{declared_length, read_body, Answer, Caller, FailMode, Judged, Judgement};
use super::ctx::{Plan, RequestCtx, ToolPlan};
use super::env::Env;
use crate::error::GatewayError;
use bytes::Bytes;
use loopgate_policy::{Deny, DenyCode, IdemBegin, IdemOutcome};
use pingora_proxy::Session;
use sha2::Digest;
use std::sync::Arc;

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

/// Judges an HTTP tool call: the agent's grant for the tool (method,
/// path by segments, body size), and the idempotency claim.
pub async fn judge(
    session: &mut Session,
    ctx: &mut RequestCtx,
    env: &Env<'_>,
    caller: &Caller<'_>,
    tool_name: &str,
    rest: &str,
) -> Result<Judgement, GatewayError> {
    let rules = caller.rules();
    let cfg = caller.cfg;
    let tool = cfg.tools.get(tool_name).ok_or_else(|| {
        Deny::new(
            DenyCode::NotFound,
            format!("no such tool: `{}`", clip(tool_name)),
        )
    })?;
    let grant = cfg.tool_access[caller.agent_idx]
        .get(tool_name)
        .ok_or_else(|| {
            Deny::new(
                DenyCode::ToolNotAllowed,
                format!("agent `{}` may not call tool `{tool_name}`", rules.name),
            )
        })?;
    let req = session.req_header();
    if !grant.methods.contains(&req.method) {
        let allow: Vec<&str> = grant.methods.iter().map(http::Method::as_str).collect();
        return Err(GatewayError::MethodNotAllowed {
            allow: allow.join(", "),
            message: format!(
                "agent `{}` may not use {} on tool `{tool_name}`",
                rules.name, req.method
            ),
        });
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
        let chunked = req.headers.contains_key(http::header::TRANSFER_ENCODING);
        match declared_length(req)? {
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
    let method = req.method.clone();
    let query = req.uri.query().map(str::to_string);
    let target = match &query {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_string(),
    };
    let side_effecting = !matches!(
        method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    );
    let idem_key = req
        .headers
        .get("idempotency-key")
        .map(|v| super::ids::RequestIds::accept(v.as_bytes()).map(str::to_string));
    let mut fail = FailMode::new(tool.fail_open);
    let mut body = Bytes::new();
    let mut claim = None;
    let mut body_sha: Option<[u8; 32]> = None;
    if let (Some(policy), true) = (&tool.idempotency, side_effecting) {
        let key = match idem_key {
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
                    format!("tool `{tool_name}` requires an Idempotency-Key for {method}"),
                )
                .into())
            }
            None => None,
            Some(Some(key)) => Some(key),
        };
        if let Some(key) = key {
            let limit = grant.max_body_bytes.unwrap_or(1024 * 1024);
            body = read_body(session, limit, &mut ctx.intake).await?;
            // The record is the whole request: a key reused for another
            // method, path or query is a different request (422), never a
            // replay of the first one's answer.
            let mut h = sha2::Sha256::new();
            for part in [method.as_str().as_bytes(), target.as_bytes()] {
                h.update((part.len() as u64).to_be_bytes());
                h.update(part);
            }
            h.update(&body);
            let sha: [u8; 32] = h.finalize().into();
            body_sha = Some(sha2::Sha256::digest(&body).into());
            let record_key = format!("{}:idem:{tool_name}:{key}", rules.name);
            let begin = env
                .store
                .idem_begin(
                    env.clock.now(),
                    &record_key,
                    sha,
                    policy.ttl,
                    policy.retry_after_failure,
                )
                .await
                .map_err(|e| Deny::new(DenyCode::StateUnavailable, e.to_string()).into());
            // Unreadable under `fail_mode: open`: forwarded unprotected.
            match fail.tolerate(begin)? {
                None => {}
                Some(IdemBegin::Fresh) => claim = Some((record_key, policy.max_record_bytes)),
                Some(IdemBegin::Ended(IdemOutcome::Done(record))) => {
                    return Ok(Judgement::Answer(Answer::Replay(record)))
                }
                Some(other) => return Err(refused_claim(other).into()),
            }
        }
    }
    // The task's loop guard sees tool calls too: the same tool, method,
    // path and body in a cycle is stopped like a model loop.
    let loop_call = caller.loop_guard().map(|cfg| {
        loopgate_breaker::fingerprint(
            &format!("tool:{tool_name}"),
            &serde_json::json!({
                "method": method.as_str(),
                "path": decoded,
                "query": query,
                "body_sha256": body_sha.map(hex::encode),
            }),
            cfg,
        )
    });
    // A task that kept getting the same failure from this tool is cut off
    // from it for a while.
    let isolation = caller.task_key().map(|k| {
        (
            format!("{k}/{tool_name}"),
            tool.isolate_after,
            tool.isolate_for,
        )
    });
    Ok(Judgement::Forward(Box::new(Judged {
        route_name: Arc::from(tool.name.as_str()),
        route: tool.route.clone(),
        body,
        body_read: claim.is_some(),
        body_rewritten: false,
        fail,
        estimated_prompt: 0,
        max_tokens: 0,
        task_budget: false,
        extra: Vec::new(),
        loop_call,
        watched: true,
        isolation: isolation.clone(),
        idem_claim: claim.as_ref().map(|(k, _)| k.clone()),
        plan: Plan::Tool(ToolPlan {
            // The raw (validated) path: the tool decodes it as we did.
            target,
            idem: claim,
            expect_json: tool.expect_json,
            isolation,
        }),
    })))
}

/// The refusal for a key whose record forbids going on.
fn refused_claim(begin: IdemBegin) -> Deny {
    match begin {
        IdemBegin::InFlight => Deny::new(
            DenyCode::RequestInProgress,
            "a request with this Idempotency-Key is still in progress",
        )
        .retry_after(std::time::Duration::from_secs(1)),
        IdemBegin::Mismatch => Deny::new(
            DenyCode::IdempotencyKeyReused,
            "this Idempotency-Key was used for a different request (method, path, query or body)",
        ),
        IdemBegin::Ended(IdemOutcome::Failed) => Deny::new(
            DenyCode::OutcomeUnknown,
            "the first request with this Idempotency-Key failed after it was sent; it may have taken effect: check before repeating it",
        ),
        IdemBegin::Ended(IdemOutcome::Unrecorded) => Deny::new(
            DenyCode::OutcomeUnknown,
            "the first request with this Idempotency-Key was answered, but the answer could not be recorded for replay",
        ),
        IdemBegin::Fresh | IdemBegin::Ended(IdemOutcome::Done(_)) => Deny::new(
            DenyCode::PolicyUnavailable,
            "unexpected idempotency state",
        ),
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
        }
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
