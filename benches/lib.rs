//! Loopgate's benchmarks.
//!
//! - `benches/policy.rs` (criterion): evaluating a typical request with 10
//!   vs 1,000 blocked phrases. `cargo bench -p loopgate-benches --bench policy`
//! - `benches/quick-wrk.sh`: wrk against the mock directly and through the
//!   gateway, same request, interleaved; prints both.
//!
//! The comparison against nginx and a bare Pingora passthrough arrives with
//! the performance work.
