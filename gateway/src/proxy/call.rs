//! The call a request makes, decided once in `request_filter` from its
//! method and path: a model call (one of the API endpoints), an HTTP tool
//! call (`/tools/{tool}/{path}`) or an MCP message (`/mcp/{server}`).
//! Everything after matches on this value: which rules judge it, which
//! wire format its refusals are written in, which exchange features arm.
//! Nothing later reads the URL again to find out what the request is.

use crate::error::GatewayError;
use loopgate_policy::{clip, Deny, DenyCode, Endpoint};
use pingora::http::RequestHeader;

/// The methods an MCP endpoint takes (streamable HTTP transport).
pub const MCP_METHODS: &str = "POST, GET, DELETE";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// A model API call (or `GET /v1/models`), method already checked.
    Model(Endpoint),
    /// An HTTP tool call: the tool's name as sent, and the raw path under
    /// it (leading `/`, still percent-encoded; judged by the tool rules).
    Tool { tool: Box<str>, path: Box<str> },
    /// An MCP message for `server` (as sent; an unknown or malformed name
    /// is refused by the MCP rules, in JSON-RPC).
    Mcp { server: Box<str> },
}

/// How the gateway's own answers are written for a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// `{"error": {...}}` (OpenAI's shape), for model calls and unknown paths.
    Json,
    /// `{"type": "error", "error": {...}}` (Anthropic's shape) with the
    /// same fields, for Anthropic Messages calls: an agent on the
    /// Anthropic SDK gets its own family's errors.
    Anthropic,
    /// The same, saying whether the tool itself failed (`upstream_failed`).
    ToolJson,
    /// A JSON-RPC error response (MCP).
    JsonRpc,
}

impl Call {
    /// Classifies a request. `Err` for a path that is no call the gateway
    /// serves (404), or a model endpoint asked with another method (405).
    pub fn classify(req: &RequestHeader) -> Result<Call, GatewayError> {
        let path = req.uri.path();
        if let Some(rest) = path.strip_prefix("/mcp/") {
            let server = rest.strip_suffix('/').unwrap_or(rest);
            return Ok(Call::Mcp {
                server: server.into(),
            });
        }
        if let Some(after) = path.strip_prefix("/tools/") {
            let (tool, rest) = match after.find('/') {
                Some(i) => (&after[..i], &after[i..]),
                None => (after, "/"),
            };
            return Ok(Call::Tool {
                tool: tool.into(),
                path: rest.into(),
            });
        }
        let endpoint = Endpoint::from_path(path).ok_or_else(|| {
            Deny::new(
                DenyCode::NotFound,
                format!("no such endpoint: {} {}", req.method, clip(path, 200)),
            )
        })?;
        if req.method.as_str() != endpoint.method() {
            return Err(GatewayError::MethodNotAllowed {
                allow: endpoint.method().to_string(),
                message: format!("{} only accepts {}", endpoint.path(), endpoint.method()),
            });
        }
        Ok(Call::Model(endpoint))
    }

    /// The wire format of the gateway's answers to this call.
    pub fn wire(call: Option<&Call>) -> Wire {
        match call {
            Some(Call::Tool { .. }) => Wire::ToolJson,
            Some(Call::Mcp { .. }) => Wire::JsonRpc,
            Some(Call::Model(Endpoint::Messages | Endpoint::CountTokens)) => Wire::Anthropic,
            Some(Call::Model(_)) | None => Wire::Json,
        }
    }

    /// The tool's name, for the access log.
    pub fn tool_name(&self) -> Option<&str> {
        match self {
            Call::Tool { tool, .. } if !tool.is_empty() => Some(tool),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(method: &str, path: &str) -> Result<Call, GatewayError> {
        Call::classify(&RequestHeader::build(method, path.as_bytes(), None).unwrap())
    }

    #[test]
    fn each_kind_is_told_by_its_path_once() {
        assert_eq!(
            classify("POST", "/v1/chat/completions"),
            Ok(Call::Model(Endpoint::ChatCompletions))
        );
        assert_eq!(
            classify("GET", "/tools/weather/v1/city?q=1"),
            Ok(Call::Tool {
                tool: "weather".into(),
                path: "/v1/city".into()
            })
        );
        assert_eq!(
            classify("GET", "/tools/weather"),
            Ok(Call::Tool {
                tool: "weather".into(),
                path: "/".into()
            })
        );
        assert_eq!(
            classify("POST", "/mcp/files/"),
            Ok(Call::Mcp {
                server: "files".into()
            })
        );
        // Refused by the MCP rules (no such server), in JSON-RPC.
        assert_eq!(
            classify("POST", "/mcp/a/b"),
            Ok(Call::Mcp {
                server: "a/b".into()
            })
        );
        let e = classify("GET", "/v1/chat/completions").unwrap_err();
        assert_eq!(e.status(), 405);
        assert!(matches!(e, GatewayError::MethodNotAllowed { ref allow, .. } if allow == "POST"));
        assert_eq!(classify("POST", "/v1/chat").unwrap_err().status(), 404);
        assert_eq!(classify("POST", "/tools").unwrap_err().status(), 404);
        assert_eq!(Call::wire(None), Wire::Json);
        // Anthropic's token count: a model call, answered in its family.
        let count = classify("POST", "/v1/messages/count_tokens").unwrap();
        assert_eq!(count, Call::Model(Endpoint::CountTokens));
        assert_eq!(Call::wire(Some(&count)), Wire::Anthropic);
        assert_eq!(
            classify("GET", "/v1/messages/count_tokens")
                .unwrap_err()
                .status(),
            405
        );
    }
}
