//! Hot reload: on SIGHUP, or when the config file changes on disk (polled
//! once a second), parse and validate the file and swap the whole snapshot
//! atomically. Requests in flight finish on the snapshot they started with.
//! A file that fails validation changes nothing; its errors are logged as
//! `FILE: path.to.field: why`. Limit counters live in the state store, not
//! in the snapshot, so they survive a reload.

use crate::config::{Config, Source};
use crate::metrics::Metrics;
use arc_swap::ArcSwap;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

const POLL: Duration = Duration::from_secs(1);

pub fn spawn(source: Source, config: Arc<ArcSwap<Config>>, metrics: Arc<Metrics>) {
    let (tx, rx) = mpsc::channel::<()>();
    match signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP]) {
        Ok(mut signals) => {
            let _ = std::thread::Builder::new()
                .name("loopgate-sighup".into())
                .spawn(move || {
                    for _ in signals.forever() {
                        if tx.send(()).is_err() {
                            return;
                        }
                    }
                });
        }
        Err(e) => log::warn!("cannot listen for SIGHUP ({e}); reloading on file changes only"),
    }
    let _ = std::thread::Builder::new()
        .name("loopgate-reload".into())
        .spawn(move || {
            let mut seen = stamp(&source.path);
            loop {
                let signalled = match rx.recv_timeout(POLL) {
                    Ok(()) => true,
                    Err(mpsc::RecvTimeoutError::Timeout) => false,
                    // No signal thread: keep polling the file.
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        std::thread::sleep(POLL);
                        false
                    }
                };
                let now = stamp(&source.path);
                if signalled || now != seen {
                    seen = now;
                    reload(&source, &config, &metrics);
                }
            }
        });
}

/// What identifies a version of the file without reading it.
fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Loads the source and swaps it in if valid. Returns whether it was swapped.
pub fn reload(source: &Source, current: &ArcSwap<Config>, metrics: &Metrics) -> bool {
    try_reload(source, current, metrics).is_ok()
}

/// As [`reload`], returning the errors (`FILE: path: why`) of a bad file.
pub fn try_reload(
    source: &Source,
    current: &ArcSwap<Config>,
    metrics: &Metrics,
) -> Result<(), Vec<String>> {
    match source.load() {
        Ok(mut new) => {
            let old = current.load();
            for (what, changed) in [
                ("listen", old.listen != new.listen),
                ("admin.listen", old.admin_listen != new.admin_listen),
                ("threads", old.threads != new.threads),
                ("state", old.state != new.state),
            ] {
                if changed {
                    log::warn!(
                        "{}: {what} changed; it takes effect after a restart",
                        new.file
                    );
                }
            }
            // The running store stays (its limits and leases live there); the
            // snapshot says what is really in force.
            new.state = old.state.clone();
            // Keep known addresses so a reload never makes a provider unreachable.
            for p in new.upstreams().filter(|p| p.needs_dns()) {
                if let Some(addr) = old
                    .upstreams()
                    .find(|o| o.host == p.host && o.port == p.port)
                    .and_then(|o| o.addr.load_full())
                {
                    p.addr.store(Some(addr));
                } else if let Err(e) = p.resolve() {
                    log::warn!("provider `{}`: cannot resolve `{}`: {e}", p.name, p.host);
                }
            }
            log::info!(
                "{}: reloaded: {} providers, {} agents",
                new.file,
                new.providers.len(),
                new.agents.len()
            );
            current.store(Arc::new(new));
            metrics.reload(true);
            Ok(())
        }
        Err(errs) => {
            for e in &errs.0 {
                log::error!("config reload failed, keeping the running config: {e}");
            }
            metrics.reload(false);
            Err(errs.0.iter().map(|e| e.to_string()).collect())
        }
    }
}
