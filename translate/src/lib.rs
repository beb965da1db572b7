//! OpenAI chat completions <-> Anthropic Messages, both ways: requests,
//! non-streamed responses, error bodies and streams (event by event, with
//! bounded state). Pure: bytes or JSON in, bytes or JSON out, a clock
//! value passed in where a timestamp is needed; no I/O, no Pingora.
//!
//! Fail closed. Every field of a request is on an allow-list for its
//! direction and is either translated or refused with an
//! [`Untranslatable`] naming the field (the gateway answers 400
//! `untranslatable_request` and sends nothing). Nothing is dropped
//! silently: the few fields dropped on purpose (Anthropic's
//! `cache_control` hints, OpenAI's `n: 1`, `logprobs: false`, ...) are
//! listed in the README's "Provider families" section. Refusals name the
//! field by its path (`messages[2].content[0].type`), never a value: the
//! request's text never reaches an error or a log through this crate.
//!
//! Agent-controlled JSON is read with `get`/`as_*` only (no indexing, no
//! `unwrap`), and parsed strictly: a key given twice anywhere is refused
//! ([`strict`]), since two readers could take either value. A stream's
//! events are read into typed borrowing structs (`events`), where a key
//! given twice is refused among the fields read; the others are skipped
//! unread and reach no one.
//!
//! - [`request`]: request bodies, [`request::openai_to_anthropic`] and
//!   [`request::anthropic_to_openai`].
//! - [`response`]: non-streamed answers, the `stop_reason` /
//!   `finish_reason` table, usage with cached tokens.
//! - [`error`]: an upstream error body rendered in the agent's family.
//! - [`stream`]: the SSE translators ([`stream::StreamTranslator`]).

pub mod error;
mod events;
pub mod request;
pub mod response;
mod sse;
pub mod stream;
pub mod strict;

use std::fmt;

pub(crate) type R<T> = Result<T, Untranslatable>;

/// An API family: the wire format an agent speaks, or a provider answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// OpenAI chat completions (`/v1/chat/completions`), and every
    /// OpenAI-compatible server.
    OpenAi,
    /// Anthropic Messages (`/v1/messages`).
    Anthropic,
}

impl Family {
    /// The family's chat endpoint path.
    pub fn chat_path(self) -> &'static str {
        match self {
            Family::OpenAi => "/v1/chat/completions",
            Family::Anthropic => "/v1/messages",
        }
    }

    /// Lower-case name, for logs (`openai`, `anthropic`).
    pub fn name(self) -> &'static str {
        match self {
            Family::OpenAi => "openai",
            Family::Anthropic => "anthropic",
        }
    }
}

/// Why a field could not be translated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The target family has no equivalent (e.g. `n > 1`, `logprobs`).
    NoEquivalent,
    /// A value the target family reads differently or not at all (e.g. a
    /// temperature above Anthropic's 1.0, an image media type it lacks).
    OutOfRange,
    /// Not the type or shape the family defines.
    Malformed,
    /// Required and absent.
    Missing,
    /// A field this translator does not know: refused, never passed on.
    Unknown,
    /// A key given twice in one object.
    Duplicate,
    /// Position the target cannot express (e.g. a system message after
    /// the conversation began, text after a tool call).
    Order,
}

impl Reason {
    fn text(self) -> &'static str {
        match self {
            Reason::NoEquivalent => "has no equivalent in the target API",
            Reason::OutOfRange => "has a value the target API cannot express",
            Reason::Malformed => "is malformed",
            Reason::Missing => "is required",
            Reason::Unknown => "is not a known field",
            Reason::Duplicate => "has a key given twice",
            Reason::Order => "is in a position the target API cannot express",
        }
    }
}

/// A request (or an upstream answer) that cannot be translated faithfully:
/// the field's path and why. Display names the field, never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untranslatable {
    /// Path of the field: `temperature`, `messages[3].content[0].type`.
    pub field: String,
    pub reason: Reason,
}

impl Untranslatable {
    pub(crate) fn new(field: impl Into<String>, reason: Reason) -> Self {
        Untranslatable {
            field: field.into(),
            reason,
        }
    }
}

impl fmt::Display for Untranslatable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` {}", self.field, self.reason.text())
    }
}

impl std::error::Error for Untranslatable {}

/// A key as it may appear in an error: a key shaped like an API field
/// (lower-case snake case, at most 64 bytes) is named, any other (it could
/// carry text from the request) is not.
pub(crate) fn key_name(k: &str) -> &str {
    if !k.is_empty()
        && k.len() <= 64
        && k.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-' || b == b'.'
        })
    {
        k
    } else {
        "<unnamed field>"
    }
}

/// Join a parent path and a key.
pub(crate) fn at(parent: &str, key: &str) -> String {
    let key = key_name(key);
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// The `stop_reason` / `finish_reason` table. Anthropic -> OpenAI.
pub fn finish_reason(stop_reason: &str) -> Option<&'static str> {
    Some(match stop_reason {
        "end_turn" | "stop_sequence" | "pause_turn" => "stop",
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        _ => return None,
    })
}

/// The `stop_reason` / `finish_reason` table. OpenAI -> Anthropic.
/// OpenAI's `stop` covers both a natural end and a stop sequence; it is
/// read as `end_turn` (OpenAI does not say which sequence matched).
pub fn stop_reason(finish_reason: &str) -> Option<&'static str> {
    Some(match finish_reason {
        "stop" => "end_turn",
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_with_text_are_not_named() {
        assert_eq!(key_name("top_k"), "top_k");
        assert_eq!(key_name("my secret prompt"), "<unnamed field>");
        assert_eq!(key_name(&"a".repeat(65)), "<unnamed field>");
        assert_eq!(at("messages[0]", "x y"), "messages[0].<unnamed field>");
    }

    #[test]
    fn stop_reason_table_round_trips_where_it_can() {
        for f in ["stop", "length", "tool_calls", "content_filter"] {
            assert_eq!(stop_reason(f).and_then(finish_reason), Some(f));
        }
        for s in ["end_turn", "max_tokens", "tool_use", "refusal"] {
            assert_eq!(finish_reason(s).and_then(stop_reason), Some(s));
        }
        assert_eq!(finish_reason("stop_sequence"), Some("stop"));
        assert_eq!(finish_reason("surprise"), None);
    }
}
