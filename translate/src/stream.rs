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

use crate::response::Usage;
use crate::sse::{Event, SseError, SseReader};
use crate::{error, finish_reason, stop_reason, strict, Family, Reason, Untranslatable, R};
use serde_json::{json, Value};

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
    /// broken: call [`fail`](Self::fail). Input after the end is ignored.
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
            *end = match state {
                State::FromOpenAi(s) => s.event(e.data, usage, out)?,
                State::FromAnthropic(s) => s.event(e.name, e.data, usage, out)?,
            };
            Ok(())
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

fn parse(data: &[u8]) -> R<Value> {
    match strict::parse(data) {
        Ok(v @ Value::Object(_)) => Ok(v),
        _ => malformed("event.data"),
    }
}

/// `event: name` + `data: v` for an Anthropic agent.
fn anthropic_event(out: &mut Vec<u8>, name: &str, v: &Value) -> R<()> {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    serde_json::to_writer(&mut *out, v).or_else(|_| malformed("event.data"))?;
    out.extend_from_slice(b"\n\n");
    Ok(())
}

/// An upstream's error event, passed on in the agent's family.
fn upstream_error(agent: Family, v: &Value, out: &mut Vec<u8>) -> End {
    let e = v.get("error");
    let message = e
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("the provider's stream failed");
    let ty = e.and_then(|e| e.get("type")).and_then(Value::as_str);
    let status = match ty {
        Some("overloaded_error") => 529,
        Some("rate_limit_error") | Some("rate_limit_exceeded") => 429,
        _ => 500,
    };
    out.extend_from_slice(&error::sse_event(agent, status, message, ty));
    End::UpstreamError
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
        let v = parse(data)?;
        if v.get("error").is_some_and(|e| !e.is_null()) {
            return Ok(upstream_error(Family::Anthropic, &v, out));
        }
        if !self.started {
            let (Some(id), Some(model)) = (
                v.get("id").and_then(Value::as_str),
                v.get("model").and_then(Value::as_str),
            ) else {
                return malformed("id");
            };
            self.started = true;
            anthropic_event(
                out,
                "message_start",
                &json!({"type": "message_start", "message": {
                    "id": id, "type": "message", "role": "assistant", "model": model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": 0, "output_tokens": 0},
                }}),
            )?;
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            *usage = Usage::from_openai(u);
        }
        let choices = match v.get("choices") {
            None | Some(Value::Null) => return Ok(End::Open),
            Some(Value::Array(c)) => c,
            Some(_) => return malformed("choices"),
        };
        for c in choices {
            if c.get("index").and_then(Value::as_u64) != Some(0) {
                return malformed("choices[].index");
            }
            if let Some(d) = c.get("delta").filter(|d| !d.is_null()) {
                self.delta(d, out)?;
            }
            if let Some(f) = c.get("finish_reason").filter(|f| !f.is_null()) {
                let Some(s) = f.as_str().and_then(stop_reason) else {
                    return malformed("choices[0].finish_reason");
                };
                self.stop = Some(if self.refusal { "refusal" } else { s });
                self.close(out)?;
            }
        }
        Ok(End::Open)
    }

    fn delta(&mut self, d: &Value, out: &mut Vec<u8>) -> R<()> {
        if self.stop.is_some() {
            return malformed("choices[0].delta");
        }
        for (k, refusal) in [("content", false), ("refusal", true)] {
            match d.get(k) {
                None | Some(Value::Null) => {}
                Some(Value::String(t)) => {
                    self.refusal |= refusal;
                    if !t.is_empty() {
                        self.text(t, out)?;
                    }
                }
                Some(_) => return malformed("choices[0].delta.content"),
            }
        }
        match d.get("tool_calls") {
            None | Some(Value::Null) => {}
            Some(Value::Array(calls)) => {
                for c in calls {
                    self.tool_call(c, out)?;
                }
            }
            Some(_) => return malformed("choices[0].delta.tool_calls"),
        }
        Ok(())
    }

    fn text(&mut self, t: &str, out: &mut Vec<u8>) -> R<()> {
        let index = match self.open {
            Some(Open::Text(i)) => i,
            _ => {
                self.close(out)?;
                let i = self.next_block;
                self.next_block += 1;
                self.open = Some(Open::Text(i));
                anthropic_event(
                    out,
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": i,
                            "content_block": {"type": "text", "text": ""}}),
                )?;
                i
            }
        };
        out.extend_from_slice(
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":",
        );
        out.extend_from_slice(index.to_string().as_bytes());
        out.extend_from_slice(b",\"delta\":{\"type\":\"text_delta\",\"text\":");
        serde_json::to_writer(&mut *out, t).or_else(|_| malformed("text"))?;
        out.extend_from_slice(b"}}\n\n");
        Ok(())
    }

    fn tool_call(&mut self, c: &Value, out: &mut Vec<u8>) -> R<()> {
        let Some(call) = c.get("index").and_then(Value::as_u64) else {
            return malformed("choices[0].delta.tool_calls[].index");
        };
        let f = c.get("function");
        let args = match f.and_then(|f| f.get("arguments")) {
            None | Some(Value::Null) => "",
            Some(Value::String(a)) => a.as_str(),
            Some(_) => return malformed("choices[0].delta.tool_calls[].function.arguments"),
        };
        let block = match (c.get("id").and_then(Value::as_str), self.open) {
            (Some(id), _) if self.last_call != Some(call) => {
                // A new call: it opens its block; calls arrive one after another.
                if self.last_call.is_some_and(|l| call <= l) {
                    return malformed("choices[0].delta.tool_calls[].index");
                }
                let Some(name) = f.and_then(|f| f.get("name")).and_then(Value::as_str) else {
                    return malformed("choices[0].delta.tool_calls[].function.name");
                };
                if self.calls >= MAX_TOOL_CALLS {
                    return Err(Untranslatable::new(
                        "choices[0].delta.tool_calls",
                        Reason::OutOfRange,
                    ));
                }
                self.close(out)?;
                self.calls += 1;
                self.last_call = Some(call);
                let i = self.next_block;
                self.next_block += 1;
                self.open = Some(Open::Tool(i, call));
                anthropic_event(
                    out,
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": i,
                            "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
                )?;
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
            out.extend_from_slice(block.to_string().as_bytes());
            out.extend_from_slice(b",\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":");
            serde_json::to_writer(&mut *out, args).or_else(|_| malformed("arguments"))?;
            out.extend_from_slice(b"}}\n\n");
        }
        Ok(())
    }

    fn close(&mut self, out: &mut Vec<u8>) -> R<()> {
        if let Some(Open::Text(i) | Open::Tool(i, _)) = self.open.take() {
            anthropic_event(
                out,
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": i}),
            )?;
        }
        Ok(())
    }

    fn done(&mut self, usage: &Usage, out: &mut Vec<u8>) -> R<End> {
        let Some(stop) = self.stop else {
            return malformed("choices[0].finish_reason");
        };
        if !self.started {
            return malformed("id");
        }
        self.close(out)?;
        anthropic_event(
            out,
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": null},
                    "usage": usage.to_anthropic()}),
        )?;
        anthropic_event(out, "message_stop", &json!({"type": "message_stop"}))?;
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
        let v = parse(data)?;
        let Some(ty) = v.get("type").and_then(Value::as_str) else {
            return malformed("event.type");
        };
        // The SDKs read the `event:` name, this reads the data's type: they
        // must agree.
        if !name.is_empty() && name != ty.as_bytes() {
            return malformed("event");
        }
        if ty == "error" {
            return Ok(upstream_error(Family::OpenAi, &v, out));
        }
        if ty == "ping" {
            return Ok(End::Open);
        }
        if !self.started && ty != "message_start" {
            return malformed("message_start");
        }
        match ty {
            "message_start" => {
                let m = v.get("message");
                let (Some(id), Some(model)) = (
                    m.and_then(|m| m.get("id")).and_then(Value::as_str),
                    m.and_then(|m| m.get("model")).and_then(Value::as_str),
                ) else {
                    return malformed("message_start.message");
                };
                if self.started {
                    return malformed("message_start");
                }
                self.started = true;
                self.id = id.to_owned();
                self.model = model.to_owned();
                if let Some(u) = m.and_then(|m| m.get("usage")) {
                    usage.update_from_anthropic(u);
                }
            }
            "content_block_start" => {
                let (Some(index), Some(b)) = (
                    v.get("index").and_then(Value::as_u64),
                    v.get("content_block"),
                ) else {
                    return malformed("content_block_start");
                };
                if self.open.is_some() || self.finished {
                    return malformed("content_block_start");
                }
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        self.role_chunk(out)?;
                        self.open = Some((index, Block::Text));
                        match b.get("text").and_then(Value::as_str) {
                            Some("") => {}
                            Some(t) => self.chunk(out, &json!({"content": t}), None)?,
                            None => return malformed("content_block_start.content_block.text"),
                        }
                    }
                    Some("tool_use") => {
                        let (Some(id), Some(name)) = (
                            b.get("id").and_then(Value::as_str),
                            b.get("name").and_then(Value::as_str),
                        ) else {
                            return malformed("content_block_start.content_block");
                        };
                        if self.calls >= MAX_TOOL_CALLS {
                            return Err(Untranslatable::new(
                                "content_block_start",
                                Reason::OutOfRange,
                            ));
                        }
                        let k = self.calls;
                        self.calls += 1;
                        self.open = Some((index, Block::Tool(k)));
                        // The block's input is normally `{}` and streamed;
                        // one given whole is sent whole.
                        let args = match b.get("input") {
                            None => String::new(),
                            Some(Value::Object(m)) if m.is_empty() => String::new(),
                            Some(i @ Value::Object(_)) => i.to_string(),
                            Some(_) => return malformed("content_block_start.content_block.input"),
                        };
                        let mut delta = json!({"tool_calls": [{"index": k, "id": id, "type": "function",
                                                "function": {"name": name, "arguments": args}}]});
                        if !self.role_sent {
                            // The answer starts with a call: no content.
                            self.role_sent = true;
                            delta["role"] = json!("assistant");
                            delta["content"] = Value::Null;
                        }
                        self.chunk(out, &delta, None)?;
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
                let (Some(index), Some(d)) =
                    (v.get("index").and_then(Value::as_u64), v.get("delta"))
                else {
                    return malformed("content_block_delta");
                };
                let Some((_, block)) = self.open.filter(|(i, _)| *i == index) else {
                    return malformed("content_block_delta.index");
                };
                match (d.get("type").and_then(Value::as_str), block) {
                    (Some("text_delta"), Block::Text) => {
                        let Some(t) = d.get("text").and_then(Value::as_str) else {
                            return malformed("content_block_delta.delta.text");
                        };
                        self.text_chunk(out, t)?;
                    }
                    (Some("input_json_delta"), Block::Tool(k)) => {
                        let Some(p) = d.get("partial_json").and_then(Value::as_str) else {
                            return malformed("content_block_delta.delta.partial_json");
                        };
                        if !p.is_empty() {
                            self.chunk(
                                out,
                                &json!({"tool_calls": [{"index": k, "function": {"arguments": p}}]}),
                                None,
                            )?;
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
            "content_block_stop" => {
                let index = v.get("index").and_then(Value::as_u64);
                match self.open {
                    Some((i, _)) if Some(i) == index => self.open = None,
                    _ => return malformed("content_block_stop.index"),
                }
            }
            "message_delta" => {
                if let Some(u) = v.get("usage") {
                    usage.update_from_anthropic(u);
                }
                match v
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .filter(|s| !s.is_null())
                {
                    None => {}
                    Some(s) => {
                        let Some(f) = s.as_str().and_then(finish_reason) else {
                            return malformed("message_delta.delta.stop_reason");
                        };
                        if self.finished || self.open.is_some() {
                            return malformed("message_delta");
                        }
                        // An answer without a block still has its role.
                        self.role_chunk(out)?;
                        self.finished = true;
                        self.chunk(out, &json!({}), Some(f))?;
                    }
                }
            }
            "message_stop" => {
                if !self.finished {
                    return malformed("message_delta.delta.stop_reason");
                }
                if self.usage_chunk {
                    self.usage_chunk(out, usage)?;
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
    fn role_chunk(&mut self, out: &mut Vec<u8>) -> R<()> {
        if self.role_sent {
            return Ok(());
        }
        self.role_sent = true;
        self.chunk(out, &json!({"role": "assistant", "content": ""}), None)
    }

    fn head(&self, out: &mut Vec<u8>) -> R<()> {
        out.extend_from_slice(b"data: {\"id\":");
        serde_json::to_writer(&mut *out, &self.id).or_else(|_| malformed("id"))?;
        out.extend_from_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
        out.extend_from_slice(self.created.to_string().as_bytes());
        out.extend_from_slice(b",\"model\":");
        serde_json::to_writer(&mut *out, &self.model).or_else(|_| malformed("model"))?;
        Ok(())
    }

    fn chunk(&self, out: &mut Vec<u8>, delta: &Value, finish: Option<&str>) -> R<()> {
        self.head(out)?;
        out.extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":");
        serde_json::to_writer(&mut *out, delta).or_else(|_| malformed("delta"))?;
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
        Ok(())
    }

    fn text_chunk(&self, out: &mut Vec<u8>, t: &str) -> R<()> {
        self.head(out)?;
        out.extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":{\"content\":");
        serde_json::to_writer(&mut *out, t).or_else(|_| malformed("text"))?;
        out.extend_from_slice(b"},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        Ok(())
    }

    fn usage_chunk(&self, out: &mut Vec<u8>, usage: &Usage) -> R<()> {
        self.head(out)?;
        out.extend_from_slice(b",\"choices\":[],\"usage\":");
        serde_json::to_writer(&mut *out, &usage.to_openai()).or_else(|_| malformed("usage"))?;
        out.extend_from_slice(b"}\n\n");
        Ok(())
    }
}
