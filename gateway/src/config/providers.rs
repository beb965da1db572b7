//! Model providers (`providers:`) and the connection an upstream is
//! reached through: URL, credential, timeouts, breaker and probe. Tools and
//! MCP servers reuse the connection part, with errors named for their own
//! section.

use super::routes::{Route, Target};
use super::runtime::Errs;
use super::spec::{self, ProviderKind};
use crate::secret::Secret;
use arc_swap::ArcSwapOption;
use loopgate_breaker::BreakerConfig;
use loopgate_policy::Endpoint;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

pub(super) const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    pub read: Duration,
    pub total: Duration,
}

#[derive(Debug)]
pub struct Provider {
    /// Shared: breaker keys and `served_by` clone it per request without
    /// copying.
    pub name: Arc<str>,
    pub kind: ProviderKind,
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix from `base_url`, without a trailing slash ("" for none).
    pub base_path: String,
    /// `Host` header value sent upstream.
    pub authority: String,
    pub api_key: Option<Secret>,
    /// Header values sent on every request, built once at load: inserting
    /// a `&str` copies it into a new allocation each time. The credential
    /// value is marked sensitive (the `http` crate then never prints it).
    pub authority_value: http::HeaderValue,
    pub name_value: http::HeaderValue,
    pub credential_value: Option<http::HeaderValue>,
    pub anthropic_version: String,
    pub timeouts: Timeouts,
    /// Resolved address: fixed for IP literals, refreshed in the background
    /// for host names so that no request ever waits on DNS.
    pub addr: ArcSwapOption<SocketAddr>,
    pub breaker: BreakerConfig,
    /// Every model it serves costs this (`price:`), instead of the catalog's.
    pub price: Option<loopgate_policy::Price>,
    /// One breaker per provider and agent rather than per provider.
    pub isolate_by_agent: bool,
    pub probe: Option<Probe>,
    /// A tool's credential header (`auth.header` + `auth.value_env`).
    pub custom_auth: Option<(http::HeaderName, Secret)>,
}

impl Provider {
    /// Whether this provider speaks the API behind `endpoint`.
    pub fn serves(&self, endpoint: Endpoint) -> bool {
        match self.kind {
            ProviderKind::Anthropic => {
                matches!(endpoint, Endpoint::Messages | Endpoint::CountTokens)
            }
            ProviderKind::Openai | ProviderKind::OpenaiCompatible => matches!(
                endpoint,
                Endpoint::ChatCompletions
                    | Endpoint::Completions
                    | Endpoint::Embeddings
                    | Endpoint::Responses
            ),
        }
    }

    /// Whether a call on `endpoint` reaches this provider translated: the
    /// chat endpoint of the other API family (issue 24).
    pub fn translates(&self, endpoint: Endpoint) -> bool {
        matches!(
            (self.kind, endpoint),
            (ProviderKind::Anthropic, Endpoint::ChatCompletions)
                | (
                    ProviderKind::Openai | ProviderKind::OpenaiCompatible,
                    Endpoint::Messages
                )
        )
    }

    /// Resolves the host now (blocking): start-up and the background refresher only.
    pub fn resolve(&self) -> std::io::Result<SocketAddr> {
        use std::net::ToSocketAddrs;
        let addr = (self.host.as_str(), self.port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::other("no address"))?;
        self.addr.store(Some(Arc::new(addr)));
        Ok(addr)
    }

    /// Puts this provider's credential (and, for Anthropic, a default
    /// `anthropic-version`) on an upstream request, the provider's way. The
    /// one place a provider key is written anywhere.
    pub fn authorize(&self, req: &mut pingora::http::RequestHeader) -> pingora::Result<()> {
        if let Some((name, value)) = &self.custom_auth {
            // Sensitive: a debug dump of the header map shows no secret.
            let mut v = http::HeaderValue::from_str(value.expose()).map_err(|e| {
                pingora::Error::because(pingora::ErrorType::InternalError, "tool credential", e)
            })?;
            v.set_sensitive(true);
            req.insert_header(name.clone(), v)?;
        }
        if let Some(value) = &self.credential_value {
            let name = match self.kind {
                ProviderKind::Anthropic => "x-api-key",
                ProviderKind::Openai | ProviderKind::OpenaiCompatible => "authorization",
            };
            req.insert_header(name, value.clone())?;
        }
        if self.kind == ProviderKind::Anthropic && !req.headers.contains_key("anthropic-version") {
            req.insert_header("anthropic-version", self.anthropic_version.as_str())?;
        }
        Ok(())
    }

    pub fn needs_dns(&self) -> bool {
        self.host.parse::<IpAddr>().is_err()
    }
}

/// The read-only request that tests a half-open breaker.
#[derive(Debug, Clone)]
pub struct Probe {
    pub method: http::Method,
    pub path: String,
}

/// The fields an upstream's connection errors are reported under: the
/// ones the user wrote in that section, whatever the runtime type built.
#[derive(Clone, Copy)]
pub(super) struct UpstreamFields {
    pub(super) url: &'static str,
    pub(super) key: &'static str,
}

pub(super) const PROVIDER_FIELDS: UpstreamFields = UpstreamFields {
    url: "base_url",
    key: "api_key_env",
};
pub(super) const TOOL_FIELDS: UpstreamFields = UpstreamFields {
    url: "base_url",
    key: "auth.bearer_env",
};
pub(super) const MCP_FIELDS: UpstreamFields = UpstreamFields {
    url: "url",
    key: "auth.bearer_env",
};

pub(super) fn build_provider(
    errs: &mut Errs,
    section: &str,
    fields: UpstreamFields,
    name: &str,
    p: &spec::ProviderSpec,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<Provider> {
    let at = format!("{section}.{name}");
    let url_at = format!("{at}.{}", fields.url);
    let key_at = format!("{at}.{}", fields.key);
    let before = errs.list.len();
    let uri: Option<http::Uri> = match p.base_url.parse::<http::Uri>() {
        Ok(u) => Some(u),
        Err(e) => {
            errs.push(url_at.clone(), format!("not a URL: {e}"));
            None
        }
    };
    let mut parts = None;
    if let Some(uri) = uri {
        let tls = match uri.scheme_str() {
            Some("https") => Some(true),
            Some("http") => Some(false),
            _ => {
                errs.push(url_at.clone(), "must start with http:// or https://");
                None
            }
        };
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_string());
        if host.is_none() {
            errs.push(url_at.clone(), "must name a host");
        }
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            errs.push(
                url_at.clone(),
                format!("must not contain credentials; use {}", fields.key),
            );
        }
        if uri.query().is_some() {
            errs.push(url_at.clone(), "must not contain a query string");
        }
        if let (Some(tls), Some(host)) = (tls, host) {
            let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
            let base_path = uri.path().trim_end_matches('/').to_string();
            let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
            parts = Some((tls, host, port, base_path, authority));
        }
    }

    let api_key = match &p.api_key_env {
        Some(var) if var.is_empty() => {
            errs.push(key_at.clone(), "must name an environment variable");
            None
        }
        Some(var) => errs.env_value(&key_at, var, env).map(Secret::new),
        None if p.kind != ProviderKind::OpenaiCompatible => {
            errs.push(
                key_at.clone(),
                "required for this provider kind (only openai_compatible may run without a key)",
            );
            None
        }
        None => None,
    };
    if p.anthropic_version.is_some() && p.kind != ProviderKind::Anthropic {
        errs.push(
            format!("{at}.anthropic_version"),
            "only applies to kind: anthropic",
        );
    }

    let t = &p.timeouts;
    let mut ms = |field: &str, v: Option<u64>, default: u64| -> Duration {
        let v = v.unwrap_or(default);
        if v == 0 || v > 24 * 3600 * 1000 {
            errs.push(
                format!("{at}.timeouts.{field}"),
                "must be between 1 and 86400000 milliseconds",
            );
        }
        Duration::from_millis(v)
    };
    let timeouts = Timeouts {
        connect: ms("connect_ms", t.connect_ms, 5_000),
        read: ms("read_ms", t.read_ms, 120_000),
        total: ms("total_ms", t.total_ms, 600_000),
    };

    let (breaker, isolate_by_agent, probe) = build_breaker(errs, &at, &p.breaker);
    let price = p
        .price
        .as_ref()
        .and_then(|s| super::prices::price(errs, &format!("{at}.price"), s));

    if errs.list.len() != before {
        return None;
    }
    let (tls, host, port, base_path, authority) = parts?;
    let credential_value = match &api_key {
        Some(key) => {
            let raw = match p.kind {
                ProviderKind::Anthropic => key.expose().to_string(),
                ProviderKind::Openai | ProviderKind::OpenaiCompatible => {
                    format!("Bearer {}", key.expose())
                }
            };
            match http::HeaderValue::from_str(&raw) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    Some(v)
                }
                Err(_) => {
                    // Names the variable, never the value.
                    errs.push(
                        key_at.clone(),
                        "the key holds characters an HTTP header cannot carry",
                    );
                    return None;
                }
            }
        }
        None => None,
    };
    let Ok(name_value) = http::HeaderValue::from_str(name) else {
        errs.push(
            at,
            "the name holds characters an HTTP header cannot carry (it is sent in x-loopgate-provider)",
        );
        return None;
    };
    let Ok(authority_value) = http::HeaderValue::from_str(&authority) else {
        errs.push(url_at.clone(), "the host cannot be sent in a Host header");
        return None;
    };
    let addr = host
        .parse::<IpAddr>()
        .ok()
        .map(|ip| Arc::new(SocketAddr::new(ip, port)));
    Some(Provider {
        name: Arc::from(name),
        kind: p.kind,
        tls,
        host,
        port,
        base_path,
        authority,
        api_key,
        authority_value,
        name_value,
        credential_value,
        anthropic_version: p
            .anthropic_version
            .clone()
            .unwrap_or_else(|| DEFAULT_ANTHROPIC_VERSION.to_string()),
        timeouts,
        addr: ArcSwapOption::new(addr),
        breaker,
        isolate_by_agent,
        probe,
        custom_auth: None,
        price,
    })
}

pub(super) fn build_breaker(
    errs: &mut Errs,
    at: &str,
    b: &spec::BreakerSpec,
) -> (BreakerConfig, bool, Option<Probe>) {
    let d = BreakerConfig::default();
    let mut ms = |field: &str, v: Option<u64>, default: Duration| -> Duration {
        match v {
            Some(0) => {
                errs.push(format!("{at}.breaker.{field}"), "must be at least 1");
                default
            }
            Some(v) => Duration::from_millis(v),
            None => default,
        }
    };
    let window = ms("window_ms", b.window_ms, d.window);
    let open_for = ms("open_ms", b.open_ms, d.open_for);
    let max_open_for = ms("max_open_ms", b.max_open_ms, d.max_open_for.max(open_for));
    let healthy_after = ms("healthy_after_ms", b.healthy_after_ms, d.healthy_after);
    if max_open_for < open_for {
        errs.push(
            format!("{at}.breaker.max_open_ms"),
            "must not be less than open_ms",
        );
    }
    let mut rate = |field: &str, v: Option<f64>, default: f64| -> f64 {
        match v {
            Some(r) if !(r > 0.0 && r <= 1.0) => {
                errs.push(format!("{at}.breaker.{field}"), "must be a share in (0, 1]");
                default
            }
            Some(r) => r,
            None => default,
        }
    };
    let failure_rate = rate("failure_rate", b.failure_rate, d.failure_rate);
    let timeout_rate = rate("timeout_rate", b.timeout_rate, d.timeout_rate);
    let mut count = |field: &str, v: Option<u32>, default: u32| -> u32 {
        match v {
            Some(0) => {
                errs.push(format!("{at}.breaker.{field}"), "must be at least 1");
                default
            }
            Some(v) => v,
            None => default,
        }
    };
    let consecutive_failures = count(
        "consecutive_failures",
        b.consecutive_failures,
        d.consecutive_failures,
    );
    let min_requests = count("min_requests", b.min_requests, d.min_requests);
    let half_open_probes = count("half_open_probes", b.half_open_probes, d.half_open_probes);
    let probe = b.probe.as_ref().and_then(|p| {
        let method = match p
            .method
            .as_deref()
            .unwrap_or("GET")
            .to_ascii_uppercase()
            .as_str()
        {
            "GET" => http::Method::GET,
            "HEAD" => http::Method::HEAD,
            other => {
                errs.push(
                    format!("{at}.breaker.probe.method"),
                    format!("`{other}` is not read-only: use GET or HEAD"),
                );
                return None;
            }
        };
        if !p.path.starts_with('/') {
            errs.push(format!("{at}.breaker.probe.path"), "must start with /");
            return None;
        }
        Some(Probe {
            method,
            path: p.path.clone(),
        })
    });
    let cfg = BreakerConfig {
        consecutive_failures,
        failure_rate,
        timeout_rate,
        min_requests,
        window,
        open_for,
        max_open_for,
        half_open_probes,
        healthy_after,
        active_probe: probe.is_some(),
    };
    let isolate = b.isolate_by == Some(spec::IsolateBy::Agent);
    (cfg, isolate, probe)
}

/// What a tool or an MCP server says about its connection: the same fields
/// under each section, reported under the names in `UpstreamFields`.
pub(super) struct UpstreamSpec {
    pub(super) url: String,
    pub(super) auth: Option<spec::ToolAuthSpec>,
    pub(super) timeouts: spec::TimeoutsSpec,
    pub(super) breaker: spec::BreakerSpec,
}

/// Builds the connection of a tool or an MCP server: an OpenAI-compatible
/// style upstream whose credential is a bearer token or a named header.
pub(super) fn build_upstream(
    errs: &mut Errs,
    section: &str,
    fields: UpstreamFields,
    name: &str,
    u: UpstreamSpec,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<Arc<Provider>> {
    let at = format!("{section}.{name}");
    let (bearer, custom) = match &u.auth {
        None => (None, None),
        Some(a) => match (&a.bearer_env, &a.header, &a.value_env) {
            (Some(b), None, None) => (Some(b.clone()), None),
            (None, Some(h), Some(v)) => (None, Some((h.clone(), v.clone()))),
            _ => {
                errs.push(
                    format!("{at}.auth"),
                    "use either bearer_env, or header with value_env",
                );
                (None, None)
            }
        },
    };
    let as_provider = spec::ProviderSpec {
        kind: ProviderKind::OpenaiCompatible,
        base_url: u.url,
        api_key_env: bearer,
        anthropic_version: None,
        timeouts: u.timeouts,
        breaker: u.breaker,
        price: None,
    };
    let mut provider = build_provider(errs, section, fields, name, &as_provider, env)?;
    if let Some((header, var)) = custom {
        let Ok(h) = http::HeaderName::from_bytes(header.as_bytes()) else {
            errs.push(
                format!("{at}.auth.header"),
                format!("`{header}` is not a header name"),
            );
            return None;
        };
        let v = errs.env_value(&format!("{at}.auth.value_env"), &var, env)?;
        provider.custom_auth = Some((h, Secret::new(v)));
    }
    Some(Arc::new(provider))
}

/// The route of a tool or an MCP server: its one connection, one attempt
/// (the gateway never retries such a call on its own).
pub(super) fn single_route(provider: Arc<Provider>) -> Arc<Route> {
    Arc::new(Route {
        targets: vec![Target {
            provider,
            weight: 1,
            model: None,
            chat_limit_field: None,
        }],
        max_attempts: 1,
        max_total: Duration::from_secs(600),
        models: Arc::default(),
        has_anthropic: false,
        has_openai: false,
    })
}
