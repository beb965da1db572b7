//! The rules of HTTP tool calls: `/tools/{tool}/{path}` on the proxy port.
//!
//! The agent's key decides which tools, methods and paths it may use; the
//! path is percent-decoded and checked before matching, so an encoded
//! traversal (`%2e%2e`, `%2f`) can never reach another path of the tool.
//! Bodies of any type stream through unchanged (a size limit is checked on
//! `Content-Length`), unless an `Idempotency-Key` makes the body part of
//! the record: then `features::idempotency` reads it to claim the key.

use super::admit::{declared_length, Answer, Caller, FailMode, Judged, Judgement};
use super::ctx::{Plan, RequestCtx, ToolPlan};
use super::env::Env;
use super::features::idempotency;
use crate::config::runtime::{Tool, ToolGrant};
use crate::error::GatewayError;
use loopgate_policy::{Deny, DenyCode};
use pingora_proxy::Session;
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
    let (tool, grant) = granted(caller, tool_name)?;
    let decoded = check_request(session, caller, grant, tool_name, rest)?;
    let req = session.req_header();
    let method = req.method.clone();
    let query = req.uri.query().map(str::to_string);
    let target = match &query {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_string(),
    };
    let mut fail = FailMode::new(tool.fail_open);
    let call = idempotency::Call {
        agent: &caller.rules().name,
        tool: tool_name,
        method: &method,
        target: &target,
        body_limit: grant.max_body_bytes.unwrap_or(1024 * 1024),
    };
    let claim = match &tool.idempotency {
        Some(policy) => idempotency::claim(session, ctx, env, policy, &call, &mut fail).await?,
        None => idempotency::Claim::default(),
    };
    if let Some(record) = claim.replay {
        return Ok(Judgement::Answer(Answer::Replay(record)));
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
                "body_sha256": claim.body_sha.map(hex::encode),
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
        body: claim.body,
        body_read: claim.record.is_some(),
        body_rewritten: false,
        fail,
        estimated_prompt: 0,
        max_tokens: 0,
        default_output: None,
        money: None,
        task_budget: false,
        extra: Vec::new(),
        loop_call,
        watched: true,
        context_share: None,
        isolation: isolation.clone(),
        idem_claim: claim.record.as_ref().map(|(k, _)| k.clone()),
        plan: Plan::Tool(ToolPlan {
            // The raw (validated) path: the tool decodes it as we did.
            target,
            idem: claim.record,
            expect_json: tool.expect_json,
            pass_redirects: tool.pass_redirects,
            isolation,
        }),
    })))
}

/// The tool and the agent's grant for it.
fn granted<'c>(
    caller: &Caller<'c>,
    tool_name: &str,
) -> Result<(&'c Tool, &'c ToolGrant), GatewayError> {
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
                format!(
                    "agent `{}` may not call tool `{tool_name}`",
                    caller.rules().name
                ),
            )
        })?;
    Ok((tool, grant))
}

/// The request against the grant: method, path by segments, declared
/// body size. Returns the decoded path.
fn check_request(
    session: &mut Session,
    caller: &Caller<'_>,
    grant: &ToolGrant,
    tool_name: &str,
    rest: &str,
) -> Result<String, GatewayError> {
    let agent = &caller.rules().name;
    let req = session.req_header();
    if !grant.methods.contains(&req.method) {
        let allow: Vec<&str> = grant.methods.iter().map(http::Method::as_str).collect();
        return Err(GatewayError::MethodNotAllowed {
            allow: allow.join(", "),
            message: format!(
                "agent `{agent}` may not use {} on tool `{tool_name}`",
                req.method
            ),
        });
    }
    let decoded = normalize(rest)
        .map_err(|why| Deny::new(DenyCode::InvalidPath, format!("invalid tool path: {why}")))?;
    if !grant.paths.allows_path(&decoded) {
        return Err(Deny::new(
            DenyCode::PathNotAllowed,
            format!(
                "agent `{agent}` may not call `{}` on tool `{tool_name}`",
                clip(&decoded)
            ),
        )
        .into());
    }
    let Some(limit) = grant.max_body_bytes else {
        return Ok(decoded);
    };
    let chunked = req.headers.contains_key(http::header::TRANSFER_ENCODING);
    let refusal = match declared_length(req)? {
        Some(n) if n > limit => Deny::new(
            DenyCode::BodyTooLarge,
            format!("request body exceeds the limit of {limit} bytes"),
        ),
        None if chunked => Deny::new(
            DenyCode::LengthRequired,
            "this tool has a body size limit: send Content-Length",
        ),
        _ => return Ok(decoded),
    };
    session.set_keepalive(None);
    Err(refusal.into())
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
