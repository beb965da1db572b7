//! The provider endpoints Loopgate serves on its proxy port. Anything else is
//! answered with 404 and never forwarded.

/// A known endpoint, identified from the request path (query excluded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Embeddings,
    Responses,
    /// Anthropic Messages API.
    Messages,
    /// Anthropic's `POST /v1/messages/count_tokens`: a Messages body
    /// (without an output limit), answered `{"input_tokens": N}`. Judged
    /// as a Messages call, charged to no budget, and allowed wherever
    /// `/v1/messages` is ([`Endpoint::allowed_as`]).
    CountTokens,
    /// `GET /v1/models`, answered by the gateway with the agent's models.
    Models,
}

impl Endpoint {
    pub const ALL: [Endpoint; 7] = [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Embeddings,
        Endpoint::Responses,
        Endpoint::Messages,
        Endpoint::CountTokens,
        Endpoint::Models,
    ];

    /// Exact match on the path; no prefix or case folding, so that
    /// `/v1/chat/completions/../admin` or `/V1/...` is simply unknown.
    pub fn from_path(path: &str) -> Option<Endpoint> {
        Some(match path {
            "/v1/chat/completions" => Endpoint::ChatCompletions,
            "/v1/completions" => Endpoint::Completions,
            "/v1/embeddings" => Endpoint::Embeddings,
            "/v1/responses" => Endpoint::Responses,
            "/v1/messages" => Endpoint::Messages,
            "/v1/messages/count_tokens" => Endpoint::CountTokens,
            "/v1/models" => Endpoint::Models,
            _ => return None,
        })
    }

    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Messages => "/v1/messages",
            Endpoint::CountTokens => "/v1/messages/count_tokens",
            Endpoint::Models => "/v1/models",
        }
    }

    /// The one HTTP method the endpoint accepts.
    pub fn method(self) -> &'static str {
        match self {
            Endpoint::Models => "GET",
            _ => "POST",
        }
    }

    /// Whether the body must carry a `messages` array.
    pub fn needs_messages(self) -> bool {
        matches!(
            self,
            Endpoint::ChatCompletions | Endpoint::Messages | Endpoint::CountTokens
        )
    }

    /// The endpoint an agent's `paths:` allowlist must name for this one:
    /// counting a Messages call's tokens is allowed wherever the call
    /// itself is (SDKs and frameworks count before they send), so
    /// `count_tokens` is never named on its own.
    pub fn allowed_as(self) -> Endpoint {
        match self {
            Endpoint::CountTokens => Endpoint::Messages,
            e => e,
        }
    }

    /// Whether the request carries a JSON body with a `model`.
    pub fn has_body(self) -> bool {
        !matches!(self, Endpoint::Models)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_round_trip_and_near_misses_are_unknown() {
        for e in Endpoint::ALL {
            assert_eq!(Endpoint::from_path(e.path()), Some(e));
        }
        for p in [
            "/v1/chat/completions/",
            "/v1/chat",
            "/V1/models",
            "/v1/models/gpt-4o",
            "//v1/messages",
            "/v1/messages/count_tokens/",
            "/v1/messages/count_tokens/../../models",
            "",
        ] {
            assert_eq!(Endpoint::from_path(p), None, "{p}");
        }
    }
}
