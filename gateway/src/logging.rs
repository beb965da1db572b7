//! The process logger: env_logger, with the levels of Pingora's own lines
//! set to what the events deserve for an operator whose alerting reads
//! ERROR lines.
//!
//! Pingora 0.9 logs `failed to acquire reusable stream` at ERROR when a
//! pooled upstream connection is being checked by its idle watcher at the
//! moment a request wants it (a `try_lock` race in
//! `pingora_core::connectors`): the request simply opens a new connection
//! and nothing fails. Seen 26 times in 3 minutes at one request a second
//! with no failed request. It is logged at debug here and counted
//! (`loopgate_upstream_pool_races_total`), so it is visible without paging
//! anyone.

use std::sync::LazyLock;

/// Pooled connections skipped because the pool's idle watcher held them.
pub static POOL_RACES: LazyLock<prometheus::IntCounter> = LazyLock::new(|| {
    prometheus::IntCounter::new(
        "loopgate_upstream_pool_races_total",
        "Pooled upstream connections skipped because the pool was checking them at that moment (Pingora's 'failed to acquire reusable stream'); a new connection was opened instead, nothing failed.",
    )
    .expect("valid metric")
});

/// Installs the logger: `RUST_LOG` (default `info`), with Pingora's
/// modules that dump raw request bytes held at info or above.
pub fn init() {
    // Pingora's HTTP/1 code dumps a malformed request's raw bytes at debug
    // level, agents' keys included: those modules never log below info,
    // whatever RUST_LOG says. Loopgate's own debug lines carry no secrets.
    let inner = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .filter_module("pingora_core::protocols", log::LevelFilter::Info)
        .filter_module("pingora_proxy", log::LevelFilter::Info)
        .build();
    let max = inner.filter();
    if log::set_boxed_logger(Box::new(Levelled { inner })).is_ok() {
        log::set_max_level(max);
    }
}

/// env_logger with some of Pingora's lines moved to their level.
struct Levelled<L> {
    inner: L,
}

/// What the logger does with one record.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    AsIs,
    /// The pool race: counted, then logged at debug.
    PoolRace,
}

fn route(r: &log::Record<'_>) -> Route {
    if r.level() == log::Level::Error
        && r.target() == "pingora_core::connectors"
        && r.args().as_str() == Some("failed to acquire reusable stream")
    {
        Route::PoolRace
    } else {
        Route::AsIs
    }
}

impl<L: log::Log> log::Log for Levelled<L> {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        self.inner.enabled(m)
    }

    fn log(&self, r: &log::Record<'_>) {
        match route(r) {
            Route::AsIs => self.inner.log(r),
            Route::PoolRace => {
                POOL_RACES.inc();
                let lowered = log::Record::builder()
                    .args(*r.args())
                    .level(log::Level::Debug)
                    .target(r.target())
                    .module_path(r.module_path())
                    .file(r.file())
                    .line(r.line())
                    .build();
                if self.inner.enabled(lowered.metadata()) {
                    self.inner.log(&lowered);
                }
            }
        }
    }

    fn flush(&self) {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::Log;
    use std::sync::Mutex;

    /// Records what reaches it, at the level it arrives, when enabled.
    struct Seen {
        min: log::Level,
        lines: Mutex<Vec<(log::Level, String)>>,
    }

    impl Log for Seen {
        fn enabled(&self, m: &log::Metadata<'_>) -> bool {
            m.level() <= self.min
        }
        fn log(&self, r: &log::Record<'_>) {
            if self.enabled(r.metadata()) {
                let mut lines = self.lines.lock().unwrap();
                lines.push((r.level(), r.args().to_string()));
            }
        }
        fn flush(&self) {}
    }

    fn record<'a>(
        level: log::Level,
        target: &'a str,
        args: std::fmt::Arguments<'a>,
    ) -> log::Record<'a> {
        log::Record::builder()
            .level(level)
            .target(target)
            .args(args)
            .build()
    }

    #[test]
    fn the_pool_race_is_counted_and_logged_at_debug_only() {
        let at = |min| Levelled {
            inner: Seen {
                min,
                lines: Mutex::new(Vec::new()),
            },
        };
        let before = POOL_RACES.get();
        let info = at(log::Level::Info);
        info.log(&record(
            log::Level::Error,
            "pingora_core::connectors",
            format_args!("failed to acquire reusable stream"),
        ));
        assert!(info.inner.lines.lock().unwrap().is_empty());
        assert_eq!(POOL_RACES.get(), before + 1);
        let debug = at(log::Level::Debug);
        debug.log(&record(
            log::Level::Error,
            "pingora_core::connectors",
            format_args!("failed to acquire reusable stream"),
        ));
        assert_eq!(
            *debug.inner.lines.lock().unwrap(),
            [(
                log::Level::Debug,
                "failed to acquire reusable stream".to_string()
            )]
        );
        // Other errors, from there or elsewhere, stay errors.
        for (target, text) in [
            ("pingora_core::connectors", "connect failed"),
            ("loopgate::proxy", "failed to acquire reusable stream"),
        ] {
            let info = at(log::Level::Info);
            info.log(&record(log::Level::Error, target, format_args!("{text}")));
            assert_eq!(
                *info.inner.lines.lock().unwrap(),
                [(log::Level::Error, text.to_string())]
            );
        }
        assert_eq!(POOL_RACES.get(), before + 2);
    }
}
