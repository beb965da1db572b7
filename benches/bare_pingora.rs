//! The baseline for `benches/compare`: the thinnest possible Pingora
//! reverse proxy, forwarding everything to one upstream with keep-alive.
//! Whatever Loopgate costs on top of this is Loopgate's own work: it runs
//! with Loopgate's server settings (allocator, runtime, keep-alive pool,
//! listener buffers), so the ratio measures the gateway, not the tuning.
//!
//! Usage: bare-pingora LISTEN UPSTREAM THREADS

use async_trait::async_trait;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::upstreams::peer::HttpPeer;
use pingora_proxy::{ProxyHttp, Session};
use std::net::SocketAddr;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Passthrough {
    upstream: SocketAddr,
}

#[async_trait]
impl ProxyHttp for Passthrough {
    type CTX = ();
    fn new_ctx(&self) {}

    async fn upstream_peer(&self, _s: &mut Session, _c: &mut ()) -> pingora::Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: bare-pingora LISTEN UPSTREAM THREADS");
        std::process::exit(2);
    }
    let upstream: SocketAddr = args[2].parse().expect("UPSTREAM is ip:port");
    let threads: usize = args[3].parse().expect("THREADS is a number");
    let conf = ServerConf {
        threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        upstream_keepalive_pool_size: 1024,
        work_stealing: threads > 1,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut svc =
        pingora_proxy::http_proxy_service(&server.configuration, Passthrough { upstream });
    svc.add_listener(
        ListenerConfig::tcp(args[1].clone()).l4_buffer(L4BufferSettings::default().read(0)),
    );
    svc.threads = Some(threads);
    server.add_service(svc);
    server.run_forever();
}
