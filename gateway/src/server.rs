//! Assembles the Pingora server: the proxy service on `listen`, the admin
//! listener, and the background DNS refresher.

use crate::access_log::AccessLog;
use crate::config::{Config, Source};
use crate::metrics::Metrics;
use crate::probe;
use crate::proxy::Gateway;
use crate::reload;
use crate::shared::{self, Shared};
use arc_swap::ArcSwap;
use async_trait::async_trait;
use loopgate_breaker::BreakerSet;
use loopgate_policy::{Clock, SystemClock};
use pingora::apps::http_app::ServeHttp;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::protocols::http::ServerSession;
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::services::listening::Service;
use std::sync::Arc;
use std::time::Duration;

/// How often host names of providers are resolved again.
const DNS_REFRESH: Duration = Duration::from_secs(30);

/// Whether every address the gateway listens on (agents, admin) is free,
/// tried before anything starts: Pingora retries a busy address for
/// about half a minute and then panics in its listener threads while the
/// process stays up, serving nothing. The error names the address.
pub fn check_listeners(cfg: &Config) -> Result<(), String> {
    let admin = cfg.admin_listen.map(|a| (a, "admin.listen"));
    for (addr, what) in std::iter::once((cfg.listen, "listen")).chain(admin) {
        // Bound and closed at once: a listener that accepted nothing
        // leaves no TIME_WAIT behind, so Pingora's own bind follows.
        if let Err(e) = std::net::TcpListener::bind(addr) {
            return Err(format!(
                "{}: {what}: cannot listen on {addr}: {e}",
                cfg.file
            ));
        }
    }
    Ok(())
}

/// Runs the gateway until the process is stopped. Does not return; exits
/// 1 at once when a listen address is taken ([`check_listeners`]).
pub fn run(cfg: Config, source: Source) -> ! {
    if let Err(e) = check_listeners(&cfg) {
        eprintln!("{e}");
        std::process::exit(1);
    }
    let listen = cfg.listen;
    let admin = cfg.admin_listen;
    let threads = cfg.threads;
    resolve_all(&cfg);
    let config = Arc::new(ArcSwap::from_pointee(cfg));
    start_dns_refresher(config.clone());
    let metrics = Arc::new(Metrics::new());
    let reload_source = source.clone();
    reload::spawn(source, config.clone(), metrics.clone());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::default());
    let breakers = Arc::new(BreakerSet::new());
    let (store, shared) = match shared::build(&config.load().state, config.load().bounds) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("state store: {e}");
            std::process::exit(2);
        }
    };
    if let Some(sh) = &shared {
        metrics.state_available.set(0);
        shared::spawn_breaker_sync(sh.clone(), breakers.clone(), clock.clone(), metrics.clone());
    }
    probe::spawn(
        config.clone(),
        breakers.clone(),
        clock.clone(),
        metrics.clone(),
    );
    let access_log = {
        let target = config.load().access_log.clone();
        match AccessLog::start(&target, metrics.clone()) {
            Ok(log) => Arc::new(log),
            Err(e) => {
                eprintln!("access log {target:?}: {e}");
                std::process::exit(2);
            }
        }
    };
    reopen_on_sigusr1(access_log.clone());

    let conf = ServerConf {
        threads,
        // Agents hold long streams; give them a short, bounded drain on SIGTERM.
        grace_period_seconds: Some(1),
        graceful_shutdown_timeout_seconds: Some(5),
        upstream_keepalive_pool_size: 1024,
        // One thread needs no work stealing: a single-threaded runtime skips
        // the multi-threaded scheduler's queues and wakeups (interleaved wrk
        // runs: ~15% less CPU per request at `threads: 1`). With more
        // threads we keep stealing: without it Pingora 0.9's upstream pool
        // fails to hand over ~0.7% of idle connections across runtimes (a
        // race in `reused_stream`), and a lost connection is a new TLS
        // handshake.
        work_stealing: threads > 1,
        ..ServerConf::default()
    };
    let spend = Arc::new(crate::spend::SpendBook::default());
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let app = pingora_proxy::http_proxy(
        &server.configuration,
        Gateway::new(
            config.clone(),
            store.clone(),
            clock.clone(),
            metrics.clone(),
            breakers.clone(),
            access_log.clone(),
            spend.clone(),
        ),
    );
    let nofile = crate::connections::raise_nofile();
    let limits = config.load_full();
    log::info!(
        "agent connections: up to {} in all (open-file limit {nofile}), {} slow ones per address",
        limits.connections.total(nofile),
        limits.connections.slow_per_client
    );
    let mut proxy = Service::new(
        "loopgate proxy".to_string(),
        crate::connections::Limited::new(app, config.clone(), metrics.clone(), nofile),
    );
    // No L4 read buffer on agent connections. Pingora's default is a
    // zero-filled 64 KiB buffer per connection, and it saves nothing here:
    // the HTTP layer reads headers into its own buffer and bodies in 64 KiB
    // reads, which bypass it. Without it a held stream costs ~4 KB less RSS
    // (benches/streams) and a new connection no 64 KiB memset.
    let agents =
        ListenerConfig::tcp(listen.to_string()).l4_buffer(L4BufferSettings::default().read(0));
    proxy.add_listener(agents);
    proxy.threads = Some(threads);
    server.add_service(proxy);

    if let Some(admin) = admin {
        let admin_app = Admin {
            config,
            metrics,
            breakers,
            clock,
            source: reload_source,
            shared,
            store,
            spend,
            access_log,
        };
        let mut svc = Service::new("loopgate admin".to_string(), admin_app);
        svc.add_tcp(&admin.to_string());
        svc.threads = Some(1);
        server.add_service(svc);
    }
    log::info!("loopgate listening on {listen}");
    server.run_forever()
}

/// Reopens a file access log on SIGUSR1, as nginx does, so logrotate can
/// move it away and signal.
fn reopen_on_sigusr1(log: Arc<AccessLog>) {
    match signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR1]) {
        Ok(mut signals) => {
            let _ = std::thread::Builder::new()
                .name("loopgate-sigusr1".into())
                .spawn(move || {
                    for _ in signals.forever() {
                        if !log.reopen() {
                            log::info!("SIGUSR1: the access log is no file; nothing to reopen");
                        }
                    }
                });
        }
        Err(e) => log::warn!(
            "cannot listen for SIGUSR1 ({e}); reopen the access log through the admin API"
        ),
    }
}

fn resolve_all(cfg: &Config) {
    for p in cfg.upstreams().filter(|p| p.needs_dns()) {
        if let Err(e) = p.resolve() {
            log::warn!("provider `{}`: cannot resolve `{}`: {e}", p.name, p.host);
        }
    }
}

/// Resolves the current snapshot's provider host names every
/// `DNS_REFRESH`, so that requests never wait on DNS. A failed lookup keeps
/// the last address.
fn start_dns_refresher(config: Arc<ArcSwap<Config>>) {
    std::thread::Builder::new()
        .name("loopgate-dns".into())
        .spawn(move || loop {
            std::thread::sleep(DNS_REFRESH);
            resolve_all(&config.load());
        })
        .ok();
}

/// The admin listener: health, readiness, metrics, and the authenticated
/// `/admin/*` API. Never served on the proxy port.
struct Admin {
    config: Arc<ArcSwap<Config>>,
    metrics: Arc<Metrics>,
    breakers: Arc<BreakerSet>,
    clock: Arc<dyn Clock>,
    source: Source,
    /// The Redis side of shared state, when configured.
    shared: Option<Arc<Shared>>,
    /// The state store the proxy admits with (spend is read from it).
    store: Arc<dyn loopgate_policy::StateStore>,
    spend: Arc<crate::spend::SpendBook>,
    access_log: Arc<AccessLog>,
}

impl Admin {
    fn authorized(&self, session: &ServerSession, cfg: &Config) -> bool {
        let Some(token) = &cfg.admin_token else {
            return false;
        };
        let presented = session
            .req_header()
            .headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        use subtle::ConstantTimeEq;
        // Compare digests so the comparison time does not depend on lengths.
        let a = loopgate_policy::hash_key(presented.as_bytes()).to_hex();
        let b = loopgate_policy::hash_key(token.expose().as_bytes()).to_hex();
        bool::from(a.as_bytes().ct_eq(b.as_bytes()))
    }

    /// Sets the money gauges (`loopgate_budget_used_ratio`) from the state
    /// store before a scrape: with Redis that is the fleet's spend, so an
    /// alert fires on every replica, not only on the ones that admitted
    /// the last calls. One store round trip, bounded so a slow store
    /// cannot hold the scrape; on failure the gauges keep their last value.
    async fn refresh_spend_gauges(&self, cfg: &Config) {
        if !cfg.agents.iter().any(|a| a.money_budgeted()) {
            return;
        }
        let now = self.clock.now();
        let read = crate::spend::report(cfg, &*self.store, &self.spend, &self.metrics, now);
        match tokio::time::timeout(std::time::Duration::from_secs(1), read).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => log::debug!("spend gauges not refreshed: {e}"),
            Err(_) => log::debug!("spend gauges not refreshed: the store took over 1 s"),
        }
    }

    fn breakers_json(&self) -> Option<serde_json::Value> {
        let snaps = self.breakers.snapshots(self.clock.now()).ok()?;
        Some(serde_json::json!({
            "breakers": snaps.iter().map(|(key, s)| serde_json::json!({
                "key": key,
                "state": s.state.as_str(),
                "consecutive_failures": s.consecutive_failures,
                "window_requests": s.window_requests,
                "window_failures": s.window_failures,
                "window_timeouts": s.window_timeouts,
                "open_remaining_ms": s.open_remaining.map(|d| d.as_millis() as u64),
                "trips": s.trips,
            })).collect::<Vec<_>>()
        }))
    }
}

fn json_response(status: u16, body: &serde_json::Value) -> http::Response<Vec<u8>> {
    let body = serde_json::to_vec(body).unwrap_or_default();
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .body(body)
        .unwrap_or_default()
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> http::Response<Vec<u8>> {
        let cfg = self.config.load_full();
        let method = session.req_header().method.clone();
        let path = session.req_header().uri.path().to_string();
        let public = match path.as_str() {
            "/health" => Some("health"),
            "/ready" => Some("ready"),
            "/metrics" => Some("metrics"),
            _ => None,
        };
        let open = public.is_some_and(|p| cfg.admin_open.iter().any(|o| o == p));
        if !open && !self.authorized(session, &cfg) {
            return json_response(
                401,
                &serde_json::json!({"error": {"code": "unauthorized", "message": "admin token required (Authorization: Bearer <token>)"}}),
            );
        }
        let get = method == http::Method::GET;
        let post = method == http::Method::POST;
        match (path.as_str(), get, post) {
            ("/health", true, _) => json_response(
                200,
                &serde_json::json!({"status": "ok", "pid": std::process::id()}),
            ),
            ("/ready", true, _) => {
                let unresolved: Vec<&str> = cfg
                    .upstreams()
                    .filter(|p| p.addr.load().is_none())
                    .map(|p| &*p.name)
                    .collect();
                let (store_ready, store) = match &self.shared {
                    Some(s) => s.readiness(),
                    None => (
                        true,
                        serde_json::json!({"backend": "memory", "available": true}),
                    ),
                };
                if unresolved.is_empty() && store_ready {
                    json_response(200, &serde_json::json!({"status": "ready", "store": store}))
                } else {
                    json_response(
                        503,
                        &serde_json::json!({"status": "not_ready", "unresolved_providers": unresolved, "store": store}),
                    )
                }
            }
            ("/metrics", true, _) => {
                self.refresh_spend_gauges(&cfg).await;
                let body = self.metrics.render();
                http::Response::builder()
                    .status(200)
                    .header("content-type", "text/plain; version=0.0.4")
                    .header("content-length", body.len())
                    .body(body)
                    .unwrap_or_default()
            }
            ("/admin/breakers", true, _) => match self.breakers_json() {
                Some(v) => json_response(200, &v),
                None => json_response(
                    503,
                    &serde_json::json!({"error": {"code": "breaker_unavailable"}}),
                ),
            },
            ("/admin/config", true, _) => json_response(200, &cfg.redacted_json()),
            ("/admin/spend", true, _) => {
                let now = self.clock.now();
                match crate::spend::report(&cfg, &*self.store, &self.spend, &self.metrics, now)
                    .await
                {
                    Ok(v) => json_response(200, &v),
                    Err(e) => json_response(
                        503,
                        &serde_json::json!({"error": {"code": "state_unavailable", "message": e.to_string()}}),
                    ),
                }
            }
            ("/admin/reload", _, true) => {
                match reload::try_reload(&self.source, &self.config, &self.metrics) {
                    Ok(()) => json_response(200, &serde_json::json!({"ok": true})),
                    Err(errors) => {
                        json_response(422, &serde_json::json!({"ok": false, "errors": errors}))
                    }
                }
            }
            ("/admin/access-log/reopen", _, true) => match self.access_log.reopen() {
                true => json_response(200, &serde_json::json!({"ok": true})),
                false => json_response(
                    409,
                    &serde_json::json!({"error": {"code": "not_a_file", "message": "the access log is not written to a file"}}),
                ),
            },
            (p, _, true) if breaker_to_reset(p).is_some() => {
                let key = percent_decode(breaker_to_reset(p).unwrap_or_default());
                if let Some(s) = &self.shared {
                    // Or the other instances would open it here again.
                    if let Err(e) = s.flags.clear_breaker(&key).await {
                        log::warn!("breaker `{key}`: reset not shared: {e}");
                    }
                }
                match self.breakers.reset(&key, self.clock.now()) {
                    Ok(t) => {
                        if let Some(t) = &t {
                            self.metrics.transition(&key, t);
                        }
                        let known = self
                            .breakers
                            .snapshots(self.clock.now())
                            .map(|v| v.iter().any(|(k, _)| *k == key))
                            .unwrap_or(false);
                        if known {
                            json_response(200, &serde_json::json!({"key": key, "state": "closed"}))
                        } else {
                            json_response(
                                404,
                                &serde_json::json!({"error": {"code": "not_found", "message": "no breaker with that key"}}),
                            )
                        }
                    }
                    Err(_) => json_response(
                        503,
                        &serde_json::json!({"error": {"code": "breaker_unavailable"}}),
                    ),
                }
            }
            (
                "/health" | "/ready" | "/metrics" | "/admin/breakers" | "/admin/config"
                | "/admin/spend",
                false,
                _,
            )
            | ("/admin/reload" | "/admin/access-log/reopen", _, false) => json_response(
                405,
                &serde_json::json!({"error": {"code": "method_not_allowed"}}),
            ),
            _ => json_response(404, &serde_json::json!({"error": {"code": "not_found"}})),
        }
    }
}

/// The breaker key in `/admin/breakers/{key}/reset`; `None` for any other
/// path, including `/admin/breakers/reset` itself, where the prefix and the
/// suffix overlap and there is no key.
fn breaker_to_reset(path: &str) -> Option<&str> {
    let key = path
        .strip_prefix("/admin/breakers/")?
        .strip_suffix("/reset")?;
    (!key.is_empty()).then_some(key)
}

/// Decodes `%2F`-style escapes in a breaker key (`provider/agent`).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%')
            .then(|| s.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(v) => {
                out.push(v);
                i += 3;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::{breaker_to_reset, percent_decode};

    #[test]
    fn reset_paths_without_a_key_are_not_resets() {
        assert_eq!(breaker_to_reset("/admin/breakers/reset"), None);
        assert_eq!(breaker_to_reset("/admin/breakers//reset"), None);
        assert_eq!(
            breaker_to_reset("/admin/breakers/reset/reset"),
            Some("reset")
        );
        assert_eq!(
            breaker_to_reset("/admin/breakers/openai%2Fa/reset"),
            Some("openai%2Fa")
        );
        assert_eq!(breaker_to_reset("/admin/breakers"), None);
    }

    #[test]
    fn breaker_keys_decode() {
        assert_eq!(percent_decode("oa%2Fagent-a"), "oa/agent-a");
        assert_eq!(percent_decode("plain"), "plain");
        assert_eq!(percent_decode("bad%2"), "bad%2");
        assert_eq!(percent_decode("%zz%"), "%zz%");
    }
}
