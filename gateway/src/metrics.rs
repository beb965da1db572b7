//! Prometheus metrics, served on the admin listener at `/metrics`.
//!
//! Label values are bounded: denial codes come from a fixed enum, results
//! from a fixed set. (The full set of request metrics arrives with the
//! observability work.)

use loopgate_policy::DenyCode;
use prometheus::{Encoder, IntCounterVec, Opts, Registry, TextEncoder};

pub struct Metrics {
    registry: Registry,
    denials: IntCounterVec,
    would_deny: IntCounterVec,
    reloads: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let m = Metrics {
            denials: counter(
                "loopgate_denials_total",
                "Requests Loopgate refused, by denial code.",
                &["code"],
            ),
            would_deny: counter(
                "loopgate_would_deny_total",
                "Requests a dry-run rule would have refused, by denial code.",
                &["code"],
            ),
            reloads: counter(
                "loopgate_config_reloads_total",
                "Config reloads by result (ok, error).",
                &["result"],
            ),
            registry,
        };
        // Every code is visible from the start, at zero.
        for code in DenyCode::ALL {
            m.denials.with_label_values(&[code.as_str()]);
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
