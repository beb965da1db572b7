//! Loopgate's benchmarks.
//!
//! - `benches/quick-wrk.sh`: wrk against the mock directly and through the
//!   gateway, same request, interleaved; prints both and the ratio.
//!
//! Criterion micro-benchmarks of the hot path and the comparison against
//! nginx and a bare Pingora passthrough arrive with the performance work.
