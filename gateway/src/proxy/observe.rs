//! The end of every request: metrics and the access-log line, from what the
//! hooks recorded in the context. Runs in `logging`, once per request.

use super::{Gateway, RequestCtx};
use crate::access_log::{timestamp, Record};
use http::HeaderName;
use loopgate_policy::DenyCode;
use pingora_proxy::Session;
use std::time::{Instant, SystemTime};

/// Longest agent-supplied identifier kept in a log line.
const MAX_ID: usize = 128;

// Pre-parsed names: a lookup by `&str` parses the name on every call.
const CALL_ID: HeaderName = HeaderName::from_static("x-agent-call-id");
const TOOL_NAME: HeaderName = HeaderName::from_static("x-agent-tool-name");

fn header<'a>(session: &'a Session, name: &HeaderName) -> Option<&'a str> {
    let v = session.req_header().headers.get(name)?.to_str().ok()?;
    Some(clip(v, MAX_ID))
}

use loopgate_policy::clip;

/// `deny` for refusals (policy, circuit), `error` for failures, `allow` else.
fn decision(code: Option<&'static str>) -> &'static str {
    match code {
        None => "allow",
        Some(c)
            if DenyCode::parse(c).is_some_and(|d| {
                !matches!(d, DenyCode::PolicyUnavailable | DenyCode::StateUnavailable)
            }) || c == "circuit_open"
                || c == "unsupported_endpoint" =>
        {
            "deny"
        }
        Some(_) => "error",
    }
}

fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "none",
    }
}

/// What the metrics and the log line both say about a request, read once.
struct Summary<'a> {
    elapsed: std::time::Duration,
    status: u16,
    agent: &'a str,
    /// Who answered; else, where the request went (no answer came: the
    /// agent left first, or the exchange broke).
    provider: Option<&'a str>,
    route: Option<&'a str>,
    decision: &'static str,
    /// Time not spent waiting on the upstream.
    overhead: std::time::Duration,
    /// The provider a fallback left, when another one answered.
    fallback_from: Option<&'a str>,
    usage: Option<loopgate_policy::Usage>,
    /// What the answer cost, with the catalog's name for the model.
    cost: Option<(&'a str, f64)>,
}

impl<'a> Summary<'a> {
    fn of(session: &Session, ctx: &'a RequestCtx) -> Summary<'a> {
        let elapsed = ctx.started.elapsed();
        let provider = ctx.served_by.as_deref().or(ctx.sent_to.as_deref());
        let upstream = ctx.upstream_first_at.map(|t| {
            ctx.upstream_done_at
                .unwrap_or_else(Instant::now)
                .saturating_duration_since(t)
        });
        let usage = ctx.usage();
        let cost = ctx.cost();
        Summary {
            elapsed,
            status: session.response_written().map_or(0, |r| r.status.as_u16()),
            agent: ctx.agent.as_deref().unwrap_or("-"),
            provider,
            route: ctx.admitted.as_deref().map(|a| a.route_name.as_ref()),
            decision: decision(ctx.error_code),
            overhead: elapsed.saturating_sub(upstream.unwrap_or_default()),
            fallback_from: ctx
                .fallback
                .from
                .as_deref()
                .filter(|f| Some(*f) != provider && provider.is_some()),
            usage,
            cost,
        }
    }
}

/// `now`: the state clock, read once for the whole `logging` hook.
pub fn record(gw: &Gateway, session: &mut Session, ctx: &mut RequestCtx, now: std::time::Duration) {
    let sum = Summary::of(session, ctx);
    count(&gw.metrics, ctx, &sum);
    if gw.access_log.enabled() {
        write_log(gw, session, ctx, &sum, now);
    }
}

/// The request's metrics. Labels come from the config (agent, provider,
/// route, MCP server and grant names) and fixed sets, never from what an
/// agent sent.
fn count(m: &crate::metrics::Metrics, ctx: &RequestCtx, sum: &Summary<'_>) {
    let (agent, provider) = (sum.agent, sum.provider.unwrap_or("-"));
    m.requests
        .with_label_values(&[
            agent,
            provider,
            sum.route.unwrap_or("-"),
            status_class(sum.status),
            sum.decision,
        ])
        .inc();
    if let Some(a) = &ctx.mcp_audit {
        let tool = match (&a.tool, &a.tool_label) {
            (Some(_), Some(label)) => label.as_str(),
            (Some(_), None) => "other",
            (None, _) => "-",
        };
        let server = a.server_label.as_deref().unwrap_or("unknown");
        m.mcp_requests
            .with_label_values(&[server, tool, sum.decision])
            .inc();
    }
    if let Some(code @ ("rate_limited" | "too_many_in_flight")) = ctx.error_code {
        m.limit_rejections.with_label_values(&[agent, code]).inc();
    }
    m.duration
        .with_label_values(&[provider])
        .observe(sum.elapsed.as_secs_f64());
    m.overhead.observe(sum.overhead.as_secs_f64());
    if let (Some(p), Some(t)) = (sum.provider, ctx.ttfb) {
        m.ttfb.with_label_values(&[p]).observe(t.as_secs_f64());
    }
    if let (Some(from), Some(to)) = (sum.fallback_from, sum.provider) {
        m.fallbacks.with_label_values(&[from, to]).inc();
    }
    if let (Some(u), Some(route)) = (sum.usage, sum.route) {
        m.tokens
            .with_label_values(&[agent, route, "prompt"])
            .inc_by(u.prompt_tokens());
        m.tokens
            .with_label_values(&[agent, route, "completion"])
            .inc_by(u.output_tokens);
    }
    if let Some((model, usd)) = sum.cost {
        m.cost_usd.with_label_values(&[agent, model]).inc_by(usd);
    }
}

/// The request's access-log line.
fn write_log(
    gw: &Gateway,
    session: &Session,
    ctx: &RequestCtx,
    sum: &Summary<'_>,
    now: std::time::Duration,
) {
    let breaker_state = ctx.breaker_key.as_deref().and_then(|k| {
        gw.breakers
            .peek(k, now)
            .ok()
            .flatten()
            .map(|(s, _, _)| s.as_str())
    });
    let req = session.req_header();
    let adm = ctx.admitted.as_deref();
    let model = adm.and_then(|a| a.model());
    let mcp = ctx.mcp_audit.as_ref();
    let record = Record {
        time: timestamp(SystemTime::now() - sum.elapsed),
        request_id: &ctx.request_id,
        agent_id: ctx.agent.as_deref(),
        task_id: header(session, &super::admit::TASK_ID_HEADER),
        call_id: header(session, &CALL_ID),
        tool_name: header(session, &TOOL_NAME).or_else(|| {
            ctx.call
                .as_ref()
                .and_then(super::call::Call::tool_name)
                .map(|t| clip(t, MAX_ID))
        }),
        method: req.method.as_str(),
        path: clip(req.uri.path(), 256),
        model: model
            .filter(|m| !m.model.is_empty())
            .map(|m| clip(&m.model, MAX_ID)),
        stream: model.is_some_and(|m| m.stream),
        provider: sum.provider,
        breaker_state,
        decision: sum.decision,
        code: ctx.error_code,
        would_deny: adm.and_then(|a| a.would_deny).map(|c| c.as_str()),
        upstream_status: ctx.upstream_status,
        status: sum.status,
        latency_ms: (sum.elapsed.as_secs_f64() * 1e6).round() / 1e3,
        ttfb_ms: ctx.ttfb.map(|t| (t.as_secs_f64() * 1e6).round() / 1e3),
        overhead_us: sum.overhead.as_micros() as u64,
        bytes_in: ctx.bytes_in,
        bytes_out: session.as_downstream().body_bytes_sent(),
        // With Anthropic's cache reads and writes, as budgets count them.
        prompt_tokens: sum.usage.map(|u| u.prompt_tokens()),
        completion_tokens: sum.usage.map(|u| u.output_tokens),
        cost_usd: sum.cost.map(|(_, usd)| usd),
        attempts: ctx.fallback.attempts,
        idempotent_replay: ctx.replayed,
        fallback_used: sum.fallback_from.is_some(),
        fallback_from: sum.fallback_from,
        fallback_to: sum.fallback_from.and(sum.provider),
        translated_from: ctx
            .features
            .translate
            .as_ref()
            .and_then(|t| t.translated_from())
            .map(loopgate_translate::Family::name),
        mcp_server: mcp.map(|a| a.server.as_str()),
        mcp_method: mcp.map(|a| a.method.as_str()),
        mcp_tool: mcp.and_then(|a| a.tool.as_deref()),
        mcp_args_sha256: mcp.and_then(|a| a.args_sha256.as_deref()),
    };
    gw.access_log.write(&record);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_and_classes() {
        assert_eq!(decision(None), "allow");
        assert_eq!(decision(Some("model_not_allowed")), "deny");
        assert_eq!(decision(Some("circuit_open")), "deny");
        assert_eq!(decision(Some("policy_unavailable")), "error");
        assert_eq!(decision(Some("upstream_timeout")), "error");
        assert_eq!(status_class(204), "2xx");
        assert_eq!(status_class(0), "none");
    }
}
