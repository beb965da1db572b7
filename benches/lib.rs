//! Loopgate's benchmarks (see README, "Benchmarks").
//!
//! - `policy.rs`, `hot_path.rs` (criterion): the hot-path pieces.
//! - `bare_pingora.rs`: the baseline passthrough for `compare`.
//! - `compare`: wrk comparison against nginx and bare Pingora.
//! - `streams`: many concurrent SSE streams, bytes and RSS per stream.
//! - `quick-wrk.sh`: direct vs the demo gateway.
