//! Denial codes: one stable, machine-readable code per reason a request is
//! refused, each with its HTTP status and whether retrying can help.

use std::fmt;

/// Why a request was refused. The string form (`as_str`) is part of the API:
/// agents match on it and metrics use it as a bounded label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenyCode {
    NotFound,
    MethodNotAllowed,
    MissingKey,
    UnknownKey,
    PathNotAllowed,
    BodyTooLarge,
    InvalidJson,
    MissingModel,
    InvalidMessages,
    ModelNotAllowed,
    UnknownModel,
}

impl DenyCode {
    pub const ALL: [DenyCode; 11] = [
        DenyCode::NotFound,
        DenyCode::MethodNotAllowed,
        DenyCode::MissingKey,
        DenyCode::UnknownKey,
        DenyCode::PathNotAllowed,
        DenyCode::BodyTooLarge,
        DenyCode::InvalidJson,
        DenyCode::MissingModel,
        DenyCode::InvalidMessages,
        DenyCode::ModelNotAllowed,
        DenyCode::UnknownModel,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DenyCode::NotFound => "not_found",
            DenyCode::MethodNotAllowed => "method_not_allowed",
            DenyCode::MissingKey => "missing_key",
            DenyCode::UnknownKey => "unknown_key",
            DenyCode::PathNotAllowed => "path_not_allowed",
            DenyCode::BodyTooLarge => "body_too_large",
            DenyCode::InvalidJson => "invalid_json",
            DenyCode::MissingModel => "missing_model",
            DenyCode::InvalidMessages => "invalid_messages",
            DenyCode::ModelNotAllowed => "model_not_allowed",
            DenyCode::UnknownModel => "unknown_model",
        }
    }

    /// The HTTP status this denial is answered with.
    pub fn status(self) -> u16 {
        match self {
            DenyCode::NotFound | DenyCode::UnknownModel => 404,
            DenyCode::MethodNotAllowed => 405,
            DenyCode::MissingKey | DenyCode::UnknownKey => 401,
            DenyCode::PathNotAllowed | DenyCode::ModelNotAllowed => 403,
            DenyCode::BodyTooLarge => 413,
            DenyCode::InvalidJson | DenyCode::MissingModel | DenyCode::InvalidMessages => 400,
        }
    }

    /// The OpenAI-style error `type` this code belongs to.
    pub fn error_type(self) -> &'static str {
        match self {
            DenyCode::MissingKey | DenyCode::UnknownKey => "authentication_error",
            DenyCode::PathNotAllowed | DenyCode::ModelNotAllowed => "permission_error",
            DenyCode::NotFound | DenyCode::UnknownModel => "not_found_error",
            DenyCode::MethodNotAllowed
            | DenyCode::BodyTooLarge
            | DenyCode::InvalidJson
            | DenyCode::MissingModel
            | DenyCode::InvalidMessages => "invalid_request_error",
        }
    }

    /// None of the admission denials can succeed by sending the same request
    /// again; limits that can (rate limits, budgets) will say so.
    pub fn retryable(self) -> bool {
        false
    }
}

impl fmt::Display for DenyCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal with a human-readable reason. The message never contains a
/// secret: at most a model name, a path or a field name the agent sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deny {
    pub code: DenyCode,
    pub message: String,
}

impl Deny {
    pub fn new(code: DenyCode, message: impl Into<String>) -> Self {
        Deny {
            code,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_statuses_are_client_errors() {
        let mut seen = std::collections::HashSet::new();
        for code in DenyCode::ALL {
            assert!(seen.insert(code.as_str()), "duplicate code {code}");
            assert!((400..500).contains(&code.status()), "{code}");
        }
    }
}
