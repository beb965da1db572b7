//! What the gateway charges before it parses an MCP body into a
//! `serde_json::Value` (`loopgate_policy::json::parse_cost`) bounds what
//! judging it allocates at its peak, for the shapes whose tree costs the
//! most per byte (many small numbers, strings, empty or one-key objects,
//! one-element arrays, small keys, deep chains, an escape that makes the
//! parser copy a long string) and plain text; and it is not far above
//! it (at most 6x), so honest bodies are not refused for memory they
//! would never take. Counted by the global allocator; one test in this
//! binary, so that no other test's allocations count.

use loopgate_benches::bodies;

#[global_allocator]
static ALLOC: loopgate_benches::CountingAlloc = loopgate_benches::CountingAlloc;

/// How far above the peak the charge may be.
const SLACK: f64 = 6.0;

#[test]
fn the_charge_for_an_mcp_body_bounds_what_judging_it_allocates() {
    let mut wrong = Vec::new();
    for b in bodies::mcp(1 << 20) {
        let m = bodies::measure_mcp(&b.bytes);
        let len = b.bytes.len() as f64;
        println!(
            "{:<24} peak {:>6.2}x body, charged {:>6.2}x body ({})",
            b.name,
            m.peak as f64 / len,
            m.charged as f64 / len,
            m.outcome
        );
        if m.peak > m.charged {
            wrong.push(format!(
                "{}: peak {} over the charge {}",
                b.name, m.peak, m.charged
            ));
        }
        if m.charged as f64 > SLACK * m.peak.max(1) as f64 {
            wrong.push(format!(
                "{}: charged {} for a peak of {}",
                b.name, m.charged, m.peak
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
