//! Loopgate's admission layer.
//!
//! Pure rules: typed request facts go in, an [`Decision`] comes out. Nothing in
//! this crate knows about Pingora, sockets or the wall clock, so every rule is
//! unit-testable with plain values. The gateway is the thin adapter that
//! extracts facts from a request and renders denials.
//!
//! Evaluation order, written down once (cheap rejections cost least; the
//! first enforced denial ends the evaluation):
//! 1. endpoint and method (`not_found`, `method_not_allowed`),
//! 2. agent identity (`missing_key`, `unknown_key`),
//! 3. cheap header checks: path allowlist (`path_not_allowed`), required
//!    headers (`missing_header`),
//! 4. body size, from `Content-Length` before reading, then while reading
//!    (`body_too_large`),
//! 5. body shape (`invalid_json`, `invalid_request`, `missing_model`,
//!    `invalid_messages`),
//! 6. body rules: model (`model_not_allowed`), tools (`tool_not_allowed`),
//!    `max_tokens` (`max_tokens_exceeded`), message count
//!    (`too_many_messages`), blocked phrases (`blocked_phrase`),
//! 7. routing (`unknown_model`), then the context window of the model
//!    routed to (`context_window_exceeded`, [`prompt`]),
//! 8. limits, all in one atomic store call: requests and tokens per minute
//!    (`rate_limited`), in-flight requests (`too_many_in_flight`).
//!
//! Any failure while evaluating denies: a failed state store with
//! `state_unavailable`, other internal failures with `policy_unavailable`; nothing is ever allowed by error. Rules of
//! steps 3, 6 and 8 can run in dry-run (see [`rules::Mode`]).

pub mod body;
pub mod clock;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod decision;
pub mod endpoint;
pub mod json;
pub mod keys;
pub mod mcp;
pub mod normalize;
pub mod output;
pub mod pattern;
pub mod phrases;
pub mod predict;
pub mod price;
pub mod prompt;
pub mod rewrite;
pub mod rules;
pub mod store;
pub mod streak;
pub mod tokens;
pub mod uri;
pub mod usage;
pub mod watchdog;

pub use body::{inspect_body, inspect_body_with, BodyFacts, NoTokens};
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{clip, BudgetDetail, BudgetLevel, Deny, DenyCode};
pub use endpoint::Endpoint;
pub use keys::{hash_key, KeyDigest, KeyIndex};
pub use output::{LimitField, OutputLimit, TargetOutput};
pub use pattern::{NamePattern, PatternList};
pub use phrases::PhraseMatcher;
pub use price::Price;
pub use rewrite::replace_model;
pub use rules::{
    AgentKeys, AgentRules, Budgets, LimitRequest, Limits, LimitsTaken, Mode, MoneyAsk, Team,
    Verdict,
};
pub use store::{
    slice_end, slice_of, step_record, window_sums, AdmitOutcome, IdemBegin, IdemOutcome,
    IdemRecord, Lease, MemoryStore, Refusal, SlotTake, StateStore, StepError, StoreError,
    WindowTake, MAX_RECORDS, MAX_SESSIONS, SESSION_PREFIX, SLICES,
};
pub use streak::Streak;
pub use tokens::{Token, TokenSink};
pub use usage::{Usage, UsageScanner};
pub use watchdog::{Level, Reading, RedAction, Thresholds, WatchdogConfig};

/// Drives a future that never waits (the memory store's) in a test.
#[cfg(test)]
pub(crate) mod test_support {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    /// The output of `f`, which must be ready at its first poll.
    pub fn ready<F: Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("the future waited"),
        }
    }
}
