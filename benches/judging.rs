//! What judging costs per body: for each body of issue #35's table (and a
//! few more that probe the same costs), the CPU per byte and the peak
//! memory of judging it as the gateway judges a chat completion's body
//! (facts, blocked phrases, the loop guard's fingerprint when it carries a
//! task id), in process, printed as ratios against the plain-ASCII body
//! measured in the same run. Memory is what the body holds plus what
//! judging allocates at its peak (counted by the global allocator).
//!
//! `benches/judging-binary` sends the same bodies to the real binary.
//!
//! `judging --mcp [MiB]` prints what parsing MCP bodies of the costliest
//! shapes allocates, against the body and against the gateway's charge.
//!
//! Run: cargo run --release -p loopgate-benches --bin judging [MiB] [runs]
//! [name] (default 8 MiB bodies, CPU the least of 5 runs, every body;
//! with a name, plain ASCII and the bodies whose names hold it). The CPU
//! is this thread's, so other work on the machine counts little.

use loopgate_benches::bodies::{self, Body};
use loopgate_breaker::LoopConfig;
use std::hint::black_box;

#[global_allocator]
static ALLOC: loopgate_benches::CountingAlloc = loopgate_benches::CountingAlloc;

fn main() {
    if let Some(dir) = std::env::args().nth(1).filter(|a| a == "--dump") {
        return dump(&dir, std::env::args().nth(2));
    }
    if std::env::args().nth(1).as_deref() == Some("--mcp") {
        let mib: f64 = std::env::args()
            .nth(2)
            .and_then(|a| a.parse().ok())
            .unwrap_or(8.0);
        return mcp((mib * 1024.0 * 1024.0) as usize - 4096);
    }
    let mut args = std::env::args().skip(1);
    let mib: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(8.0);
    let runs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    // Only the bodies whose names hold this (plain ASCII is always first).
    let only = args.next().unwrap_or_default();
    let size = (mib * 1024.0 * 1024.0) as usize - 4096;
    let phrases = bodies::phrases();
    let loops = LoopConfig::default();
    let all: Vec<Body> = bodies::table(size)
        .into_iter()
        .chain(bodies::extra(size))
        .collect();
    println!(
        "{:<28} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9}",
        "body", "bytes", "cpu ms", "ns/byte", "cpu/ascii", "peak MiB", "mem/body"
    );
    let mut ascii = None;
    for (i, b) in all.iter().enumerate() {
        if i > 0 && !b.name.contains(&only) {
            continue;
        }
        if i == bodies::TABLE_LEN {
            println!("-- beyond the table");
        }
        let m = loopgate_benches::bodies::measure(b, &phrases, &loops, runs);
        let per_byte = m.cpu.as_nanos() as f64 / b.bytes.len() as f64;
        let reference = *ascii.get_or_insert(per_byte);
        println!(
            "{:<28} {:>9} {:>9.1} {:>8.2} {:>8.1}x {:>9.1} {:>8.2}x {}",
            b.name,
            b.bytes.len(),
            m.cpu.as_secs_f64() * 1e3,
            per_byte,
            per_byte / reference,
            m.peak as f64 / (1 << 20) as f64,
            m.peak as f64 / b.bytes.len() as f64,
            m.outcome,
        );
        black_box(&m);
    }
}

/// `--mcp [MiB]`: what parsing MCP bodies of the costliest shapes into a
/// `serde_json::Value` allocates at its peak, against the body's size and
/// against what `parse_cost` charges for it (the gateway's charge).
fn mcp(size: usize) {
    println!(
        "{:<24} {:>9} {:>10} {:>9} {:>10} {:>9}",
        "MCP body", "bytes", "peak MiB", "peak/body", "charged/body", "charged/peak"
    );
    for b in bodies::mcp(size) {
        let m = bodies::measure_mcp(&b.bytes);
        let len = b.bytes.len() as f64;
        println!(
            "{:<24} {:>9} {:>10.1} {:>8.2}x {:>11.2}x {:>11.2}x {}",
            b.name,
            b.bytes.len(),
            m.peak as f64 / (1 << 20) as f64,
            m.peak as f64 / len,
            m.charged as f64 / len,
            m.charged as f64 / m.peak.max(1) as f64,
            m.outcome
        );
    }
}

/// `--dump DIR`: writes the table's 8 MiB bodies into DIR, one file each
/// (`NN.json`, `NN.task` when it carries a task id, `NN.name`), for
/// `benches/judging-binary`, which sends them to the real binary.
fn dump(_: &str, dir: Option<String>) {
    let dir = std::path::PathBuf::from(dir.expect("usage: judging --dump DIR"));
    std::fs::create_dir_all(&dir).expect("create the directory");
    for (i, b) in bodies::table((8 << 20) - 4096).iter().enumerate() {
        std::fs::write(dir.join(format!("{i:02}.json")), &b.bytes).expect("write");
        std::fs::write(dir.join(format!("{i:02}.name")), b.name).expect("write");
        if b.task {
            std::fs::write(dir.join(format!("{i:02}.task")), "").expect("write");
        }
    }
}
