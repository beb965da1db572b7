//! The listeners and what they serve beside the proxy: the agent
//! listener (`listen:`, its address and connection limits), the admin
//! listener (`admin:`) and the access log (`access_log:`).

use super::runtime::{AccessTarget, Errs};
use super::spec;
use crate::connections::ConnectionLimits;
use crate::secret::Secret;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

pub(super) fn build_connections(
    errs: &mut Errs,
    spec: Option<&spec::ConnectionsSpec>,
) -> ConnectionLimits {
    let d = ConnectionLimits::default();
    let Some(c) = spec else { return d };
    let positive = |errs: &mut Errs, field: &str, v: Option<u64>, default: u64| match v {
        Some(0) => {
            errs.push(format!("listen.connections.{field}"), "must be at least 1");
            default
        }
        Some(v) => v,
        None => default,
    };
    let ms = |d: Duration| d.as_millis() as u64;
    let mut trusted = Vec::new();
    for (i, t) in c.trusted.iter().flatten().enumerate() {
        let net = t
            .parse::<ipnet::IpNet>()
            .or_else(|_| t.parse::<IpAddr>().map(ipnet::IpNet::from));
        match net {
            Ok(n) => trusted.push(n),
            Err(_) => errs.push(
                format!("listen.connections.trusted[{i}]"),
                format!("`{t}` is not an IP address or CIDR range (e.g. 10.0.0.0/8)"),
            ),
        }
    }
    ConnectionLimits {
        slow_per_client: positive(
            errs,
            "slow_per_client",
            c.slow_per_client.map(|v| v as u64),
            d.slow_per_client as u64,
        ) as usize,
        max: c
            .max
            .map(|v| positive(errs, "max", Some(v as u64), 1) as usize),
        header_timeout: Duration::from_millis(positive(
            errs,
            "header_timeout_ms",
            c.header_timeout_ms,
            ms(d.header_timeout),
        )),
        body_timeout: Duration::from_millis(positive(
            errs,
            "body_timeout_ms",
            c.body_timeout_ms,
            ms(d.body_timeout),
        )),
        body_min_rate: c.body_min_bytes_per_sec.unwrap_or(d.body_min_rate),
        idle_timeout: Duration::from_millis(positive(
            errs,
            "idle_timeout_ms",
            c.idle_timeout_ms,
            ms(d.idle_timeout),
        )),
        body_memory: positive(
            errs,
            "body_memory_bytes",
            c.body_memory_bytes,
            d.body_memory,
        ),
        reserve_fds: c.reserve_fds.unwrap_or(d.reserve_fds),
        trusted,
    }
}

pub(super) fn parse_addr(errs: &mut Errs, path: &str, s: &str) -> Option<SocketAddr> {
    match s.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            errs.push(
                path,
                format!("`{s}` is not an IP:port address (e.g. 127.0.0.1:8080)"),
            );
            None
        }
    }
}

/// The admin listener, its token and the endpoints served without it.
pub(super) struct Admin {
    pub listen: Option<SocketAddr>,
    pub token: Option<Secret>,
    /// `health`, `ready`, `metrics` by default.
    pub open: Vec<String>,
}

pub(super) fn build_admin(
    errs: &mut Errs,
    spec: Option<&spec::AdminSpec>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Admin {
    let listen = spec.and_then(|a| parse_addr(errs, "admin.listen", &a.listen));
    let token = spec
        .and_then(|a| a.token_env.as_ref())
        .and_then(|var| errs.env_value("admin.token_env", var, env))
        .map(Secret::new);
    let open = match spec.and_then(|a| a.open.clone()) {
        None => vec!["health".into(), "ready".into(), "metrics".into()],
        Some(list) => {
            for (i, e) in list.iter().enumerate() {
                if !matches!(e.as_str(), "health" | "ready" | "metrics") {
                    errs.push(
                        format!("admin.open[{i}]"),
                        format!("`{e}` cannot be opened (one of: health, ready, metrics)"),
                    );
                }
            }
            list
        }
    };
    Admin {
        listen,
        token,
        open,
    }
}

pub(super) fn build_access_log(
    errs: &mut Errs,
    spec: Option<&spec::AccessLogSpec>,
) -> AccessTarget {
    match spec.map(|a| a.path.as_str()) {
        None | Some("stdout") => AccessTarget::Stdout,
        Some("stderr") => AccessTarget::Stderr,
        Some("off") => AccessTarget::Off,
        Some("") => {
            errs.push(
                "access_log.path",
                "must be stdout, stderr, off or a file path",
            );
            AccessTarget::Off
        }
        Some(path) => AccessTarget::File(path.to_string()),
    }
}
