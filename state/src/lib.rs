//! Loopgate's shared-state backends.
//!
//! [`RedisStore`] implements policy's [`StateStore`] on Redis so that
//! several gateway instances share one set of limits, budgets, concurrency
//! slots and idempotency records, exactly: every check-and-take is one Lua
//! script (loaded once, called by SHA), so two replicas can never both take
//! the last unit, and an admission costs one round trip.
//! [`FallbackStore`] adds `on_unavailable: local`. [`SharedFlags`] carries
//! small shared facts (open breakers) for the gateway to poll.
//!
//! [`StateStore`]: loopgate_policy::StateStore

mod fallback;
mod flags;
mod redis_store;

pub use fallback::FallbackStore;
pub use flags::SharedFlags;
pub use redis_store::{RedisConfig, RedisStore, StoreHealth};
