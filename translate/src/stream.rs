//! Streams translated event by event as they arrive, with bounded state:
//! the line being read, the event being assembled (both at most
//! `max_event_bytes`), the message's id and model, which block is open and
//! the usage so far. Nothing of the answer's text is kept after its event
//! is written.
//!
//! OpenAI chunks -> Anthropic events: `message_start` at the first chunk;
//! text deltas in a text block, each tool call (a new `id` at its `index`)
//! in a `tool_use` block fed by `input_json_delta`s; `content_block_stop`
//! when the next block starts or the choice finishes; at `[DONE]`
//! `message_delta` (stop reason, usage: OpenAI reports the prompt's tokens
//! only at the end, so they are in `message_delta`'s usage, which the
//! Anthropic SDKs merge into the message) and `message_stop`.
//!
//! Anthropic events -> OpenAI chunks: the role at the first block, as
//! OpenAI sends it (`content: ""` before text; `content: null` in the
//! first call's chunk when the answer starts with a tool call), text
//! deltas as `content`, each `tool_use` block as a tool call with its
//! own `index` (id and name first, then its argument deltas), the finish
//! chunk at `message_delta`, at `message_stop` the usage chunk (when the
//! agent asked for one with `stream_options.include_usage`) and
//! `data: [DONE]`.
//!
//! A stream that breaks (the upstream ends early, sends something this
//! cannot translate, or the gateway gives up on it) ends with
//! [`StreamTranslator::fail`]: an error event in the agent's family.
//! An upstream's own error event is passed on in the agent's family.
//!
//! Each event is read into typed structs that borrow from its bytes
//! ([`crate::events`]), never into a `serde_json::Value` tree, and the
//! agent's events are written straight into the output (keys in the
//! order a `serde_json::Map` writes them, so the bytes are what a tree
//! would have written): a text delta costs no allocation.

use crate::events::{
    self, AnthropicUsage, Chunk, Delta, ErrorBody, Event as AnthropicEvent, Field, Input,
    OpenAiUsage, ToolCall,
};
use crate::response::Usage;
use crate::sse::{Event, SseError, SseReader};
use crate::{error, finish_reason, stop_reason, Family, Reason, Untranslatable, R};
use std::io::Write;

/// Most tool calls in one answer (each needs a line of state).
const MAX_TOOL_CALLS: u32 = 1024;

impl From<SseError> for Untranslatable {
    fn from(_: SseError) -> Self {
        Untranslatable::new("event", Reason::OutOfRange)
    }
}

/// How a stream is translated.
#[derive(Debug, Clone, Copy)]
pub struct StreamOptions {
    /// Unix seconds for OpenAI chunks made from Anthropic events.
    pub created: u64,
    /// An OpenAI agent asked for the final usage chunk.
    pub usage_chunk: bool,
    /// Largest single event accepted from the upstream.
    pub max_event_bytes: usize,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            created: 0,
            usage_chunk: false,
            max_event_bytes: 4 << 20,
        }
    }
}

/// How the stream ended, so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Still open: more input is expected.
    Open,
    /// The upstream ended the answer properly and the agent got its end.
    Complete,
    /// The upstream sent an error event, passed on to the agent.
    UpstreamError,
    /// The stream broke; the agent got [`StreamTranslator::fail`]'s event.
    Failed,
}

/// One stream's translator, from the upstream's family to the agent's.
#[derive(Debug)]
pub struct StreamTranslator {
    reader: SseReader,
    state: State,
    end: End,
    usage: Usage,
}

#[derive(Debug)]
enum State {
    FromOpenAi(FromOpenAi),
    FromAnthropic(FromAnthropic),
}

impl StreamTranslator {
    /// A translator for an upstream of family `upstream`; the agent speaks
    /// the other one.
    pub fn new(upstream: Family, opts: StreamOptions) -> Self {
        StreamTranslator {
            reader: SseReader::new(opts.max_event_bytes),
            state: match upstream {
                Family::OpenAi => State::FromOpenAi(FromOpenAi::default()),
                Family::Anthropic => State::FromAnthropic(FromAnthropic {
                    created: opts.created,
                    usage_chunk: opts.usage_chunk,
                    ..FromAnthropic::default()
                }),
            },
            end: End::Open,
            usage: Usage::default(),
        }
    }

    /// The agent's family.
    pub fn agent(&self) -> Family {
        match self.state {
            State::FromOpenAi(_) => Family::Anthropic,
            State::FromAnthropic(_) => Family::OpenAi,
        }
    }

    pub fn end(&self) -> End {
        self.end
    }

    /// Usage as reported so far (complete once the stream is).
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Translate the next bytes of the upstream's body (split anywhere),
    /// appending the agent's bytes to `out`. On an error the stream is
    /// broken: `out` holds the agent's events for the events before the
    /// failing one, whole (send them first), then call
    /// [`fail`](Self::fail). Input after the end is ignored.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> R<()> {
        if self.end != End::Open {
            return Ok(());
        }
        let Self {
            reader,
            state,
            end,
            usage,
        } = self;
        reader.feed(input, &mut |e: Event<'_>| {
            if *end != End::Open {
                return Ok(());
            }
            // An event that fails leaves nothing of itself in `out`: what
            // is there is whole events, safe to send before the error.
            let mark = out.len();
            let next = match state {
                State::FromOpenAi(s) => s.event(e.data, usage, out),
                State::FromAnthropic(s) => s.event(e.name, e.data, usage, out),
            };
            match next {
                Ok(n) => {
                    *end = n;
                    Ok(())
                }
                Err(err) => {
                    out.truncate(mark);
                    Err(err)
                }
            }
        })
    }

    /// The upstream's body ended. An error if the answer was not complete
    /// (then call [`fail`](Self::fail)).
    pub fn finish(&mut self) -> R<()> {
        match self.end {
            End::Open => Err(Untranslatable::new("stream", Reason::Missing)),
            _ => Ok(()),
        }
    }

    /// End a broken stream with an error event in the agent's family
    /// (once; nothing if the stream already ended). `message` is the
    /// gateway's, never the upstream's text.
    pub fn fail(&mut self, message: &str, out: &mut Vec<u8>) {
        if self.end != End::Open {
            return;
        }
        self.end = End::Failed;
        out.extend_from_slice(&error::sse_event(self.agent(), 500, message, None));
    }
}

fn malformed<T>(field: &str) -> R<T> {
    Err(Untranslatable::new(field, Reason::Malformed))
}

/// An event's data, read into its typed struct (see [`crate::events`]).
fn parse<'a, T: serde::Deserialize<'a>>(data: &'a [u8]) -> R<T> {
    events::parse(data).or_else(|_| malformed("event.data"))
}

/// A JSON string.
fn string(out: &mut Vec<u8>, s: &str) {
    // Writing into a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn number(out: &mut Vec<u8>, n: u64) {
    let _ = write!(out, "{n}");
}

/// `event: name` + `data: ` for an Anthropic agent; the data follows,
/// then [`end_event`].
fn anthropic_event(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
}

fn end_event(out: &mut Vec<u8>) {
    out.extend_from_slice(b"\n\n");
}

/// An upstream's error event, passed on in the agent's family.
fn upstream_error(agent: Family, e: &Field<ErrorBody<'_>>, out: &mut Vec<u8>) -> End {
    let e = e.get();
    let message = e
        .and_then(|e| e.message.str())
        .unwrap_or("the provider's stream failed");
    let ty = e.and_then(|e| e.ty.str());
    let status = match ty {
        Some("overloaded_error") => 529,
        Some("rate_limit_error") | Some("rate_limit_exceeded") => 429,
        _ => 500,
    };
    out.extend_from_slice(&error::sse_event(agent, status, message, ty));
    End::UpstreamError
}

/// OpenAI's usage object (a value of another shape reads as all zeros).
fn openai_usage(u: Option<&OpenAiUsage>) -> Usage {
    let n = |f: Option<&Field<u64>>| f.and_then(Field::u64).unwrap_or(0);
    let prompt = n(u.map(|u| &u.prompt_tokens));
    let cached = n(u
        .and_then(|u| u.prompt_tokens_details.get())
        .map(|d| &d.cached_tokens));
    Usage {
        input: prompt.saturating_sub(cached),
        output: n(u.map(|u| &u.completion_tokens)),
        cache_read: cached.min(prompt),
        cache_creation: 0,
    }
}

/// Anthropic's usage object; fields it leaves out keep their value (a
/// stream's `message_delta` may carry only `output_tokens`).
fn update_usage(usage: &mut Usage, u: &AnthropicUsage) {
    let set = |slot: &mut u64, f: &Field<u64>| {
        if let Some(n) = f.u64() {
            *slot = n;
        }
    };
    set(&mut usage.input, &u.input_tokens);
    set(&mut usage.output, &u.output_tokens);
    set(&mut usage.cache_read, &u.cache_read_input_tokens);
    set(&mut usage.cache_creation, &u.cache_creation_input_tokens);
}

// ----- OpenAI chunks -> Anthropic events ------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text(u32),
    /// A tool_use block and the OpenAI call index it carries.
    Tool(u32, u64),
}

#[derive(Debug, Default)]
struct FromOpenAi {
    started: bool,
    open: Option<Open>,
    next_block: u32,
    /// OpenAI call indexes seen, in order (each call opens one block).
    calls: u32,
    last_call: Option<u64>,
    stop: Option<&'static str>,
    refusal: bool,
}

impl FromOpenAi {
    fn event(&mut self, data: &[u8], usage: &mut Usage, out: &mut Vec<u8>) -> R<End> {
        if data == b"[DONE]" {
            return self.done(usage, out);
        }
        let v: Chunk = parse(data)?;
        if v.error.given() {
            return Ok(upstream_error(Family::Anthropic, &v.error, out));
        }
        if !self.started {
            let (Some(id), Some(model)) = (v.id.str(), v.model.str()) else {
                return malformed("id");
            };
            self.started = true;
            anthropic_event(out, "message_start");
            out.extend_from_slice(b"{\"message\":{\"content\":[],\"id\":");
            string(out, id);
            out.extend_from_slice(b",\"model\":");
            string(out, model);
            out.extend_from_slice(
                b",\"role\":\"assistant\",\"stop_reason\":null,\"stop_sequence\":null,\
                  \"type\":\"message\",\"usage\":{\"input_tokens\":0,\"output_tokens\":0}},\
                  \"type\":\"message_start\"}",
            );
            end_event(out);
        }
        match &v.usage {
            Field::Absent | Field::Null => {}
            u => *usage = openai_usage(u.get()),
        }
        let choices = match &v.choices {
            Field::Absent | Field::Null => return Ok(End::Open),
            Field::Is(c) => c,
            Field::Other => return malformed("choices"),
        };
        for c in choices.iter() {
            let Some(c) = c.get().filter(|c| c.index.u64() == Some(0)) else {
                return malformed("choices[].index");
            };
            match &c.delta {
                Field::Absent | Field::Null => {}
                Field::Is(d) => self.delta(d, out)?,
                // Not an object: it has nothing to say.
                Field::Other => self.delta_none()?,
            }
            if c.finish_reason.given() {
                let Some(s) = c.finish_reason.str().and_then(stop_reason) else {
                    return malformed("choices[0].finish_reason");
                };
                self.stop = Some(if self.refusal { "refusal" } else { s });
                self.close(out);
            }
        }
        Ok(End::Open)
    }

    /// A delta that is not an object (it carries nothing).
    fn delta_none(&mut self) -> R<()> {
        if self.stop.is_some() {
            return malformed("choices[0].delta");
        }
        Ok(())
    }

    fn delta(&mut self, d: &Delta<'_>, out: &mut Vec<u8>) -> R<()> {
        self.delta_none()?;
        for (f, refusal) in [(&d.content, false), (&d.refusal, true)] {
            match f {
                Field::Absent | Field::Null => {}
                Field::Is(t) => {
                    self.refusal |= refusal;
                    if !t.is_empty() {
                        self.text(t, out);
                    }
                }
                Field::Other => return malformed("choices[0].delta.content"),
            }
        }
        match &d.tool_calls {
            Field::Absent | Field::Null => {}
            Field::Is(calls) => {
                for c in calls.iter() {
                    self.tool_call(c, out)?;
                }
            }
            Field::Other => return malformed("choices[0].delta.tool_calls"),
        }
        Ok(())
    }

    fn text(&mut self, t: &str, out: &mut Vec<u8>) {
        let index = match self.open {
            Some(Open::Text(i)) => i,
            _ => {
                self.close(out);
                let i = self.next_block;
                self.next_block += 1;
                self.open = Some(Open::Text(i));
                anthropic_event(out, "content_block_start");
                out.extend_from_slice(
                    b"{\"content_block\":{\"text\":\"\",\"type\":\"text\"},\"index\":",
                );
                number(out, i.into());
                out.extend_from_slice(b",\"type\":\"content_block_start\"}");
                end_event(out);
                i
            }
        };
        out.extend_from_slice(
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":",
        );
        number(out, index.into());
        out.extend_from_slice(b",\"delta\":{\"type\":\"text_delta\",\"text\":");
        string(out, t);
        out.extend_from_slice(b"}}\n\n");
    }

    fn tool_call(&mut self, c: &Field<ToolCall<'_>>, out: &mut Vec<u8>) -> R<()> {
        let Some((c, call)) = c.get().and_then(|c| Some((c, c.index.u64()?))) else {
            return malformed("choices[0].delta.tool_calls[].index");
        };
        let f = c.function.get();
        let args = match f.map_or(&Field::Absent, |f| &f.arguments) {
            Field::Absent | Field::Null => "",
            Field::Is(a) => a,
            Field::Other => return malformed("choices[0].delta.tool_calls[].function.arguments"),
        };
        let block = match (c.id.str(), self.open) {
            (Some(id), _) if self.last_call != Some(call) => {
                // A new call: it opens its block; calls arrive one after another.
                if self.last_call.is_some_and(|l| call <= l) {
                    return malformed("choices[0].delta.tool_calls[].index");
                }
                let Some(name) = f.and_then(|f| f.name.str()) else {
                    return malformed("choices[0].delta.tool_calls[].function.name");
                };
                if self.calls >= MAX_TOOL_CALLS {
                    return Err(Untranslatable::new(
                        "choices[0].delta.tool_calls",
                        Reason::OutOfRange,
                    ));
                }
                self.close(out);
                self.calls += 1;
                self.last_call = Some(call);
                let i = self.next_block;
                self.next_block += 1;
                self.open = Some(Open::Tool(i, call));
                anthropic_event(out, "content_block_start");
                out.extend_from_slice(b"{\"content_block\":{\"id\":");
                string(out, id);
                out.extend_from_slice(b",\"input\":{},\"name\":");
                string(out, name);
                out.extend_from_slice(b",\"type\":\"tool_use\"},\"index\":");
                number(out, i.into());
                out.extend_from_slice(b",\"type\":\"content_block_start\"}");
                end_event(out);
                i
            }
            // More arguments for the call whose block is open.
            (_, Some(Open::Tool(i, open_call))) if open_call == call => i,
            // Arguments for a call whose block closed: Anthropic blocks
            // cannot interleave.
            _ => return malformed("choices[0].delta.tool_calls[].index"),
        };
        if !args.is_empty() {
            out.extend_from_slice(
                b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":",
            );
            number(out, block.into());
            out.extend_from_slice(b",\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":");
            string(out, args);
            out.extend_from_slice(b"}}\n\n");
        }
        Ok(())
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if let Some(Open::Text(i) | Open::Tool(i, _)) = self.open.take() {
            anthropic_event(out, "content_block_stop");
            out.extend_from_slice(b"{\"index\":");
            number(out, i.into());
            out.extend_from_slice(b",\"type\":\"content_block_stop\"}");
            end_event(out);
        }
    }

    fn done(&mut self, usage: &Usage, out: &mut Vec<u8>) -> R<End> {
        let Some(stop) = self.stop else {
            return malformed("choices[0].finish_reason");
        };
        if !self.started {
            return malformed("id");
        }
        self.close(out);
        anthropic_event(out, "message_delta");
        out.extend_from_slice(b"{\"delta\":{\"stop_reason\":");
        string(out, stop);
        out.extend_from_slice(b",\"stop_sequence\":null},\"type\":\"message_delta\",\"usage\":");
        // The keys in order, as `Usage::to_anthropic` writes them.
        for (i, (k, n)) in [
            ("cache_creation_input_tokens", usage.cache_creation),
            ("cache_read_input_tokens", usage.cache_read),
            ("input_tokens", usage.input),
            ("output_tokens", usage.output),
        ]
        .into_iter()
        .enumerate()
        {
            out.extend_from_slice(if i == 0 { b"{\"" } else { b",\"" });
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(b"\":");
            number(out, n);
        }
        out.extend_from_slice(b"}}");
        end_event(out);
        anthropic_event(out, "message_stop");
        out.extend_from_slice(b"{\"type\":\"message_stop\"}");
        end_event(out);
        Ok(End::Complete)
    }
}

// ----- Anthropic events -> OpenAI chunks ------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    /// A tool_use block and the OpenAI tool-call index given to it.
    Tool(u32),
}

#[derive(Debug, Default)]
struct FromAnthropic {
    created: u64,
    usage_chunk: bool,
    id: String,
    model: String,
    started: bool,
    /// The first chunk (with `role`) went out. It waits for the first
    /// block: OpenAI's first delta is `content: ""` before text and
    /// `content: null` with the first tool call, which SDKs keep.
    role_sent: bool,
    /// The open block: its Anthropic index and kind.
    open: Option<(u64, Block)>,
    calls: u32,
    finished: bool,
}

impl FromAnthropic {
    fn event(&mut self, name: &[u8], data: &[u8], usage: &mut Usage, out: &mut Vec<u8>) -> R<End> {
        let v: AnthropicEvent = parse(data)?;
        let Some(ty) = v.ty.str() else {
            return malformed("event.type");
        };
        // The SDKs read the `event:` name, this reads the data's type: they
        // must agree.
        if !name.is_empty() && name != ty.as_bytes() {
            return malformed("event");
        }
        if ty == "error" {
            return Ok(upstream_error(Family::OpenAi, &v.error, out));
        }
        if ty == "ping" {
            return Ok(End::Open);
        }
        if !self.started && ty != "message_start" {
            return malformed("message_start");
        }
        match ty {
            "message_start" => {
                let m = v.message.get();
                let (Some(id), Some(model)) =
                    (m.and_then(|m| m.id.str()), m.and_then(|m| m.model.str()))
                else {
                    return malformed("message_start.message");
                };
                if self.started {
                    return malformed("message_start");
                }
                self.started = true;
                self.id = id.to_owned();
                self.model = model.to_owned();
                if let Some(u) = m.and_then(|m| m.usage.get()) {
                    update_usage(usage, u);
                }
            }
            "content_block_start" => {
                let (Some(index), true) = (v.index.u64(), v.content_block.present()) else {
                    return malformed("content_block_start");
                };
                if self.open.is_some() || self.finished {
                    return malformed("content_block_start");
                }
                let b = v.content_block.get();
                match b.and_then(|b| b.ty.str()) {
                    Some("text") => {
                        self.role_chunk(out);
                        self.open = Some((index, Block::Text));
                        match b.and_then(|b| b.text.str()) {
                            Some("") => {}
                            Some(t) => self.text_chunk(out, t),
                            None => return malformed("content_block_start.content_block.text"),
                        }
                    }
                    Some("tool_use") => {
                        let (Some(id), Some(name)) =
                            (b.and_then(|b| b.id.str()), b.and_then(|b| b.name.str()))
                        else {
                            return malformed("content_block_start.content_block");
                        };
                        if self.calls >= MAX_TOOL_CALLS {
                            return Err(Untranslatable::new(
                                "content_block_start",
                                Reason::OutOfRange,
                            ));
                        }
                        // The block's input is normally `{}` and streamed;
                        // one given whole is sent whole.
                        let whole = match b.map_or(&Field::Absent, |b| &b.input) {
                            Field::Absent | Field::Is(Input::Empty) => None,
                            Field::Is(Input::Whole(i)) => Some(i.to_string()),
                            _ => return malformed("content_block_start.content_block.input"),
                        };
                        let k = self.calls;
                        self.calls += 1;
                        self.open = Some((index, Block::Tool(k)));
                        self.head(out);
                        out.extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":{");
                        if !self.role_sent {
                            // The answer starts with a call: no content.
                            self.role_sent = true;
                            out.extend_from_slice(b"\"content\":null,\"role\":\"assistant\",");
                        }
                        out.extend_from_slice(b"\"tool_calls\":[{\"function\":{\"arguments\":");
                        string(out, whole.as_deref().unwrap_or(""));
                        out.extend_from_slice(b",\"name\":");
                        string(out, name);
                        out.extend_from_slice(b"},\"id\":");
                        string(out, id);
                        out.extend_from_slice(b",\"index\":");
                        number(out, k.into());
                        out.extend_from_slice(b",\"type\":\"function\"}]}");
                        self.chunk_end(out, None);
                    }
                    // thinking, redacted_thinking, server tools: refused
                    // in the request, so never expected here.
                    _ => {
                        return Err(Untranslatable::new(
                            "content_block_start.content_block.type",
                            Reason::NoEquivalent,
                        ))
                    }
                }
            }
            "content_block_delta" => {
                let (Some(index), true) = (v.index.u64(), v.delta.present()) else {
                    return malformed("content_block_delta");
                };
                let Some((_, block)) = self.open.filter(|(i, _)| *i == index) else {
                    return malformed("content_block_delta.index");
                };
                let d = v.delta.get();
                match (d.and_then(|d| d.ty.str()), block) {
                    (Some("text_delta"), Block::Text) => {
                        let Some(t) = d.and_then(|d| d.text.str()) else {
                            return malformed("content_block_delta.delta.text");
                        };
                        self.text_chunk(out, t);
                    }
                    (Some("input_json_delta"), Block::Tool(k)) => {
                        let Some(p) = d.and_then(|d| d.partial_json.str()) else {
                            return malformed("content_block_delta.delta.partial_json");
                        };
                        if !p.is_empty() {
                            self.head(out);
                            out.extend_from_slice(
                                b",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":",
                            );
                            string(out, p);
                            out.extend_from_slice(b"},\"index\":");
                            number(out, k.into());
                            out.extend_from_slice(b"}]}");
                            self.chunk_end(out, None);
                        }
                    }
                    _ => {
                        return Err(Untranslatable::new(
                            "content_block_delta.delta.type",
                            Reason::NoEquivalent,
                        ))
                    }
                }
            }
            "content_block_stop" => match self.open {
                Some((i, _)) if Some(i) == v.index.u64() => self.open = None,
                _ => return malformed("content_block_stop.index"),
            },
            "message_delta" => {
                if let Some(u) = v.usage.get() {
                    update_usage(usage, u);
                }
                let stop = v.delta.get().map_or(&Field::Absent, |d| &d.stop_reason);
                if stop.given() {
                    let Some(f) = stop.str().and_then(finish_reason) else {
                        return malformed("message_delta.delta.stop_reason");
                    };
                    if self.finished || self.open.is_some() {
                        return malformed("message_delta");
                    }
                    // An answer without a block still has its role.
                    self.role_chunk(out);
                    self.finished = true;
                    self.chunk(out, b"{}", Some(f));
                }
            }
            "message_stop" => {
                if !self.finished {
                    return malformed("message_delta.delta.stop_reason");
                }
                if self.usage_chunk {
                    self.usage_chunk(out, usage);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                return Ok(End::Complete);
            }
            _ => {
                return Err(Untranslatable::new("event.type", Reason::Unknown));
            }
        }
        Ok(End::Open)
    }

    /// The first chunk, before the first text (once).
    fn role_chunk(&mut self, out: &mut Vec<u8>) {
        if self.role_sent {
            return;
        }
        self.role_sent = true;
        self.chunk(out, b"{\"content\":\"\",\"role\":\"assistant\"}", None);
    }

    fn head(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"data: {\"id\":");
        string(out, &self.id);
        out.extend_from_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
        number(out, self.created);
        out.extend_from_slice(b",\"model\":");
        string(out, &self.model);
    }

    /// A chunk whose delta is the JSON `delta`.
    fn chunk(&self, out: &mut Vec<u8>, delta: &[u8], finish: Option<&str>) {
        self.head(out);
        out.extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":");
        out.extend_from_slice(delta);
        self.chunk_end(out, finish);
    }

    /// What follows a chunk's delta.
    fn chunk_end(&self, out: &mut Vec<u8>, finish: Option<&str>) {
        out.extend_from_slice(b",\"logprobs\":null,\"finish_reason\":");
        match finish {
            Some(f) => {
                out.push(b'"');
                out.extend_from_slice(f.as_bytes());
                out.push(b'"');
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b"}]}\n\n");
    }

    fn text_chunk(&self, out: &mut Vec<u8>, t: &str) {
        self.head(out);
        out.extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":{\"content\":");
        string(out, t);
        out.extend_from_slice(b"},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    }

    fn usage_chunk(&self, out: &mut Vec<u8>, usage: &Usage) {
        self.head(out);
        out.extend_from_slice(b",\"choices\":[],\"usage\":");
        // The keys in order, as `Usage::to_openai` writes them.
        let prompt = usage.prompt();
        out.extend_from_slice(b"{\"completion_tokens\":");
        number(out, usage.output);
        out.extend_from_slice(b",\"prompt_tokens\":");
        number(out, prompt);
        out.extend_from_slice(b",\"prompt_tokens_details\":{\"cached_tokens\":");
        number(out, usage.cache_read);
        out.extend_from_slice(b"},\"total_tokens\":");
        number(out, prompt.saturating_add(usage.output));
        out.extend_from_slice(b"}}\n\n");
    }
}
