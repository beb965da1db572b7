//! Active half-open probes. A provider with `breaker.probe` configured is
//! never tested with an agent's request: while its breaker is half-open,
//! live traffic stays refused and this task sends the configured read-only
//! request (e.g. `GET /v1/models`) with the provider's credential. A
//! non-5xx, non-429 answer closes the breaker; anything else re-opens it.

use crate::config::runtime::Provider;
use crate::config::Config;
use crate::metrics::Metrics;
use arc_swap::ArcSwap;
use loopgate_breaker::{BreakerSet, FailureKind, Outcome};
use loopgate_policy::Clock;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::upstreams::peer::HttpPeer;
use std::sync::Arc;
use std::time::Duration;

const TICK: Duration = Duration::from_millis(250);

pub fn spawn(
    config: Arc<ArcSwap<Config>>,
    breakers: Arc<BreakerSet>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
) {
    let _ = std::thread::Builder::new()
        .name("loopgate-probe".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    log::error!("active probes disabled: cannot start a runtime: {e}");
                    return;
                }
            };
            rt.block_on(async move {
                let connector = Connector::new(None);
                loop {
                    tokio::time::sleep(TICK).await;
                    for (key, ticket, opened) in breakers.due_probes(clock.now()) {
                        if let Some(t) = opened {
                            metrics.transition(&key, &t);
                        }
                        metrics.half_open_probes.with_label_values(&[&key]).inc();
                        let cfg = config.load();
                        // Keys are `provider` or `provider/agent`.
                        let name = key.split('/').next().unwrap_or(&key);
                        let Some(p) = cfg.upstreams().find(|p| &*p.name == name) else {
                            breakers.abandon(&key, ticket);
                            continue;
                        };
                        let outcome = probe(&connector, p).await;
                        log::info!("breaker `{key}`: active probe: {outcome:?}");
                        if let Ok(Some(t)) =
                            breakers.record(&key, ticket, outcome, None, clock.now())
                        {
                            metrics.transition(&key, &t);
                        }
                    }
                }
            });
        });
}

/// Sends the provider's probe request and judges the answer.
async fn probe(connector: &Connector, p: &Provider) -> Outcome {
    let Some(probe) = &p.probe else {
        return Outcome::Success;
    };
    let Some(addr) = p.addr.load_full() else {
        return Outcome::Failure(FailureKind::Connect);
    };
    let mut peer = HttpPeer::new(*addr, p.tls, p.host.clone());
    peer.options.connection_timeout = Some(p.timeouts.connect);
    peer.options.total_connection_timeout = Some(p.timeouts.connect);
    peer.options.read_timeout = Some(p.timeouts.read.min(Duration::from_secs(10)));
    let send = async {
        let (mut session, _) = connector
            .get_http_session(&peer)
            .await
            .map_err(|_| FailureKind::Connect)?;
        let mut req = RequestHeader::build(
            probe.method.clone(),
            format!("{}{}", p.base_path, probe.path).as_bytes(),
            None,
        )
        .map_err(|_| FailureKind::ServerError)?;
        let _ = req.insert_header("host", p.authority.as_str());
        let _ = req.insert_header("user-agent", "loopgate-probe");
        p.authorize(&mut req)
            .map_err(|_| FailureKind::ServerError)?;
        session
            .write_request_header(Box::new(req))
            .await
            .map_err(|_| FailureKind::Connect)?;
        session
            .finish_request_body()
            .await
            .map_err(|_| FailureKind::Connect)?;
        session.read_response_header().await.map_err(|e| {
            if matches!(e.etype(), pingora::ErrorType::ReadTimedout) {
                FailureKind::Timeout
            } else {
                FailureKind::ServerError
            }
        })?;
        let status = session.response_header().map_or(0, |r| r.status.as_u16());
        Ok::<u16, FailureKind>(status)
    };
    match send.await {
        Ok(429) => Outcome::Failure(FailureKind::RateLimited),
        Ok(s) if s >= 500 || s == 0 => Outcome::Failure(FailureKind::ServerError),
        Ok(_) => Outcome::Success,
        Err(kind) => Outcome::Failure(kind),
    }
}
