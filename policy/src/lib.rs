//! Loopgate's admission layer.
//!
//! Pure rules: typed request facts go in, an [`Decision`] comes out. Nothing in
//! this crate knows about Pingora, sockets or the wall clock, so every rule is
//! unit-testable with plain values. The gateway is the thin adapter that
//! extracts facts from a request and renders denials.
//!
//! Evaluation order (cheap rejections cost least):
//! 1. endpoint and method (`not_found`, `method_not_allowed`),
//! 2. agent identity (`missing_key`, `unknown_key`),
//! 3. path allowlist (`path_not_allowed`),
//! 4. body size from `Content-Length`, then while reading (`body_too_large`),
//! 5. body shape (`invalid_json`, `missing_model`, `invalid_messages`),
//! 6. model allowlist (`model_not_allowed`), then routing (`unknown_model`).

pub mod body;
pub mod decision;
pub mod endpoint;
pub mod keys;
pub mod pattern;

pub use body::{inspect_body, BodyFacts};
pub use decision::{Deny, DenyCode};
pub use endpoint::Endpoint;
pub use keys::{hash_key, KeyDigest, KeyIndex};
pub use pattern::{NamePattern, PatternList};
