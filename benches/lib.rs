//! Loopgate's benchmarks (see README, "Benchmarks").
//!
//! - `policy.rs`, `hot_path.rs` (criterion): the hot-path pieces.
//! - `judging.rs` (with [`bodies`]): what judging hostile bodies costs per
//!   byte, against plain ASCII; `tests/judging.rs` bounds it.
//! - `latency.rs`: another agent's latency while a hostile agent sends
//!   the costliest bodies, against the real binary (through
//!   `loopgate-tests`' harness).
//! - `bare_pingora.rs`: the baseline passthrough for `compare`.
//! - `compare`: wrk comparison against nginx and bare Pingora.
//! - `streams`: many concurrent SSE streams, bytes and RSS per stream.
//! - `quick-wrk.sh`: direct vs the demo gateway.
//!
//! The criterion benches also print allocations per call of each piece,
//! counted by [`CountingAlloc`] (set as their global allocator).

pub mod bodies;

use mimalloc::MiMalloc;
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering};

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Bytes allocated and not yet freed, and the most since [`reset_peak`].
static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

fn grew(by: u64) {
    let live = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

fn shrank(by: u64) {
    LIVE.fetch_sub(by, Ordering::Relaxed);
}

/// The gateway's allocator (mimalloc), counting allocations (reallocations
/// included: a growing buffer is work the hot path does too), so the
/// criterion timings are taken on the allocator `loopgate` runs on; it also
/// keeps the bytes held and their peak ([`peak_bytes`]).
pub struct CountingAlloc;

// SAFETY: forwards every call unchanged to `MiMalloc`; the counter is a
// relaxed atomic with no effect on the memory handed out.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        grew(layout.size() as u64);
        unsafe { MiMalloc.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        grew(layout.size() as u64);
        unsafe { MiMalloc.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // Counted as held twice while it moves: a reallocation that cannot
        // grow in place copies into a new block before freeing the old.
        grew(new_size as u64);
        let p = unsafe { MiMalloc.realloc(ptr, layout, new_size) };
        shrank(layout.size() as u64);
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrank(layout.size() as u64);
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }
}

/// Average allocations per call of `f` over `calls` calls (after one
/// warm-up call, so lazily built state is not counted).
pub fn allocations_per_call(calls: u64, mut f: impl FnMut()) -> f64 {
    f();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..calls {
        f();
    }
    (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / calls as f64
}

/// Restarts [`peak_bytes`] from the bytes held now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// The most bytes held at once since [`reset_peak`], less those held when
/// it was called: what the code in between allocated at its peak (on this
/// process's allocator, so only where [`CountingAlloc`] is the global one).
pub fn peak_bytes(held_before: u64) -> u64 {
    PEAK.load(Ordering::Relaxed).saturating_sub(held_before)
}

/// Bytes held now.
pub fn live_bytes() -> u64 {
    LIVE.load(Ordering::Relaxed)
}

/// Prints one "allocations per call" line, in the bench's output.
pub fn report_allocations(name: &str, calls: u64, f: impl FnMut()) {
    println!(
        "allocations per call: {name:<40} {:>6.1}",
        allocations_per_call(calls, f)
    );
}

/// This process's resident memory in bytes (`VmRSS` in `/proc/self/status`,
/// which the kernel reports in kB whatever the page size; 0 where there is
/// none), for benches that report what a structure costs to hold.
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb * 1024)
}
