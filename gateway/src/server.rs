//! Assembles the Pingora server: the proxy service on `listen`, the admin
//! listener, and the background DNS refresher.

use crate::config::Config;
use crate::metrics::Metrics;
use crate::probe;
use crate::proxy::Gateway;
use crate::reload;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use loopgate_breaker::BreakerSet;
use loopgate_policy::{Clock, MemoryStore, StateStore, SystemClock};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::services::listening::Service;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How often host names of providers are resolved again.
const DNS_REFRESH: Duration = Duration::from_secs(30);

/// Runs the gateway until the process is stopped. Does not return.
pub fn run(cfg: Config, path: PathBuf) -> ! {
    let listen = cfg.listen;
    let admin = cfg.admin_listen;
    let threads = cfg.threads;
    resolve_all(&cfg);
    let config = Arc::new(ArcSwap::from_pointee(cfg));
    start_dns_refresher(config.clone());
    let metrics = Arc::new(Metrics::new());
    reload::spawn(path, config.clone(), metrics.clone());
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::new());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::default());
    let breakers = Arc::new(BreakerSet::new());
    probe::spawn(config.clone(), breakers.clone(), clock.clone());

    let conf = ServerConf {
        threads,
        // Agents hold long streams; give them a short, bounded drain on SIGTERM.
        grace_period_seconds: Some(1),
        graceful_shutdown_timeout_seconds: Some(5),
        upstream_keepalive_pool_size: 1024,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let mut proxy = pingora_proxy::http_proxy_service_with_name(
        &server.configuration,
        Gateway::new(config.clone(), store, clock, metrics.clone(), breakers),
        "loopgate proxy",
    );
    proxy.add_tcp(&listen.to_string());
    proxy.threads = Some(threads);
    server.add_service(proxy);

    if let Some(admin) = admin {
        let mut svc = Service::new("loopgate admin".to_string(), Admin { config, metrics });
        svc.add_tcp(&admin.to_string());
        svc.threads = Some(1);
        server.add_service(svc);
    }
    log::info!("loopgate listening on {listen}");
    server.run_forever()
}

fn resolve_all(cfg: &Config) {
    for p in cfg.providers.iter().filter(|p| p.needs_dns()) {
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

/// The admin listener. For now: liveness, readiness and metrics.
struct Admin {
    config: Arc<ArcSwap<Config>>,
    metrics: Arc<Metrics>,
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> http::Response<Vec<u8>> {
        let path = session.req_header().uri.path().to_string();
        if path == "/metrics" {
            let body = self.metrics.render();
            return http::Response::builder()
                .status(200)
                .header("content-type", "text/plain; version=0.0.4")
                .header("content-length", body.len())
                .body(body)
                .unwrap_or_default();
        }
        let (status, body) = match path.as_str() {
            "/health" => (
                200,
                serde_json::json!({"status": "ok", "pid": std::process::id()}),
            ),
            "/ready" => {
                let cfg = self.config.load();
                let unresolved: Vec<&str> = cfg
                    .providers
                    .iter()
                    .filter(|p| p.addr.load().is_none())
                    .map(|p| p.name.as_str())
                    .collect();
                if unresolved.is_empty() {
                    (200, serde_json::json!({"status": "ready"}))
                } else {
                    (
                        503,
                        serde_json::json!({"status": "not_ready", "unresolved_providers": unresolved}),
                    )
                }
            }
            _ => (404, serde_json::json!({"error": "not found"})),
        };
        let body = serde_json::to_vec(&body).unwrap_or_default();
        http::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .header("content-length", body.len())
            .body(body)
            .unwrap_or_default()
    }
}
