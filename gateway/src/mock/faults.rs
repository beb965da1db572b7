//! Fault injection for the mock, per request (headers) or for every request
//! (command line). Headers override the command-line defaults.
//!
//! | header | effect |
//! |---|---|
//! | `x-mock-status: 503` | answer with this status and a provider-shaped error |
//! | `x-mock-retry-after: 7` | with a status: send `Retry-After: 7` |
//! | `x-mock-latency-ms: 200` | wait before the response header |
//! | `x-mock-chunks: 20` | number of content pieces (tokens) in the answer |
//! | `x-mock-chunk-delay-ms: 50` | wait between streamed events |
//! | `x-mock-reset-after: 3` | drop the connection after this many streamed events (a whole JSON answer: halfway through its body) |
//! | `x-mock-bad-event-after: 3` | stream this many events, the last in one write with a broken one (bad JSON), then end the stream |
//! | `x-mock-body: text` | answer 200 with this raw `text/plain` body instead |
//! | `x-mock-gzip: 1` | gzip JSON answers (`Content-Encoding: gzip`), asked for or not |
//! | `x-mock-response-header: name: value` | add this header to the answer (repeatable) |
//! | `x-mock-upgrade: 1` | answer `101 Switching Protocols` |
//! | `x-mock-strict: 1` | refuse output limits the real provider refuses (see [`super::strict`]); `0` turns `--strict` off |
//! | `x-mock-max-output: 4096` | with strict: the model's output maximum, instead of the mock's table |
//! | `x-mock-prompt-tokens: 1000` | the prompt tokens reported (default: the body's length / 4) |
//! | `x-mock-completion-tokens: 50` | the output tokens reported, whatever was produced (default: a token per piece); any `u64`, to play a broken or hostile provider |
//! | `x-mock-cached-tokens: 400` | of those, read from the prompt cache (OpenAI `cached_tokens`, Anthropic `cache_read_input_tokens`) |
//! | `x-mock-cache-write-tokens: 200` | of those, written to the cache (Anthropic `cache_creation_input_tokens`) |
//! | `x-mock-tool-calls: 2` | chat completions and messages: answer with this many parallel tool calls (ids `call_mock_0` / `toolu_mock_0`, ..., names from the request's `tools` in order, else `mock_tool`, arguments `{"city":"Paris","n":0}` streamed in pieces), finish `tool_calls` / `tool_use` |
//! | `x-mock-tool-text: 1` | with tool calls: the usual text before them (else there is none) |
//! | `x-mock-obey-limit: 1` | stop the text at the request's output limit (`max_tokens`, `max_completion_tokens`, `max_output_tokens`), as providers do; finish `length` |
//! | `x-mock-usage-if-asked: 1` | OpenAI streams carry usage only when `stream_options.include_usage` is `true` (as OpenAI does; by default only an explicit `false` leaves it out) |
//! | `x-mock-piece-bytes: 64` | each text piece is this many bytes (at most 4096), counted as a quarter as many tokens |

use http::HeaderMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Faults {
    pub status: Option<u16>,
    pub retry_after: Option<u64>,
    pub latency_ms: u64,
    pub chunks: usize,
    pub chunk_delay_ms: u64,
    pub reset_after: Option<usize>,
    /// Streamed: this many events, then a broken one, in one write.
    pub bad_event_after: Option<usize>,
    pub body: Option<String>,
    pub upgrade: bool,
    /// Refuse output limits as the providers do ([`super::strict`]).
    pub strict: bool,
    /// With `strict`: the output maximum of every model, instead of the table.
    pub max_output: Option<u64>,
    /// The prompt tokens reported, instead of the body's length / 4.
    pub prompt_tokens: Option<u64>,
    /// The output tokens reported, instead of a token per piece produced.
    pub completion_tokens: Option<u64>,
    /// Of the prompt, tokens read from the cache.
    pub cached_tokens: u64,
    /// Of the prompt, tokens written to the cache (Anthropic).
    pub cache_write_tokens: u64,
    /// Parallel tool calls in a chat answer (0: a text answer).
    pub tool_calls: usize,
    /// With tool calls: the text comes first.
    pub tool_text: bool,
    /// The text stops at the request's output limit.
    pub obey_limit: bool,
    /// OpenAI streams carry usage only when asked for.
    pub usage_if_asked: bool,
    /// Bytes of each text piece, instead of the mock's words.
    pub piece_bytes: Option<usize>,
}

/// What the mock adds to every answer of one request (a hostile or broken
/// upstream): headers of its choice, a compressed body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponseFaults {
    pub gzip: bool,
    pub headers: Vec<(String, String)>,
}

impl ResponseFaults {
    pub fn from_headers(headers: &HeaderMap) -> ResponseFaults {
        ResponseFaults {
            gzip: headers
                .get("x-mock-gzip")
                .is_some_and(|v| v.as_bytes() == b"1"),
            headers: headers
                .get_all("x-mock-response-header")
                .iter()
                .filter_map(|v| v.to_str().ok()?.split_once(':'))
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .collect(),
        }
    }
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            status: None,
            retry_after: None,
            latency_ms: 0,
            chunks: 8,
            chunk_delay_ms: 0,
            reset_after: None,
            bad_event_after: None,
            body: None,
            upgrade: false,
            strict: false,
            max_output: None,
            prompt_tokens: None,
            completion_tokens: None,
            cached_tokens: 0,
            cache_write_tokens: 0,
            tool_calls: 0,
            tool_text: false,
            obey_limit: false,
            usage_if_asked: false,
            piece_bytes: None,
        }
    }
}

/// Upper bound on content pieces, so a header cannot make the mock build a
/// gigantic answer.
const MAX_CHUNKS: usize = 100_000;
/// Upper bound on the bytes of one text piece.
pub const MAX_PIECE_BYTES: usize = 4096;
/// Upper bound on tool calls in one answer.
const MAX_TOOL_CALLS: usize = 1024;

impl Faults {
    pub fn overridden_by(&self, headers: &HeaderMap) -> Faults {
        fn num<T: std::str::FromStr>(h: &HeaderMap, name: &str) -> Option<T> {
            h.get(name)?.to_str().ok()?.trim().parse().ok()
        }
        let mut f = self.clone();
        if let Some(s) = num::<u16>(headers, "x-mock-status").filter(|s| (100..600).contains(s)) {
            f.status = Some(s);
        }
        if let Some(v) = num(headers, "x-mock-retry-after") {
            f.retry_after = Some(v);
        }
        if let Some(v) = num(headers, "x-mock-latency-ms") {
            f.latency_ms = v;
        }
        if let Some(v) = num::<usize>(headers, "x-mock-chunks") {
            f.chunks = v.clamp(1, MAX_CHUNKS);
        }
        if let Some(v) = num(headers, "x-mock-chunk-delay-ms") {
            f.chunk_delay_ms = v;
        }
        if let Some(v) = num(headers, "x-mock-reset-after") {
            f.reset_after = Some(v);
        }
        if let Some(v) = num(headers, "x-mock-bad-event-after") {
            f.bad_event_after = Some(v);
        }
        if headers
            .get("x-mock-upgrade")
            .is_some_and(|v| v.as_bytes() == b"1")
        {
            f.upgrade = true;
        }
        match headers.get("x-mock-strict").map(|v| v.as_bytes()) {
            Some(b"1") => f.strict = true,
            Some(b"0") => f.strict = false,
            _ => {}
        }
        if let Some(v) = num(headers, "x-mock-max-output") {
            f.max_output = Some(v);
        }
        if let Some(v) = num(headers, "x-mock-prompt-tokens") {
            f.prompt_tokens = Some(v);
        }
        if let Some(v) = num(headers, "x-mock-completion-tokens") {
            f.completion_tokens = Some(v);
        }
        if let Some(v) = num(headers, "x-mock-cached-tokens") {
            f.cached_tokens = v;
        }
        if let Some(v) = num(headers, "x-mock-cache-write-tokens") {
            f.cache_write_tokens = v;
        }
        if let Some(v) = num::<usize>(headers, "x-mock-tool-calls") {
            f.tool_calls = v.min(MAX_TOOL_CALLS);
        }
        match headers.get("x-mock-tool-text").map(|v| v.as_bytes()) {
            Some(b"1") => f.tool_text = true,
            Some(b"0") => f.tool_text = false,
            _ => {}
        }
        let flag = |name: &str| headers.get(name).is_some_and(|v| v.as_bytes() == b"1");
        f.obey_limit |= flag("x-mock-obey-limit");
        f.usage_if_asked |= flag("x-mock-usage-if-asked");
        if let Some(v) = num::<usize>(headers, "x-mock-piece-bytes") {
            f.piece_bytes = Some(v.clamp(1, MAX_PIECE_BYTES));
        }
        if let Some(b) = headers.get("x-mock-body").and_then(|v| v.to_str().ok()) {
            f.body = Some(b.to_string());
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_override_defaults_and_junk_is_ignored() {
        let mut h = HeaderMap::new();
        h.insert("x-mock-status", "503".parse().unwrap());
        h.insert("x-mock-chunks", "0".parse().unwrap());
        h.insert("x-mock-latency-ms", "abc".parse().unwrap());
        let f = Faults::default().overridden_by(&h);
        assert_eq!(f.status, Some(503));
        assert_eq!(f.chunks, 1);
        assert_eq!(f.latency_ms, 0);
        assert_eq!(f.tool_calls, 0);
        h.insert("x-mock-tool-calls", "5000".parse().unwrap());
        h.insert("x-mock-tool-text", "1".parse().unwrap());
        let f = Faults::default().overridden_by(&h);
        assert_eq!(f.tool_calls, MAX_TOOL_CALLS);
        assert!(f.tool_text);
    }
}
