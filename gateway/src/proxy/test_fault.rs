//! A test-only fault point: `LOOPGATE_TEST_FAULT=upstream_request_filter:<agent>`
//! makes every request of `<agent>` fail inside the gateway after its peer
//! was chosen and its breaker ticket taken, as a bug in building the
//! upstream request would. The end-to-end tests use it to show that the
//! gateway's own failure is answered 500 `internal_error` and never counted
//! against a provider's breaker (`tests/hostile.rs`).
//!
//! Read once, when the gateway is built; unset (every deployment) it is one
//! `None` check per upstream request. Not configuration: never set it
//! outside tests.

use pingora::{Error, ErrorType};

/// The environment variable naming the fault point.
pub const ENV: &str = "LOOPGATE_TEST_FAULT";

/// Where the gateway fails on purpose, and for whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestFault {
    /// The agent whose requests fail; others pass untouched.
    agent: String,
}

impl TestFault {
    /// From [`ENV`], read once; `None` when unset. A value naming no known
    /// fault point is ignored, with a warning.
    pub fn from_env() -> Option<TestFault> {
        let v = std::env::var(ENV).ok()?;
        let parsed = TestFault::parse(&v);
        match &parsed {
            Some(f) => log::warn!(
                "{ENV} is set: requests of agent `{}` fail on purpose after routing (tests only)",
                f.agent
            ),
            None => log::warn!("{ENV}={v:?} names no fault point; ignored"),
        }
        parsed
    }

    fn parse(v: &str) -> Option<TestFault> {
        let agent = v.strip_prefix("upstream_request_filter:")?;
        (!agent.is_empty()).then(|| TestFault {
            agent: agent.to_string(),
        })
    }

    /// In `upstream_request_filter`: fails the request if it is `agent`'s.
    pub fn check(&self, agent: Option<&str>) -> pingora::Result<()> {
        if agent == Some(self.agent.as_str()) {
            return Err(Error::explain(
                ErrorType::InternalError,
                "injected test fault (LOOPGATE_TEST_FAULT)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_point_and_agent_fail() {
        assert_eq!(TestFault::parse(""), None);
        assert_eq!(TestFault::parse("upstream_request_filter:"), None);
        assert_eq!(TestFault::parse("response_filter:bulk"), None);
        let f = TestFault::parse("upstream_request_filter:bulk").unwrap();
        assert!(f.check(Some("bulk")).is_err());
        assert!(f.check(Some("tester")).is_ok());
        assert!(f.check(None).is_ok());
    }
}
