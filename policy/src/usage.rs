//! Token usage as providers report it, read from response bodies while they
//! stream past, for settling token limits (and later budgets).
//!
//! SSE bodies are split into lines across chunk boundaries; only the
//! unfinished tail of a chunk is carried, and only `data:` lines that
//! mention usage are read. The stream itself is neither buffered nor
//! altered. JSON bodies are kept up to a cap and read at the end. Reading
//! takes only the usage objects out of a document ([`reader`]).
//!
//! Beside the usage, the scanner counts the generated text it saw (the
//! string values that carry output, see [`reader`]), so that an answer
//! whose usage never comes or cannot be read still settles on what the
//! gateway relayed ([`UsageScanner::relayed_text_bytes`]): an SSE stream's
//! deltas as they pass; a JSON answer's text once it ended without usage;
//! a JSON answer past the reader's cap, all its bytes.
//!
//! Recognised: OpenAI `usage.{prompt,completion}_tokens` (chat, completions,
//! embeddings, final stream chunk) with `prompt_tokens_details.cached_tokens`,
//! Anthropic `message.usage` in `message_start` and the cumulative `usage`
//! of `message_delta` (with `cache_read_input_tokens` and
//! `cache_creation_input_tokens`), and the Responses API's
//! `response.usage.{input,output}_tokens` with
//! `input_tokens_details.cached_tokens`.
//!
//! Counts are the provider's word, not to be trusted blindly: each is
//! clamped to [`MAX_REPORTED_TOKENS`] ([`UsageScanner::clamped`] says when
//! one was), and every sum over them saturates, so a broken or hostile
//! upstream reporting 2^64-1 tokens can neither wrap a settlement nor push
//! a store past the numbers it keeps exactly.

mod reader;

use reader::{output_text_bytes, read_counts, Counts};

/// Tokens a provider reported for one exchange, as it reported them: the
/// two families count cached prompt tokens differently, so both ways are
/// kept apart and [`Usage::cost`] prices each as its provider bills it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// `prompt_tokens` (OpenAI, cached ones included) or `input_tokens`
    /// (Anthropic: the uncached part only).
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// OpenAI: the part of `input_tokens` read from the prompt cache.
    pub cached_input_tokens: u64,
    /// Anthropic: prompt tokens read from the cache, beside `input_tokens`.
    pub cache_read_tokens: u64,
    /// Anthropic: prompt tokens written to the cache, beside `input_tokens`.
    pub cache_write_tokens: u64,
}

/// The most tokens one count of a report is taken at (100 million): far
/// past any model's context window or output (the largest windows are ~10
/// million tokens) and any embeddings batch, so only a broken or hostile
/// report reaches it. Four counts at this ceiling at $1,000 per million
/// tokens are 4 x 10^11 micro-dollars, well inside what a store keeps
/// exactly ([`crate::store::MAX_COST`]).
pub const MAX_REPORTED_TOKENS: u64 = 100_000_000;

impl Usage {
    /// Every prompt token the provider counted: OpenAI's `prompt_tokens`
    /// include the cached ones, Anthropic reports cache reads and writes
    /// beside `input_tokens` (which is only the uncached part). What token
    /// budgets, `loopgate_tokens_total` and the access log count, as the
    /// money path prices them ([`crate::Price::cost`]).
    pub fn prompt_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.cache_read_tokens)
            .saturating_add(self.cache_write_tokens)
    }

    /// Prompt and output tokens: what a token budget is settled at.
    pub fn total(&self) -> u64 {
        self.prompt_tokens().saturating_add(self.output_tokens)
    }

    /// Each count at most [`MAX_REPORTED_TOKENS`]; `true` when one was past
    /// it.
    pub fn clamped(self) -> (Usage, bool) {
        let c = |n: u64| n.min(MAX_REPORTED_TOKENS);
        let u = Usage {
            input_tokens: c(self.input_tokens),
            output_tokens: c(self.output_tokens),
            cached_input_tokens: c(self.cached_input_tokens),
            cache_read_tokens: c(self.cache_read_tokens),
            cache_write_tokens: c(self.cache_write_tokens),
        };
        (u, u != self)
    }
}

/// Tokens in `bytes` of text, counted as the prompt estimate counts them
/// (4 bytes a token, rounded up).
pub fn estimate_tokens(bytes: u64) -> u64 {
    bytes.div_ceil(4)
}

/// Longest SSE line or JSON body kept; past it the usage is not learned
/// (the estimate stands), memory stays bounded.
const MAX_KEPT: usize = 4 * 1024 * 1024;

#[derive(Debug)]
enum Mode {
    Sse,
    Json,
    /// A JSON body past [`MAX_KEPT`]: only its bytes are counted.
    JsonPast,
    Off,
}

#[derive(Debug)]
pub struct UsageScanner {
    mode: Mode,
    kept: Vec<u8>,
    overflow: bool,
    input: Option<u64>,
    output: Option<u64>,
    cached: Option<u64>,
    cache_read: Option<u64>,
    cache_write: Option<u64>,
    events: u64,
    /// Bytes of generated text seen (see the module docs).
    text_bytes: u64,
    /// JSON: bytes of the body so far.
    body_bytes: u64,
    /// SSE: the event under way is one whose text was counted already
    /// (the Responses API's `.done` and `response.completed` events repeat
    /// the deltas whole).
    repeats: bool,
    /// Whether generated text is counted at all (see [`UsageScanner::count_text`]).
    count_text: bool,
    /// A reported count was past [`MAX_REPORTED_TOKENS`].
    clamped: bool,
}

impl UsageScanner {
    /// A scanner for a response with this `Content-Type`.
    pub fn for_content_type(content_type: Option<&str>) -> UsageScanner {
        let ct = content_type.unwrap_or("").as_bytes();
        let is = |prefix: &str| {
            ct.get(..prefix.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(prefix.as_bytes()))
        };
        let mode = if is("text/event-stream") {
            Mode::Sse
        } else if is("application/json") {
            Mode::Json
        } else {
            Mode::Off
        };
        UsageScanner {
            mode,
            kept: Vec::new(),
            overflow: false,
            input: None,
            output: None,
            cached: None,
            cache_read: None,
            cache_write: None,
            events: 0,
            text_bytes: 0,
            body_bytes: 0,
            repeats: false,
            count_text: true,
            clamped: false,
        }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        match self.mode {
            Mode::Off => {}
            Mode::JsonPast => {
                self.body_bytes = self.body_bytes.saturating_add(chunk.len() as u64);
            }
            Mode::Json => {
                self.body_bytes = self.body_bytes.saturating_add(chunk.len() as u64);
                if self.kept.len() + chunk.len() > MAX_KEPT {
                    self.overflow = true;
                    self.kept = Vec::new();
                    self.mode = Mode::JsonPast;
                } else {
                    self.kept.extend_from_slice(chunk);
                }
            }
            Mode::Sse => {
                let mut rest = chunk;
                while let Some(nl) = memchr::memchr(b'\n', rest) {
                    let (line, tail) = rest.split_at(nl);
                    rest = &tail[1..];
                    if self.kept.is_empty() {
                        self.sse_line(line);
                    } else if !self.overflow {
                        // The line began in an earlier chunk; `kept` keeps
                        // its allocation for the next split line.
                        let mut whole = std::mem::take(&mut self.kept);
                        whole.extend_from_slice(line);
                        self.sse_line(&whole);
                        whole.clear();
                        self.kept = whole;
                    } else {
                        self.kept.clear();
                        self.overflow = false;
                    }
                }
                if !rest.is_empty() {
                    if self.kept.len() + rest.len() > MAX_KEPT {
                        self.overflow = true;
                        self.kept.clear();
                    } else if !self.overflow {
                        self.kept.extend_from_slice(rest);
                    }
                }
            }
        }
    }

    /// Whether to count the generated text relayed (on by default). A
    /// call whose usage settles nothing turns it off: the count reads
    /// every event's JSON, about half the scanner's work on a stream.
    pub fn count_text(&mut self, on: bool) {
        self.count_text = on;
    }

    /// SSE `data:` events seen so far: a running estimate of output tokens
    /// while a stream is under way (providers send about one token each).
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Bytes of generated text the answer carried, as far as it was seen
    /// (a JSON answer's: once [`UsageScanner::finish`] found no usage in
    /// it; past the reader's cap, every byte of it).
    pub fn relayed_text_bytes(&self) -> u64 {
        match self.mode {
            Mode::JsonPast => self.body_bytes,
            _ => self.text_bytes,
        }
    }

    /// Whether [`UsageScanner::finish`] clamped a count the provider
    /// reported (to [`MAX_REPORTED_TOKENS`]): worth a log line.
    pub fn clamped(&self) -> bool {
        self.clamped
    }

    /// The usage seen, once the body ended, each count clamped to
    /// [`MAX_REPORTED_TOKENS`].
    pub fn finish(&mut self) -> Option<Usage> {
        if let Mode::Json = self.mode {
            if let Some(c) = read_counts(&self.kept) {
                self.absorb(&c);
            }
            if self.count_text && self.input.is_none() && self.output.is_none() {
                // No usage to settle on: what the answer said is counted
                // instead (only then: an answer with usage is not walked
                // twice).
                self.text_bytes = output_text_bytes(&self.kept);
            }
            self.kept = Vec::new();
        }
        if self.input.is_none() && self.output.is_none() {
            return None;
        }
        let input = self.input.unwrap_or(0);
        let (usage, clamped) = Usage {
            input_tokens: input,
            output_tokens: self.output.unwrap_or(0),
            // Part of the input: never more than it.
            cached_input_tokens: self.cached.unwrap_or(0).min(input),
            cache_read_tokens: self.cache_read.unwrap_or(0),
            cache_write_tokens: self.cache_write.unwrap_or(0),
        }
        .clamped();
        self.clamped = clamped;
        Some(usage)
    }

    fn sse_line(&mut self, line: &[u8]) {
        // Built once: building a searcher per line cost more than the search.
        static USAGE_KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"usage"));
        let Some(data) = line.strip_prefix(b"data:") else {
            if let Some(name) = line.strip_prefix(b"event:") {
                let name = name.trim_ascii();
                self.repeats = name.starts_with(b"response.") && !name.ends_with(b".delta");
            } else if line.trim_ascii().is_empty() {
                self.repeats = false;
            }
            return;
        };
        self.events += 1;
        if self.count_text && !self.repeats {
            self.text_bytes = self.text_bytes.saturating_add(output_text_bytes(data));
        }
        if USAGE_KEY.find(data).is_none() {
            return;
        }
        if let Some(c) = read_counts(data) {
            self.absorb(&c);
        }
    }

    fn absorb(&mut self, c: &Counts) {
        // In this order, so that a nested carrier's counts win over an
        // empty top-level `usage` beside it.
        for u in [&c.usage, &c.message, &c.response].into_iter().flatten() {
            if let Some(i) = u.prompt_tokens.or(u.input_tokens) {
                self.input = Some(i);
            }
            if let Some(o) = u.completion_tokens.or(u.output_tokens) {
                self.output = Some(o);
            }
            if let Some(c) = u.prompt_cached.or(u.input_cached) {
                self.cached = Some(c);
            }
            if let Some(r) = u.cache_read_input_tokens {
                self.cache_read = Some(r);
            }
            if let Some(w) = u.cache_creation_input_tokens {
                self.cache_write = Some(w);
            }
        }
    }
}

/// Drops the usage-only chunk of an OpenAI-family stream (`choices: []`
/// beside a `usage` object) from what the agent receives: the gateway
/// asked the provider for it ([`crate::rewrite::with_stream_usage`]), the
/// agent did not, and its stream stays as it would have been. Events pass
/// whole as they complete; a chunk that ends inside an event keeps that
/// event's start until the rest arrives (at most [`MAX_KEPT`]: past it,
/// what is held goes as it is).
#[derive(Debug, Default)]
pub struct UsageChunkDropper {
    pending: Vec<u8>,
}

impl UsageChunkDropper {
    /// What goes to the agent for `chunk` (`end`: the stream's last);
    /// `None` when the chunk goes as it is.
    pub fn filter(&mut self, chunk: &[u8], end: bool) -> Option<Vec<u8>> {
        if self.pending.is_empty()
            && (chunk.is_empty() || (ends_event(chunk) && empty_choices(chunk).is_none()))
        {
            // The common case: whole events, none of them the usage chunk.
            return None;
        }
        self.pending.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(self.pending.len());
        let mut from = 0;
        while let Some(len) = event_len(&self.pending[from..]) {
            let event = &self.pending[from..from + len];
            if !is_usage_only(event) {
                out.extend_from_slice(event);
            }
            from += len;
        }
        let rest = &self.pending[from..];
        if end || rest.len() > MAX_KEPT {
            if !is_usage_only(rest) {
                out.extend_from_slice(rest);
            }
            from = self.pending.len();
        }
        self.pending.drain(..from);
        Some(out)
    }
}

/// The chunk ends where an event does (a blank line).
fn ends_event(chunk: &[u8]) -> bool {
    chunk.ends_with(b"\n\n") || chunk.ends_with(b"\r\n\r\n")
}

/// The length of the first whole event of `s` (through its blank line).
fn event_len(s: &[u8]) -> Option<usize> {
    let lf = memchr::memmem::find(s, b"\n\n").map(|at| at + 2);
    let crlf = memchr::memmem::find(s, b"\n\r\n").map(|at| at + 3);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Where `"choices"` is followed by an empty array, if anywhere.
fn empty_choices(s: &[u8]) -> Option<usize> {
    // Built once: building a searcher per event cost more than the search.
    static CHOICES: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"choices\""));
    let mut from = 0;
    while let Some(at) = CHOICES.find(&s[from..]) {
        let after = from + at + b"\"choices\"".len();
        let mut rest = s[after..].iter().filter(|c| !c.is_ascii_whitespace());
        if rest.next() == Some(&b':') && rest.next() == Some(&b'[') && rest.next() == Some(&b']') {
            return Some(from + at);
        }
        from = after;
    }
    None
}

/// One SSE event whose data is an OpenAI usage-only chunk.
fn is_usage_only(event: &[u8]) -> bool {
    if empty_choices(event).is_none() {
        return false;
    }
    event
        .split(|c| *c == b'\n')
        .filter_map(|l| l.strip_prefix(b"data:"))
        .any(|data| {
            let v: Option<serde_json::Value> = serde_json::from_slice(data.trim_ascii()).ok();
            v.is_some_and(|v| {
                v.get("choices")
                    .and_then(serde_json::Value::as_array)
                    .is_some_and(Vec::is_empty)
                    && v.get("usage").is_some_and(serde_json::Value::is_object)
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usage_only_chunk_is_dropped_at_any_chunking_and_the_rest_kept() {
        let usage = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3}}\n\n";
        let before = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
            data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
        let stream = format!("{before}{usage}data: [DONE]\n\n");
        let want = format!("{before}data: [DONE]\n\n");
        for piece in [1, 2, 5, 17, 64, 10_000] {
            let mut d = UsageChunkDropper::default();
            let mut out = Vec::new();
            let chunks: Vec<&[u8]> = stream.as_bytes().chunks(piece).collect();
            for (i, c) in chunks.iter().enumerate() {
                match d.filter(c, i + 1 == chunks.len()) {
                    Some(o) => out.extend_from_slice(&o),
                    None => out.extend_from_slice(c),
                }
            }
            assert_eq!(String::from_utf8(out).unwrap(), want, "piece {piece}");
        }
        // Whole events without it pass untouched (no copy).
        let mut d = UsageChunkDropper::default();
        assert_eq!(d.filter(before.as_bytes(), false), None);
        // An empty `choices` without usage, or usage beside choices, stays.
        for keep in [
            "data: {\"choices\":[]}\n\n",
            "data: {\"choices\":[{\"delta\":{}}],\"usage\":{\"prompt_tokens\":1}}\n\n",
            "data: {\"choices\": [ ], \"usage\": null}\n\n",
        ] {
            let mut d = UsageChunkDropper::default();
            let out = d
                .filter(keep.as_bytes(), true)
                .unwrap_or_else(|| keep.into());
            assert_eq!(out, keep.as_bytes(), "{keep}");
        }
        // Spaced JSON and CRLF events are read too.
        let spaced = "data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 1}}\r\n\r\ndata: [DONE]\r\n\r\n";
        let mut d = UsageChunkDropper::default();
        assert_eq!(
            d.filter(spaced.as_bytes(), true).unwrap(),
            b"data: [DONE]\r\n\r\n"
        );
    }

    #[test]
    fn the_text_relayed_is_counted_from_the_output_fields_only() {
        let sse = |body: &str| {
            let mut s = UsageScanner::for_content_type(Some("text/event-stream"));
            for c in body.as_bytes().chunks(3) {
                s.feed(c);
            }
            s.relayed_text_bytes()
        };
        // OpenAI chat: content and tool-call arguments; ids, roles and
        // names are not output.
        assert_eq!(
            sse("data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"Hello\"}}]}\n\n\
                 data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]}}]}\n\n"),
            5 + 9
        );
        // Anthropic: text and partial_json deltas.
        assert_eq!(sse(ANTHROPIC_SSE), 5);
        // Responses: the deltas, not the events that repeat them whole.
        assert_eq!(
            sse("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"abcd\"}\n\n\
                 event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"text\":\"abcd\"}\n\n\
                 event: response.completed\ndata: {\"response\":{\"output\":[{\"content\":[{\"text\":\"abcd\"}]}]}}\n\n"),
            4
        );
        let json = |body: &[u8]| {
            let mut s = UsageScanner::for_content_type(Some("application/json"));
            for c in body.chunks(1000) {
                s.feed(c);
            }
            let usage = s.finish();
            (usage.is_some(), s.relayed_text_bytes())
        };
        // A JSON answer without usage: its text; with usage: not walked.
        assert_eq!(
            json(br#"{"choices":[{"message":{"role":"assistant","content":"abcdefgh"}}]}"#),
            (false, 8)
        );
        assert_eq!(
            json(
                br#"{"choices":[{"message":{"content":"abcdefgh"}}],"usage":{"prompt_tokens":1}}"#
            ),
            (true, 0)
        );
        // Past the reader's cap: every byte of it.
        let big = format!(
            r#"{{"choices":[{{"message":{{"content":"{}"}}}}]}}"#,
            "x".repeat(MAX_KEPT)
        );
        assert_eq!(json(big.as_bytes()), (false, big.len() as u64));
        assert_eq!(
            estimate_tokens(big.len() as u64),
            (big.len() as u64).div_ceil(4)
        );
    }

    fn scan_in_pieces(ct: &str, body: &[u8], piece: usize) -> Option<Usage> {
        let mut s = UsageScanner::for_content_type(Some(ct));
        for c in body.chunks(piece.max(1)) {
            s.feed(c);
        }
        s.finish()
    }

    const OPENAI_SSE: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
        data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":7,\"total_tokens\":19}}\n\n\
        data: [DONE]\n\n";

    const ANTHROPIC_SSE: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n\
        event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"usage\"}}\n\n\
        event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n\
        event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

    #[test]
    fn openai_stream_usage_at_any_chunking() {
        for piece in [1, 2, 3, 7, 64, 10_000] {
            assert_eq!(
                scan_in_pieces("text/event-stream", OPENAI_SSE.as_bytes(), piece),
                Some(Usage {
                    input_tokens: 12,
                    output_tokens: 7,
                    ..Usage::default()
                }),
                "piece {piece}"
            );
        }
    }

    #[test]
    fn anthropic_stream_usage_is_cumulative() {
        for piece in [1, 5, 100] {
            assert_eq!(
                scan_in_pieces(
                    "text/event-stream; charset=utf-8",
                    ANTHROPIC_SSE.as_bytes(),
                    piece
                ),
                Some(Usage {
                    input_tokens: 25,
                    output_tokens: 15,
                    ..Usage::default()
                })
            );
        }
    }

    #[test]
    fn json_bodies_and_the_responses_api() {
        let body = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
        assert_eq!(
            scan_in_pieces("application/json", body, 5),
            Some(Usage {
                input_tokens: 3,
                output_tokens: 4,
                ..Usage::default()
            })
        );
        let body = br#"{"type":"response.completed","response":{"usage":{"input_tokens":9,"output_tokens":2}}}"#;
        let sse = format!(
            "event: response.completed\ndata: {}\n\n",
            std::str::from_utf8(body).unwrap()
        );
        assert_eq!(
            scan_in_pieces("text/event-stream", sse.as_bytes(), 4),
            Some(Usage {
                input_tokens: 9,
                output_tokens: 2,
                ..Usage::default()
            })
        );
    }

    #[test]
    fn cached_tokens_in_both_families() {
        let sse = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":30}}}\n\ndata: [DONE]\n\n";
        let u = scan_in_pieces("text/event-stream", sse.as_bytes(), 7).unwrap();
        assert_eq!((u.input_tokens, u.cached_input_tokens), (50, 30));
        let sse = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4,\"cache_read_input_tokens\":90,\"cache_creation_input_tokens\":6,\"output_tokens\":1}}}\n\n\
            event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n";
        let u = scan_in_pieces("text/event-stream", sse.as_bytes(), 5).unwrap();
        assert_eq!(
            u,
            Usage {
                input_tokens: 4,
                output_tokens: 15,
                cached_input_tokens: 0,
                cache_read_tokens: 90,
                cache_write_tokens: 6,
            }
        );
    }

    #[test]
    fn prompt_tokens_count_anthropics_cache_reads_and_writes() {
        // Anthropic: 4 uncached + 90 read + 6 written = 100 prompt tokens.
        let an = Usage {
            input_tokens: 4,
            output_tokens: 15,
            cache_read_tokens: 90,
            cache_write_tokens: 6,
            ..Usage::default()
        };
        assert_eq!((an.prompt_tokens(), an.total()), (100, 115));
        // OpenAI: `prompt_tokens` already hold the 30 cached.
        let oa = Usage {
            input_tokens: 50,
            output_tokens: 5,
            cached_input_tokens: 30,
            ..Usage::default()
        };
        assert_eq!((oa.prompt_tokens(), oa.total()), (50, 55));
        // Sums saturate.
        let huge = Usage {
            input_tokens: u64::MAX,
            output_tokens: u64::MAX,
            cache_read_tokens: 1,
            ..Usage::default()
        };
        assert_eq!((huge.prompt_tokens(), huge.total()), (u64::MAX, u64::MAX));
    }

    #[test]
    fn absurd_counts_are_clamped_and_flagged() {
        let body = format!(
            r#"{{"usage":{{"prompt_tokens":12,"completion_tokens":{},"prompt_tokens_details":{{"cached_tokens":3}}}}}}"#,
            u64::MAX
        );
        let mut s = UsageScanner::for_content_type(Some("application/json"));
        s.feed(body.as_bytes());
        let u = s.finish().unwrap();
        assert!(s.clamped());
        assert_eq!(
            u,
            Usage {
                input_tokens: 12,
                output_tokens: MAX_REPORTED_TOKENS,
                cached_input_tokens: 3,
                ..Usage::default()
            }
        );
        let sse = format!(
            "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"usage\":{{\"input_tokens\":4,\"cache_read_input_tokens\":{},\"cache_creation_input_tokens\":{},\"output_tokens\":1}}}}}}\n\n",
            u64::MAX,
            MAX_REPORTED_TOKENS + 1
        );
        let u = scan_in_pieces("text/event-stream", sse.as_bytes(), 9).unwrap();
        assert_eq!(
            (u.cache_read_tokens, u.cache_write_tokens, u.prompt_tokens()),
            (
                MAX_REPORTED_TOKENS,
                MAX_REPORTED_TOKENS,
                2 * MAX_REPORTED_TOKENS + 4
            )
        );
        // Within the ceiling: as reported, not flagged.
        let mut s = UsageScanner::for_content_type(Some("application/json"));
        s.feed(br#"{"usage":{"prompt_tokens":100000000,"completion_tokens":7}}"#);
        assert_eq!(
            s.finish().map(|u| u.input_tokens),
            Some(MAX_REPORTED_TOKENS)
        );
        assert!(!s.clamped());
    }

    #[test]
    fn nothing_learned_from_other_bodies() {
        assert_eq!(scan_in_pieces("text/plain", b"usage", 1), None);
        assert_eq!(scan_in_pieces("application/json", b"{\"usage\":", 3), None);
        assert_eq!(
            scan_in_pieces("text/event-stream", b"data: {\"usage\": nope}\n\n", 3),
            None
        );
    }

    #[test]
    fn odd_shapes_are_skipped_not_fatal() {
        let json = |body: &str| scan_in_pieces("application/json", body.as_bytes(), 7);
        // An error's `message` is a string; the usage beside it still counts.
        assert_eq!(
            json(r#"{"message":"overloaded","usage":{"prompt_tokens":5,"completion_tokens":1}}"#),
            Some(Usage {
                input_tokens: 5,
                output_tokens: 1,
                ..Usage::default()
            })
        );
        for odd in [
            r#"{"usage":null}"#,
            r#"{"usage":[1,2,{"prompt_tokens":3}]}"#,
            r#"{"usage":"12 tokens","message":[{"usage":{"input_tokens":4}}]}"#,
            r#"{"usage":{"prompt_tokens":"12","completion_tokens":-3,"input_tokens":1.5}}"#,
            r#"{"response":true,"message":{"usage":7}}"#,
        ] {
            assert_eq!(json(odd), None, "{odd}");
        }
        // One unreadable count does not hide the other.
        assert_eq!(
            json(r#"{"usage":{"prompt_tokens":"12","completion_tokens":9,"extra":{"a":[1]}}}"#),
            Some(Usage {
                input_tokens: 0,
                output_tokens: 9,
                ..Usage::default()
            })
        );
        assert_eq!(
            json(r#"{"response":{"usage":{"input_tokens":2,"output_tokens":3}},"usage":{}}"#),
            Some(Usage {
                input_tokens: 2,
                output_tokens: 3,
                ..Usage::default()
            })
        );
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_arbitrary_streams(
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..2048),
            piece in 1usize..64,
        ) {
            let _ = scan_in_pieces("text/event-stream", &body, piece);
            let _ = scan_in_pieces("application/json", &body, piece);
        }
    }
}
