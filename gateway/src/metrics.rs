//! Prometheus metrics, served on the admin listener at `/metrics`.
//!
//! Every label value comes from a bounded set: agent, provider and route
//! names from the config (or `-`), denial codes from a fixed enum, status
//! classes, breaker keys (providers x agents). Request ids, raw paths and
//! unrouted model names never become labels.

use loopgate_breaker::{State, Transition};
use loopgate_policy::DenyCode;
use prometheus::{
    CounterVec, Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    denials: IntCounterVec,
    would_deny: IntCounterVec,
    pub limit_rejections: IntCounterVec,
    pub duration: HistogramVec,
    pub overhead: Histogram,
    pub ttfb: HistogramVec,
    pub active_streams: IntGauge,
    breaker_state: IntGaugeVec,
    breaker_transitions: IntCounterVec,
    pub half_open_probes: IntCounterVec,
    pub fallbacks: IntCounterVec,
    pub retries: IntCounterVec,
    pub tokens: IntCounterVec,
    /// US dollars the answers cost, by agent and catalog model name.
    pub cost_usd: CounterVec,
    reloads: IntCounterVec,
    pub access_log_dropped: IntCounter,
    pub loop_trips: IntCounterVec,
    pub guard: IntCounterVec,
    pub budget_cuts: IntCounterVec,
    /// Share of each money budget used, by agent and scope (a fixed set).
    budget_used: GaugeVec,
    /// Watched calls whose task was predicted to overrun its money budget.
    pub predicted_overruns: IntCounterVec,
    /// 1 while the shared state store (Redis) answers; 1 for memory.
    pub state_available: IntGauge,
    /// Admissions made on local limits while Redis was away.
    pub state_degraded: IntCounter,
    /// Tool calls forwarded under `fail_mode: open` the gateway could not judge.
    pub fail_open: IntCounterVec,
    /// MCP requests by server, tool (granted ones; else `other`) and decision.
    pub mcp_requests: IntCounterVec,
    /// Agent connections ended before a request, by reason (a fixed set:
    /// see `connections::Refusal`).
    pub connections_refused: IntCounterVec,
    /// Connections waiting for a request header closed to make room for a
    /// new one while the listener was full.
    pub connections_reclaimed: IntCounter,
    /// Agent connections open now.
    pub connections_open: IntGauge,
}

/// Latency buckets from 100 us to 5 min: gateway overhead is microseconds,
/// model calls are seconds to minutes.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
const OVERHEAD_BUCKETS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,
];

impl Metrics {
    /// Sets `agent`'s used share of its money budget at `level`.
    pub fn budget_used(&self, agent: &str, level: loopgate_policy::BudgetLevel, ratio: f64) {
        self.budget_used
            .with_label_values(&[agent, crate::spend::scope(level)])
            .set(ratio);
    }

    pub fn new() -> Metrics {
        let registry = Registry::new();
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m.expect("valid metric");
                registry
                    .register(Box::new(m.clone()))
                    .expect("unique metric");
                m
            }};
        }
        let counter = |name: &str, help: &str| Opts::new(name, help);
        let m = Metrics {
            requests: reg!(IntCounterVec::new(
                counter("loopgate_requests_total", "Requests by agent, provider, routed model, status class and decision (allow, deny, error)."),
                &["agent", "provider", "model", "status_class", "decision"]
            )),
            denials: reg!(IntCounterVec::new(
                counter("loopgate_denials_total", "Requests Loopgate refused or failed, by code."),
                &["code"]
            )),
            would_deny: reg!(IntCounterVec::new(
                counter("loopgate_would_deny_total", "Requests a dry-run rule would have refused, by code."),
                &["code"]
            )),
            limit_rejections: reg!(IntCounterVec::new(
                counter("loopgate_limit_rejections_total", "Rate-limit, in-flight and budget rejections by agent."),
                &["agent", "code"]
            )),
            duration: reg!(HistogramVec::new(
                HistogramOpts::new("loopgate_request_duration_seconds", "Whole request time, by provider.")
                    .buckets(LATENCY_BUCKETS.to_vec()),
                &["provider"]
            )),
            overhead: reg!(Histogram::with_opts(
                HistogramOpts::new("loopgate_gateway_overhead_seconds", "Time spent in Loopgate, upstream time excluded.")
                    .buckets(OVERHEAD_BUCKETS.to_vec())
            )),
            ttfb: reg!(HistogramVec::new(
                HistogramOpts::new("loopgate_upstream_ttfb_seconds", "Upstream time to the response header, by provider.")
                    .buckets(LATENCY_BUCKETS.to_vec()),
                &["provider"]
            )),
            active_streams: reg!(IntGauge::new("loopgate_active_streams", "Event streams being relayed now.")),
            breaker_state: reg!(IntGaugeVec::new(
                counter("loopgate_breaker_state", "Breaker state by key: 0 closed, 1 open, 2 half-open."),
                &["key"]
            )),
            breaker_transitions: reg!(IntCounterVec::new(
                counter("loopgate_breaker_transitions_total", "Breaker state changes."),
                &["key", "from", "to"]
            )),
            half_open_probes: reg!(IntCounterVec::new(
                counter("loopgate_half_open_probes_total", "Half-open probes sent (live or active), by key."),
                &["key"]
            )),
            fallbacks: reg!(IntCounterVec::new(
                counter("loopgate_fallbacks_total", "Responses served by a fallback target."),
                &["from", "to"]
            )),
            retries: reg!(IntCounterVec::new(
                counter("loopgate_retries_total", "Upstream attempts after the first, by provider tried."),
                &["provider"]
            )),
            tokens: reg!(IntCounterVec::new(
                counter("loopgate_tokens_total", "Tokens the providers reported, by agent, routed model and kind (prompt, completion)."),
                &["agent", "model", "kind"]
            )),
            cost_usd: reg!(CounterVec::new(
                counter("loopgate_cost_usd_total", "US dollars the answers cost (reported usage at the catalog's price), by agent and the price catalog's model name."),
                &["agent", "model"]
            )),
            reloads: reg!(IntCounterVec::new(
                counter("loopgate_config_reloads_total", "Config reloads by result (ok, error)."),
                &["result"]
            )),
            access_log_dropped: reg!(IntCounter::new(
                "loopgate_access_log_dropped_total",
                "Access-log lines dropped because the writer fell behind (the proxy never waits for it)."
            )),
            loop_trips: reg!(IntCounterVec::new(
                counter("loopgate_loop_trips_total", "Tasks stopped for repeating themselves, by agent."),
                &["agent"]
            )),
            guard: reg!(IntCounterVec::new(
                counter("loopgate_guard_total", "Watchdog actions by agent: warn, degrade, stop."),
                &["agent", "action"]
            )),
            predicted_overruns: reg!(IntCounterVec::new(
                counter(
                    "loopgate_predicted_overruns_total",
                    "Calls of tasks whose predicted spend crossed the task's money budget, by agent."
                ),
                &["agent"]
            )),
            budget_cuts: reg!(IntCounterVec::new(
                counter("loopgate_budget_cuts_total", "Streams cut because they outgrew their token or money budget."),
                &["agent"]
            )),
            budget_used: reg!(GaugeVec::new(
                Opts::new("loopgate_budget_used_ratio", "Share of a money budget used (reservations included), by agent and scope: task (its most used open task), day, month, team_day, team_month. Set at each admission, and from the state store (the fleet's spend) at each scrape and each read of /admin/spend."),
                &["agent", "scope"]
            )),
            state_available: reg!(IntGauge::new(
                "loopgate_state_available",
                "1 while the shared state store answers (always 1 for the memory store)."
            )),
            state_degraded: reg!(IntCounter::new(
                "loopgate_state_degraded_total",
                "Requests admitted on this instance's local limits because Redis was unavailable."
            )),
            fail_open: reg!(IntCounterVec::new(
                counter("loopgate_fail_open_total", "Tool calls forwarded under fail_mode: open although a check could not decide, by tool and reason."),
                &["tool", "reason"]
            )),
            mcp_requests: reg!(IntCounterVec::new(
                counter("loopgate_mcp_requests_total", "MCP requests by server, tool (granted tools; `other` for refused names) and decision."),
                &["server", "tool", "decision"]
            )),
            connections_refused: reg!(IntCounterVec::new(
                counter("loopgate_connections_refused_total", "Agent connections the gateway ended before serving a request, by reason: capacity (listener full, nothing to reclaim), client_share (too many slow connections from one address), header_timeout (a header not whole in time), malformed (a header line ended by a bare LF)."),
                &["reason"]
            )),
            connections_reclaimed: reg!(IntCounter::with_opts(counter(
                "loopgate_connections_reclaimed_total",
                "Connections still waiting for a request header, closed to make room while the listener was full."
            ))),
            connections_open: reg!(IntGauge::new(
                "loopgate_connections_open",
                "Agent connections open now."
            )),
            registry,
        };
        // Counted by the logger, which has no Metrics (see `logging`).
        let _ = m
            .registry
            .register(Box::new(crate::logging::POOL_RACES.clone()));
        m.state_available.set(1);
        // Every code is visible from the start, at zero.
        for code in DenyCode::ALL {
            m.denials.with_label_values(&[code.as_str()]);
        }
        for reason in crate::connections::Refusal::ALL {
            m.connections_refused.with_label_values(&[reason.as_str()]);
        }
        m
    }

    /// Counts a refusal by its code (a `&'static str` from a fixed set).
    pub fn denied(&self, code: &'static str) {
        self.denials.with_label_values(&[code]).inc();
    }

    pub fn would_deny(&self, code: DenyCode) {
        self.would_deny.with_label_values(&[code.as_str()]).inc();
    }

    pub fn reload(&self, ok: bool) {
        self.reloads
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
    }

    /// Logs and counts a breaker state change.
    pub fn transition(&self, key: &str, t: &Transition) {
        log::info!("breaker `{key}`: {t}");
        self.breaker_transitions
            .with_label_values(&[key, t.from.as_str(), t.to.as_str()])
            .inc();
        self.breaker_state
            .with_label_values(&[key])
            .set(match t.to {
                State::Closed => 0,
                State::Open => 1,
                State::HalfOpen => 2,
            });
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
