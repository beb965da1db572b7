//! Denial codes: one stable, machine-readable code per reason a request is
//! refused, each with its HTTP status and whether retrying can help.

use std::fmt;
use std::time::Duration;

/// Why a request was refused. The string form (`as_str`) is part of the API:
/// agents match on it and metrics use it as a bounded label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DenyCode {
    NotFound,
    MethodNotAllowed,
    MissingKey,
    UnknownKey,
    PathNotAllowed,
    MissingHeader,
    BodyTooLarge,
    InvalidJson,
    InvalidRequest,
    MissingModel,
    InvalidMessages,
    ModelNotAllowed,
    UnknownModel,
    ToolNotAllowed,
    MaxTokensExceeded,
    TooManyMessages,
    BlockedPhrase,
    RateLimited,
    TooManyInFlight,
    /// A token budget (per task, per agent per day) cannot fit the request.
    BudgetExceeded,
    /// The task repeats itself: it cools down before it may call again.
    LoopDetected,
    /// The task watchdog turned red with action `stop`.
    TaskStopped,
    /// A side-effecting tool call without the `Idempotency-Key` it requires.
    IdempotencyKeyRequired,
    /// The first request with this idempotency key is still running.
    RequestInProgress,
    /// The idempotency key was used before with a different body.
    IdempotencyKeyReused,
    /// The first request with this key may or may not have taken effect.
    OutcomeUnknown,
    /// This task got the same failing answer from this tool repeatedly: the
    /// tool is isolated for the task for a while.
    ToolIsolated,
    /// A tool path that is malformed or escapes its tool (`..`, `//`).
    InvalidPath,
    /// A body without `Content-Length` where a size limit applies.
    LengthRequired,
    /// The policy could not be evaluated (a failed store, a poisoned lock):
    /// the request is refused, never let through.
    PolicyUnavailable,
    /// The shared state store (Redis) did not answer in time or at all.
    StateUnavailable,
    /// An MCP session id presented by an agent other than its owner.
    SessionNotOwned,
    /// A header the gateway reads (`x-agent-task-id`) that is malformed or
    /// given twice: refused rather than ignored, so no guard is skipped.
    InvalidHeader,
    /// The prompt plus the output limit exceeds the model's context window.
    ContextWindowExceeded,
    /// A call under a money budget to a model without a price, with
    /// `on_unknown_price: deny`: a budget that cannot be computed is not
    /// a budget.
    PriceUnknown,
}

impl DenyCode {
    pub const ALL: [DenyCode; 35] = [
        DenyCode::NotFound,
        DenyCode::MethodNotAllowed,
        DenyCode::MissingKey,
        DenyCode::UnknownKey,
        DenyCode::PathNotAllowed,
        DenyCode::MissingHeader,
        DenyCode::BodyTooLarge,
        DenyCode::InvalidJson,
        DenyCode::InvalidRequest,
        DenyCode::MissingModel,
        DenyCode::InvalidMessages,
        DenyCode::ModelNotAllowed,
        DenyCode::UnknownModel,
        DenyCode::ToolNotAllowed,
        DenyCode::MaxTokensExceeded,
        DenyCode::TooManyMessages,
        DenyCode::BlockedPhrase,
        DenyCode::RateLimited,
        DenyCode::TooManyInFlight,
        DenyCode::BudgetExceeded,
        DenyCode::LoopDetected,
        DenyCode::TaskStopped,
        DenyCode::InvalidPath,
        DenyCode::LengthRequired,
        DenyCode::IdempotencyKeyRequired,
        DenyCode::RequestInProgress,
        DenyCode::IdempotencyKeyReused,
        DenyCode::OutcomeUnknown,
        DenyCode::ToolIsolated,
        DenyCode::PolicyUnavailable,
        DenyCode::StateUnavailable,
        DenyCode::SessionNotOwned,
        DenyCode::InvalidHeader,
        DenyCode::ContextWindowExceeded,
        DenyCode::PriceUnknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DenyCode::NotFound => "not_found",
            DenyCode::MethodNotAllowed => "method_not_allowed",
            DenyCode::MissingKey => "missing_key",
            DenyCode::UnknownKey => "unknown_key",
            DenyCode::PathNotAllowed => "path_not_allowed",
            DenyCode::MissingHeader => "missing_header",
            DenyCode::BodyTooLarge => "body_too_large",
            DenyCode::InvalidJson => "invalid_json",
            DenyCode::InvalidRequest => "invalid_request",
            DenyCode::MissingModel => "missing_model",
            DenyCode::InvalidMessages => "invalid_messages",
            DenyCode::ModelNotAllowed => "model_not_allowed",
            DenyCode::UnknownModel => "unknown_model",
            DenyCode::ToolNotAllowed => "tool_not_allowed",
            DenyCode::MaxTokensExceeded => "max_tokens_exceeded",
            DenyCode::TooManyMessages => "too_many_messages",
            DenyCode::BlockedPhrase => "blocked_phrase",
            DenyCode::RateLimited => "rate_limited",
            DenyCode::TooManyInFlight => "too_many_in_flight",
            DenyCode::BudgetExceeded => "budget_exceeded",
            DenyCode::LoopDetected => "loop_detected",
            DenyCode::TaskStopped => "task_stopped",
            DenyCode::InvalidPath => "invalid_path",
            DenyCode::IdempotencyKeyRequired => "idempotency_key_required",
            DenyCode::RequestInProgress => "request_in_progress",
            DenyCode::IdempotencyKeyReused => "idempotency_key_reused",
            DenyCode::OutcomeUnknown => "outcome_unknown",
            DenyCode::ToolIsolated => "tool_isolated",
            DenyCode::LengthRequired => "length_required",
            DenyCode::PolicyUnavailable => "policy_unavailable",
            DenyCode::StateUnavailable => "state_unavailable",
            DenyCode::SessionNotOwned => "session_not_owned",
            DenyCode::InvalidHeader => "invalid_header",
            DenyCode::ContextWindowExceeded => "context_window_exceeded",
            DenyCode::PriceUnknown => "price_unknown",
        }
    }

    pub fn parse(s: &str) -> Option<DenyCode> {
        DenyCode::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// The HTTP status this denial is answered with.
    pub fn status(self) -> u16 {
        match self {
            DenyCode::NotFound | DenyCode::UnknownModel => 404,
            DenyCode::MethodNotAllowed => 405,
            DenyCode::MissingKey | DenyCode::UnknownKey => 401,
            DenyCode::PathNotAllowed
            | DenyCode::ModelNotAllowed
            | DenyCode::ToolNotAllowed
            | DenyCode::SessionNotOwned
            | DenyCode::BlockedPhrase => 403,
            DenyCode::BodyTooLarge => 413,
            DenyCode::MissingHeader
            | DenyCode::InvalidHeader
            | DenyCode::InvalidJson
            | DenyCode::InvalidRequest
            | DenyCode::MissingModel
            | DenyCode::InvalidMessages
            | DenyCode::MaxTokensExceeded
            | DenyCode::ContextWindowExceeded
            | DenyCode::TooManyMessages => 400,
            DenyCode::RateLimited | DenyCode::TooManyInFlight | DenyCode::TaskStopped => 429,
            DenyCode::BudgetExceeded | DenyCode::PriceUnknown => 402,
            DenyCode::InvalidPath | DenyCode::IdempotencyKeyRequired => 400,
            DenyCode::RequestInProgress | DenyCode::OutcomeUnknown | DenyCode::ToolIsolated => 409,
            DenyCode::IdempotencyKeyReused => 422,
            DenyCode::LengthRequired => 411,
            DenyCode::LoopDetected => 409,
            DenyCode::PolicyUnavailable | DenyCode::StateUnavailable => 503,
        }
    }

    /// The OpenAI-style error `type` this code belongs to.
    pub fn error_type(self) -> &'static str {
        match self {
            DenyCode::MissingKey | DenyCode::UnknownKey => "authentication_error",
            DenyCode::PathNotAllowed
            | DenyCode::ModelNotAllowed
            | DenyCode::ToolNotAllowed
            | DenyCode::SessionNotOwned
            | DenyCode::BlockedPhrase => "permission_error",
            DenyCode::NotFound | DenyCode::UnknownModel => "not_found_error",
            DenyCode::RateLimited | DenyCode::TooManyInFlight => "rate_limit_error",
            DenyCode::BudgetExceeded
            | DenyCode::PriceUnknown
            | DenyCode::LoopDetected
            | DenyCode::TaskStopped
            | DenyCode::ToolIsolated => "guard_error",
            DenyCode::PolicyUnavailable | DenyCode::StateUnavailable => "gateway_error",
            DenyCode::MethodNotAllowed
            | DenyCode::InvalidPath
            | DenyCode::LengthRequired
            | DenyCode::IdempotencyKeyRequired
            | DenyCode::RequestInProgress
            | DenyCode::IdempotencyKeyReused
            | DenyCode::OutcomeUnknown
            | DenyCode::MissingHeader
            | DenyCode::InvalidHeader
            | DenyCode::BodyTooLarge
            | DenyCode::InvalidJson
            | DenyCode::InvalidRequest
            | DenyCode::MissingModel
            | DenyCode::InvalidMessages
            | DenyCode::MaxTokensExceeded
            | DenyCode::ContextWindowExceeded
            | DenyCode::TooManyMessages => "invalid_request_error",
        }
    }

    /// Whether the same request can succeed later. Only limits and the
    /// gateway's own unavailability pass; the rest needs a different request.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            DenyCode::RateLimited
                | DenyCode::TooManyInFlight
                | DenyCode::RequestInProgress
                | DenyCode::PolicyUnavailable
                | DenyCode::StateUnavailable
        )
    }

    /// Whether an operator may put this rule in dry-run. Identity and body
    /// shape never are: without them the request cannot be routed at all.
    pub fn dry_runnable(self) -> bool {
        matches!(
            self,
            DenyCode::PathNotAllowed
                | DenyCode::MissingHeader
                | DenyCode::ModelNotAllowed
                | DenyCode::ToolNotAllowed
                | DenyCode::MaxTokensExceeded
                | DenyCode::TooManyMessages
                | DenyCode::BlockedPhrase
                | DenyCode::RateLimited
                | DenyCode::TooManyInFlight
                | DenyCode::BudgetExceeded
                | DenyCode::PriceUnknown
                | DenyCode::LoopDetected
                | DenyCode::TaskStopped
                | DenyCode::ToolIsolated
        )
    }
}

impl fmt::Display for DenyCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Cuts agent-controlled text (a model, tool or path name) echoed in a
/// message or a log line to at most `max` bytes, on a character boundary.
pub fn clip(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Which money budget refused a call (a fixed set: also a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetLevel {
    /// The task's (`x-agent-task-id`) budget, `budgets.task_usd`.
    Task,
    /// The agent's, any 24 hours (`budgets.daily_usd`).
    AgentDay,
    /// The agent's, any 30 days (`budgets.monthly_usd`).
    AgentMonth,
    /// The agent's team's, any 24 hours (`teams.<t>.daily_usd`).
    TeamDay,
    /// The agent's team's, any 30 days (`teams.<t>.monthly_usd`).
    TeamMonth,
}

impl BudgetLevel {
    pub const ALL: [BudgetLevel; 5] = [
        BudgetLevel::Task,
        BudgetLevel::AgentDay,
        BudgetLevel::AgentMonth,
        BudgetLevel::TeamDay,
        BudgetLevel::TeamMonth,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BudgetLevel::Task => "task",
            BudgetLevel::AgentDay => "agent_day",
            BudgetLevel::AgentMonth => "agent_month",
            BudgetLevel::TeamDay => "team_day",
            BudgetLevel::TeamMonth => "team_month",
        }
    }

    /// In words, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            BudgetLevel::Task => "task budget",
            BudgetLevel::AgentDay => "agent's daily budget",
            BudgetLevel::AgentMonth => "agent's monthly budget",
            BudgetLevel::TeamDay => "team's daily budget",
            BudgetLevel::TeamMonth => "team's monthly budget",
        }
    }
}

/// The amounts of a money budget's refusal, in micro-dollars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetDetail {
    pub level: BudgetLevel,
    /// The budget.
    pub limit: u64,
    /// What this call would have reserved.
    pub reserve: u64,
}

/// A refusal with a human-readable reason. The message never contains a
/// secret: at most a model, tool or header name, or a path the agent sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deny {
    pub code: DenyCode,
    pub message: String,
    pub retryable: bool,
    /// When a retry can succeed (sent as `Retry-After`, whole seconds).
    pub retry_after: Option<Duration>,
    /// A money budget's refusal: which level, with its amounts (boxed:
    /// every other refusal carries none, and a `Deny` travels in `Result`s).
    pub budget: Option<Box<BudgetDetail>>,
}

impl Deny {
    pub fn new(code: DenyCode, message: impl Into<String>) -> Self {
        Deny {
            code,
            message: message.into(),
            retryable: code.retryable(),
            retry_after: None,
            budget: None,
        }
    }

    /// The money budget that refused, with its amounts.
    pub fn with_budget(mut self, detail: BudgetDetail) -> Self {
        self.budget = Some(Box::new(detail));
        self
    }

    /// A retry after `after` can succeed.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self.retryable = true;
        self
    }

    /// For a limit the request can never fit (e.g. more tokens than the limit).
    pub fn never_retryable(mut self) -> Self {
        self.retryable = false;
        self
    }

    /// `Retry-After` in whole seconds, rounded up so that a client waiting
    /// that long is never early.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after
            .map(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_parse_back_and_statuses_are_errors() {
        let mut seen = std::collections::HashSet::new();
        for code in DenyCode::ALL {
            assert!(seen.insert(code.as_str()), "duplicate code {code}");
            assert_eq!(DenyCode::parse(code.as_str()), Some(code));
            assert!((400..600).contains(&code.status()), "{code}");
        }
        assert_eq!(DenyCode::parse("nope"), None);
    }

    #[test]
    fn retry_after_rounds_up() {
        let d = Deny::new(DenyCode::RateLimited, "x").retry_after(Duration::from_millis(1001));
        assert_eq!(d.retry_after_secs(), Some(2));
        let d = Deny::new(DenyCode::RateLimited, "x").retry_after(Duration::from_secs(3));
        assert_eq!(d.retry_after_secs(), Some(3));
        assert!(d.retryable);
        assert!(!d.never_retryable().retryable);
    }
}
