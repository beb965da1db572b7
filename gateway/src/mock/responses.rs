//! The mock's answers, in each provider's wire format.

use serde_json::{json, Value};

const WORDS: [&str; 8] = [
    "Hello",
    " from",
    " the",
    " Loopgate",
    " mock",
    " provider",
    ".",
    " ",
];
/// Fixed so that responses are byte-for-byte reproducible.
const CREATED: u64 = 1_700_000_000;
/// The cities in the mock's tool-call arguments, in turn.
const CITIES: [&str; 4] = ["Paris", "Rome", "Tokyo", "Lima"];
/// What `x-mock-piece-bytes` pieces are cut from.
static FILL: [u8; super::faults::MAX_PIECE_BYTES] = [b'x'; super::faults::MAX_PIECE_BYTES];
/// Bytes of a tool call's arguments per streamed piece.
const ARGUMENT_PIECE: usize = 7;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Responses,
    Embeddings,
    Messages,
}

impl Endpoint {
    pub fn from_path(p: &str) -> Option<Endpoint> {
        Some(match p {
            "/v1/chat/completions" => Endpoint::ChatCompletions,
            "/v1/completions" => Endpoint::Completions,
            "/v1/responses" => Endpoint::Responses,
            "/v1/embeddings" => Endpoint::Embeddings,
            "/v1/messages" => Endpoint::Messages,
            _ => return None,
        })
    }
}

const MODELS: [&str; 4] = ["mock-gpt", "mock-gpt-mini", "mock-claude", "mock-embed"];

pub fn models() -> Value {
    json!({
        "object": "list",
        "data": MODELS.iter().map(|m| json!({
            "id": m, "object": "model", "created": CREATED, "owned_by": "loopgate-mock"
        })).collect::<Vec<_>>()
    })
}

/// A provider-shaped error body.
pub fn error_body(anthropic: bool, status: u16, message: &str) -> Value {
    let kind = match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    };
    if anthropic {
        json!({"type": "error", "error": {"type": kind, "message": message}})
    } else {
        json!({"error": {"message": message, "type": kind, "param": null, "code": status.to_string()}})
    }
}

/// One request's answer, shared by the full and the streamed form.
pub struct Exchange {
    endpoint: Endpoint,
    model: String,
    prompt_tokens: u64,
    /// Of the prompt, read from the cache and written to it.
    cached_tokens: u64,
    cache_write_tokens: u64,
    /// The output tokens to report, when a test set them.
    reported_output: Option<u64>,
    pieces: Vec<&'static str>,
    /// Tokens each text piece counts for.
    piece_tokens: u64,
    /// The text stopped at the request's output limit.
    cut_at_limit: bool,
    include_usage: bool,
    inputs: usize,
    /// Parallel tool calls after the text (chat completions and messages).
    tool_calls: Vec<ToolCall>,
}

/// One tool call of the answer: its arguments are a JSON object's text.
struct ToolCall {
    id: String,
    name: String,
    arguments: String,
}

impl ToolCall {
    /// The arguments in the pieces a stream sends them in (real providers
    /// split them anywhere, mid-key and mid-string).
    fn pieces(&self) -> Vec<&str> {
        let mut out = Vec::new();
        let mut rest = self.arguments.as_str();
        while !rest.is_empty() {
            let mut at = ARGUMENT_PIECE.min(rest.len());
            while !rest.is_char_boundary(at) {
                at += 1;
            }
            let (piece, tail) = rest.split_at(at);
            out.push(piece);
            rest = tail;
        }
        out
    }

    fn input(&self) -> Value {
        serde_json::from_str(&self.arguments).unwrap_or_else(|_| json!({}))
    }
}

/// The answer's tool calls: names from the request's `tools` in order
/// (OpenAI `function.name` or Anthropic `name`), cycled when there are
/// fewer tools than calls, else `mock_tool`.
fn tool_calls(endpoint: Endpoint, req: &Value, n: usize) -> Vec<ToolCall> {
    let prefix = match endpoint {
        Endpoint::ChatCompletions => "call_mock_",
        Endpoint::Messages => "toolu_mock_",
        _ => return Vec::new(),
    };
    let names: Vec<&str> = req
        .get("tools")
        .and_then(Value::as_array)
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| {
                    t.pointer("/function/name")
                        .or_else(|| t.get("name"))
                        .and_then(Value::as_str)
                })
                .collect()
        })
        .unwrap_or_default();
    (0..n)
        .map(|i| ToolCall {
            id: format!("{prefix}{i}"),
            name: if names.is_empty() {
                "mock_tool".to_string()
            } else {
                names[i % names.len()].to_string()
            },
            arguments: json!({"n": i, "city": CITIES[i % CITIES.len()]}).to_string(),
        })
        .collect()
}

impl Exchange {
    pub fn new(
        endpoint: Endpoint,
        req: &Value,
        body_len: usize,
        faults: &super::faults::Faults,
    ) -> Exchange {
        let chunks = faults.chunks;
        let prompt_tokens = faults.prompt_tokens.unwrap_or((body_len as u64 / 4).max(1));
        let model = req
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("mock")
            .to_string();
        // A stream carries usage unless the client explicitly opted out
        // (or, as OpenAI does, only when it asked).
        let asked = req
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool);
        let include_usage = if faults.usage_if_asked {
            asked == Some(true)
        } else {
            asked != Some(false)
        };
        let inputs = match req.get("input") {
            Some(Value::Array(a)) => a.len().max(1),
            _ => 1,
        };
        let tool_calls = tool_calls(endpoint, req, faults.tool_calls);
        // Tool calls come alone unless the text was asked for before them.
        let mut text_pieces = if tool_calls.is_empty() || faults.tool_text {
            chunks
        } else {
            0
        };
        let (word, piece_tokens): (Option<&'static str>, u64) = match faults.piece_bytes {
            Some(n) => (
                std::str::from_utf8(&FILL[..n.min(FILL.len())]).ok(),
                (n as u64 / 4).max(1),
            ),
            None => (None, 1),
        };
        let limit = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
            .iter()
            .find_map(|f| req.get(*f).and_then(Value::as_u64));
        let mut cut_at_limit = false;
        if let (true, Some(limit)) = (faults.obey_limit, limit) {
            let fits = usize::try_from(limit / piece_tokens).unwrap_or(usize::MAX);
            cut_at_limit = fits < text_pieces;
            text_pieces = text_pieces.min(fits);
        }
        Exchange {
            endpoint,
            model,
            prompt_tokens,
            cached_tokens: faults.cached_tokens.min(prompt_tokens),
            cache_write_tokens: faults
                .cache_write_tokens
                .min(prompt_tokens.saturating_sub(faults.cached_tokens)),
            reported_output: faults.completion_tokens,
            pieces: (0..text_pieces)
                .map(|i| word.unwrap_or(WORDS[i % WORDS.len()]))
                .collect(),
            piece_tokens,
            cut_at_limit,
            include_usage,
            inputs,
            tool_calls,
        }
    }

    fn text(&self) -> String {
        self.pieces.concat()
    }

    /// A token per text piece and per streamed piece of arguments, unless
    /// the test set the count to report.
    fn completion_tokens(&self) -> u64 {
        if let Some(n) = self.reported_output {
            return n;
        }
        let args: usize = self.tool_calls.iter().map(|c| c.pieces().len()).sum();
        self.pieces.len() as u64 * self.piece_tokens + args as u64
    }

    /// OpenAI's `finish_reason` / Anthropic's `stop_reason`.
    fn finish(&self) -> (&'static str, &'static str) {
        if self.cut_at_limit {
            ("length", "max_tokens")
        } else if self.tool_calls.is_empty() {
            ("stop", "end_turn")
        } else {
            ("tool_calls", "tool_use")
        }
    }

    /// The chat completion's message: `content` is null when there is
    /// only tool calls.
    fn openai_message(&self) -> Value {
        let mut m = json!({"role": "assistant", "content": self.text()});
        if !self.tool_calls.is_empty() {
            if self.pieces.is_empty() {
                m["content"] = Value::Null;
            }
            m["tool_calls"] = self
                .tool_calls
                .iter()
                .map(|c| {
                    json!({"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
        }
        m
    }

    /// The message's content blocks: the text (when there is any), then a
    /// `tool_use` block per call.
    fn anthropic_content(&self) -> Value {
        let mut blocks = Vec::with_capacity(1 + self.tool_calls.len());
        if !self.pieces.is_empty() || self.tool_calls.is_empty() {
            blocks.push(json!({"type": "text", "text": self.text()}));
        }
        for c in &self.tool_calls {
            blocks
                .push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.input()}));
        }
        Value::Array(blocks)
    }

    fn openai_usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens(),
            "total_tokens": self.prompt_tokens.saturating_add(self.completion_tokens()),
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens, "audio_tokens": 0},
        })
    }

    /// Anthropic's usage: `input_tokens` is the uncached part of the
    /// prompt; cache reads and writes are reported beside it.
    fn anthropic_usage(&self, output_tokens: u64) -> Value {
        json!({
            "input_tokens": self.prompt_tokens.saturating_sub(self.cached_tokens).saturating_sub(self.cache_write_tokens),
            "cache_read_input_tokens": self.cached_tokens,
            "cache_creation_input_tokens": self.cache_write_tokens,
            "output_tokens": output_tokens,
        })
    }

    fn responses_object(&self, status: &str, with_output: bool) -> Value {
        let output = if with_output {
            json!([{
                "type": "message", "id": "msg_mock", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": self.text(), "annotations": []}]
            }])
        } else {
            json!([])
        };
        json!({
            "id": "resp_mock", "object": "response", "created_at": CREATED, "status": status,
            "model": self.model, "output": output,
            "usage": if with_output { json!({
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.completion_tokens(),
                "total_tokens": self.prompt_tokens.saturating_add(self.completion_tokens()),
            }) } else { Value::Null },
        })
    }

    pub fn full_response(&self) -> Value {
        match self.endpoint {
            Endpoint::ChatCompletions => json!({
                "id": "chatcmpl-mock", "object": "chat.completion", "created": CREATED, "model": self.model,
                "choices": [{
                    "index": 0, "message": self.openai_message(),
                    "logprobs": null, "finish_reason": self.finish().0
                }],
                "usage": self.openai_usage(),
            }),
            Endpoint::Completions => json!({
                "id": "cmpl-mock", "object": "text_completion", "created": CREATED, "model": self.model,
                "choices": [{"text": self.text(), "index": 0, "logprobs": null, "finish_reason": "stop"}],
                "usage": self.openai_usage(),
            }),
            Endpoint::Responses => self.responses_object("completed", true),
            Endpoint::Embeddings => json!({
                "object": "list", "model": self.model,
                "data": (0..self.inputs).map(|i| json!({
                    "object": "embedding", "index": i,
                    "embedding": [0.0125, -0.25, 0.5, 0.0, 0.75, -0.125, 0.375, 1.0]
                })).collect::<Vec<_>>(),
                "usage": {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens},
            }),
            Endpoint::Messages => json!({
                "id": "msg_mock", "type": "message", "role": "assistant", "model": self.model,
                "content": self.anthropic_content(),
                "stop_reason": self.finish().1, "stop_sequence": null,
                "usage": self.anthropic_usage(self.completion_tokens()),
            }),
        }
    }

    /// The SSE events of the streamed answer, each ending in a blank line.
    pub fn stream_events(&self) -> Vec<String> {
        let data = |v: Value| format!("data: {v}\n\n");
        let named = |name: &str, v: Value| format!("event: {name}\ndata: {v}\n\n");
        let mut out = Vec::with_capacity(self.pieces.len() + 6);
        match self.endpoint {
            Endpoint::ChatCompletions => {
                let chunk = |delta: Value, finish: Value| {
                    json!({
                        "id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": CREATED,
                        "model": self.model,
                        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]
                    })
                };
                // As OpenAI streams: the role in the first chunk (with the
                // first call when there is no text); each call's id, type
                // and name with empty arguments, then its arguments in
                // pieces, calls one after another.
                if !self.pieces.is_empty() {
                    out.push(data(chunk(
                        json!({"role": "assistant", "content": ""}),
                        Value::Null,
                    )));
                }
                for p in &self.pieces {
                    out.push(data(chunk(json!({"content": p}), Value::Null)));
                }
                for (k, c) in self.tool_calls.iter().enumerate() {
                    let head = json!({"index": k, "id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": ""}});
                    let delta = if k == 0 && self.pieces.is_empty() {
                        json!({"role": "assistant", "content": null, "tool_calls": [head], "refusal": null})
                    } else {
                        json!({"tool_calls": [head]})
                    };
                    out.push(data(chunk(delta, Value::Null)));
                    for p in c.pieces() {
                        out.push(data(chunk(
                            json!({"tool_calls": [{"index": k, "function": {"arguments": p}}]}),
                            Value::Null,
                        )));
                    }
                }
                out.push(data(chunk(json!({}), json!(self.finish().0))));
                if self.include_usage {
                    out.push(data(json!({
                        "id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": CREATED,
                        "model": self.model, "choices": [], "usage": self.openai_usage()
                    })));
                }
                out.push("data: [DONE]\n\n".to_string());
            }
            Endpoint::Completions => {
                let chunk = |text: &str, finish: Value| {
                    json!({
                        "id": "cmpl-mock", "object": "text_completion", "created": CREATED, "model": self.model,
                        "choices": [{"text": text, "index": 0, "logprobs": null, "finish_reason": finish}]
                    })
                };
                for p in &self.pieces {
                    out.push(data(chunk(p, Value::Null)));
                }
                out.push(data(chunk("", json!("stop"))));
                if self.include_usage {
                    out.push(data(json!({
                        "id": "cmpl-mock", "object": "text_completion", "created": CREATED,
                        "model": self.model, "choices": [], "usage": self.openai_usage()
                    })));
                }
                out.push("data: [DONE]\n\n".to_string());
            }
            Endpoint::Responses => {
                let mut seq = 0u64;
                let mut ev = |name: &str, mut v: Value| {
                    v["type"] = json!(name);
                    v["sequence_number"] = json!(seq);
                    seq += 1;
                    named(name, v)
                };
                // As OpenAI streams: the output item and its content part
                // are announced before any text (the openai SDK's
                // `responses.stream()` refuses text for an item it has not
                // seen), and closed after it.
                let text = self.text();
                let part =
                    |text: &str| json!({"type": "output_text", "text": text, "annotations": []});
                let item = |status: &str, content: Value| {
                    json!({"type": "message", "id": "msg_mock", "status": status,
                           "role": "assistant", "content": content})
                };
                let at = json!({"item_id": "msg_mock", "output_index": 0, "content_index": 0});
                let with = |mut v: Value, key: &str, x: Value| {
                    v[key] = x;
                    v
                };
                out.push(ev(
                    "response.created",
                    json!({"response": self.responses_object("in_progress", false)}),
                ));
                out.push(ev(
                    "response.in_progress",
                    json!({"response": self.responses_object("in_progress", false)}),
                ));
                out.push(ev(
                    "response.output_item.added",
                    json!({"output_index": 0, "item": item("in_progress", json!([]))}),
                ));
                out.push(ev(
                    "response.content_part.added",
                    with(at.clone(), "part", part("")),
                ));
                for p in &self.pieces {
                    let delta = with(at.clone(), "delta", json!(p));
                    out.push(ev(
                        "response.output_text.delta",
                        with(delta, "logprobs", json!([])),
                    ));
                }
                out.push(ev(
                    "response.output_text.done",
                    with(with(at.clone(), "text", json!(text)), "logprobs", json!([])),
                ));
                out.push(ev(
                    "response.content_part.done",
                    with(at, "part", part(&text)),
                ));
                out.push(ev(
                    "response.output_item.done",
                    json!({"output_index": 0, "item": item("completed", json!([part(&text)]))}),
                ));
                out.push(ev(
                    "response.completed",
                    json!({"response": self.responses_object("completed", true)}),
                ));
            }
            Endpoint::Messages => {
                out.push(named("message_start", json!({
                    "type": "message_start",
                    "message": {
                        "id": "msg_mock", "type": "message", "role": "assistant", "model": self.model,
                        "content": [], "stop_reason": null, "stop_sequence": null,
                        "usage": self.anthropic_usage(1)
                    }
                })));
                // As Anthropic streams: the text block, then a tool_use
                // block per call (input `{}`, then input_json_delta pieces,
                // the first one empty), a ping after the first block starts.
                let mut index = 0usize;
                if !self.pieces.is_empty() {
                    out.push(named("content_block_start", json!({
                        "type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}
                    })));
                    out.push(named("ping", json!({"type": "ping"})));
                    for p in &self.pieces {
                        out.push(named("content_block_delta", json!({
                            "type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}
                        })));
                    }
                    out.push(named(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": 0}),
                    ));
                    index += 1;
                }
                for c in &self.tool_calls {
                    out.push(named("content_block_start", json!({
                        "type": "content_block_start", "index": index,
                        "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}
                    })));
                    if index == 0 {
                        out.push(named("ping", json!({"type": "ping"})));
                    }
                    for p in std::iter::once("").chain(c.pieces()) {
                        out.push(named(
                            "content_block_delta",
                            json!({
                                "type": "content_block_delta", "index": index,
                                "delta": {"type": "input_json_delta", "partial_json": p}
                            }),
                        ));
                    }
                    out.push(named(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": index}),
                    ));
                    index += 1;
                }
                out.push(named(
                    "message_delta",
                    json!({
                        "type": "message_delta",
                        "delta": {"stop_reason": self.finish().1, "stop_sequence": null},
                        "usage": self.anthropic_usage(self.completion_tokens())
                    }),
                ));
                out.push(named("message_stop", json!({"type": "message_stop"})));
            }
            Endpoint::Embeddings => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::faults::Faults;

    fn chunks(n: usize) -> Faults {
        Faults {
            chunks: n,
            ..Faults::default()
        }
    }

    #[test]
    fn cached_tokens_are_reported_as_each_family_does() {
        let f = Faults {
            chunks: 2,
            prompt_tokens: Some(1000),
            cached_tokens: 600,
            cache_write_tokens: 100,
            ..Faults::default()
        };
        let req = json!({"model": "m", "messages": []});
        let chat = Exchange::new(Endpoint::ChatCompletions, &req, 40, &f).full_response();
        assert_eq!(chat["usage"]["prompt_tokens"], 1000);
        assert_eq!(chat["usage"]["prompt_tokens_details"]["cached_tokens"], 600);
        let msg = Exchange::new(Endpoint::Messages, &req, 40, &f).full_response();
        assert_eq!(msg["usage"]["input_tokens"], 300);
        assert_eq!(msg["usage"]["cache_read_input_tokens"], 600);
        assert_eq!(msg["usage"]["cache_creation_input_tokens"], 100);
        let ev = Exchange::new(Endpoint::Messages, &req, 40, &f).stream_events();
        let delta = ev
            .iter()
            .find(|e| e.starts_with("event: message_delta"))
            .unwrap();
        assert!(delta.contains("\"cache_read_input_tokens\":600"));
    }

    #[test]
    fn chat_stream_ends_with_usage_and_done() {
        let req = json!({"model": "m", "messages": [], "stream": true});
        let ev = Exchange::new(Endpoint::ChatCompletions, &req, 40, &chunks(3)).stream_events();
        assert_eq!(ev.len(), 1 + 3 + 1 + 1 + 1);
        assert!(ev[ev.len() - 2].contains("\"completion_tokens\":3"));
        assert_eq!(ev.last().unwrap(), "data: [DONE]\n\n");
        assert!(ev.iter().all(|e| e.ends_with("\n\n")));
    }

    #[test]
    fn usage_can_be_opted_out() {
        let req = json!({"model": "m", "stream": true, "stream_options": {"include_usage": false}});
        let ev = Exchange::new(Endpoint::ChatCompletions, &req, 40, &chunks(2)).stream_events();
        assert!(!ev.iter().any(|e| e.contains("usage")));
    }

    #[test]
    fn anthropic_stream_reports_output_tokens() {
        let req = json!({"model": "c", "messages": [], "stream": true});
        let ev = Exchange::new(Endpoint::Messages, &req, 400, &chunks(5)).stream_events();
        assert!(ev[0].starts_with("event: message_start\n"));
        assert!(ev[0].contains("\"input_tokens\":100"));
        assert!(ev.iter().any(|e| e.contains("\"output_tokens\":5")));
        assert_eq!(
            ev.last().unwrap(),
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
    }

    fn tools(n: usize, text: bool) -> Faults {
        Faults {
            chunks: 3,
            tool_calls: n,
            tool_text: text,
            ..Faults::default()
        }
    }

    /// `data:` of each event, parsed (`[DONE]` as a string).
    fn data(ev: &[String]) -> Vec<Value> {
        ev.iter()
            .map(|e| {
                let d = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
                serde_json::from_str(d).unwrap_or_else(|_| json!(d))
            })
            .collect()
    }

    #[test]
    fn tool_calls_answer_whole_in_both_families() {
        let req = json!({"model": "m", "messages": [], "tools": [
            {"type": "function", "function": {"name": "get_weather", "parameters": {}}},
            {"type": "function", "function": {"name": "get_time"}}]});
        let c =
            Exchange::new(Endpoint::ChatCompletions, &req, 40, &tools(3, false)).full_response();
        let choice = &c["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], Value::Null);
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        let got: Vec<(&str, &str, Value)> = calls
            .iter()
            .map(|t| {
                assert_eq!(t["type"], "function");
                let args = t["function"]["arguments"].as_str().unwrap();
                (
                    t["id"].as_str().unwrap(),
                    t["function"]["name"].as_str().unwrap(),
                    serde_json::from_str(args).unwrap(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "call_mock_0",
                    "get_weather",
                    json!({"n": 0, "city": "Paris"})
                ),
                ("call_mock_1", "get_time", json!({"n": 1, "city": "Rome"})),
                (
                    "call_mock_2",
                    "get_weather",
                    json!({"n": 2, "city": "Tokyo"})
                ),
            ]
        );

        let req = json!({"model": "c", "messages": [], "tools": [{"name": "lookup", "input_schema": {}}]});
        let m = Exchange::new(Endpoint::Messages, &req, 40, &tools(2, true)).full_response();
        assert_eq!(m["stop_reason"], "tool_use");
        assert_eq!(
            m["content"],
            json!([{"type": "text", "text": "Hello from the"},
                   {"type": "tool_use", "id": "toolu_mock_0", "name": "lookup", "input": {"n": 0, "city": "Paris"}},
                   {"type": "tool_use", "id": "toolu_mock_1", "name": "lookup", "input": {"n": 1, "city": "Rome"}}])
        );
        // No tools in the request: a name of the mock's own.
        let req = json!({"model": "m", "messages": []});
        let c = Exchange::new(Endpoint::ChatCompletions, &req, 40, &tools(1, true)).full_response();
        assert_eq!(c["choices"][0]["message"]["content"], "Hello from the");
        assert_eq!(
            c["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
            "mock_tool"
        );
        // Other endpoints answer text.
        let r = Exchange::new(Endpoint::Responses, &req, 40, &tools(2, false)).full_response();
        assert_eq!(r["output"][0]["content"][0]["text"], "Hello from the");
    }

    #[test]
    fn tool_calls_stream_as_openai_does() {
        let req = json!({"model": "m", "messages": [], "stream": true,
                         "tools": [{"type": "function", "function": {"name": "get_weather"}}]});
        for text in [false, true] {
            let ev =
                Exchange::new(Endpoint::ChatCompletions, &req, 40, &tools(2, text)).stream_events();
            assert!(ev
                .iter()
                .all(|e| e.starts_with("data: ") && e.ends_with("\n\n")));
            let d = data(&ev);
            assert_eq!(d.last().unwrap(), &json!("[DONE]"));
            let usage = &d[d.len() - 2];
            assert_eq!(usage["choices"], json!([]));
            let finish = &d[d.len() - 3]["choices"][0];
            assert_eq!(finish["finish_reason"], "tool_calls");
            assert_eq!(finish["delta"], json!({}));
            let first = &d[0]["choices"][0]["delta"];
            assert_eq!(first["role"], "assistant");
            // What the SDKs accumulate: calls by index, arguments appended.
            let (mut content, mut calls) = (String::new(), Vec::<(String, String, String)>::new());
            let mut argument_deltas = 0;
            for c in &d[..d.len() - 3] {
                let delta = &c["choices"][0]["delta"];
                assert_eq!(c["choices"][0]["finish_reason"], Value::Null);
                content += delta["content"].as_str().unwrap_or("");
                for t in delta["tool_calls"].as_array().into_iter().flatten() {
                    let k = t["index"].as_u64().unwrap() as usize;
                    if let Some(id) = t["id"].as_str() {
                        assert_eq!(k, calls.len(), "calls come in order");
                        assert_eq!(t["type"], "function");
                        assert_eq!(t["function"]["arguments"], "");
                        let name = t["function"]["name"].as_str().unwrap().to_string();
                        calls.push((id.to_string(), name, String::new()));
                    } else {
                        assert_eq!(k + 1, calls.len(), "arguments follow their call's head");
                        assert!(t.get("function").unwrap().get("name").is_none());
                        calls[k].2 += t["function"]["arguments"].as_str().unwrap();
                        argument_deltas += 1;
                    }
                }
            }
            assert_eq!(content, if text { "Hello from the" } else { "" });
            assert!(argument_deltas >= 2 * 3, "{argument_deltas}");
            let calls: Vec<(String, String, Value)> = calls
                .into_iter()
                .map(|(i, n, a)| (i, n, serde_json::from_str(&a).unwrap()))
                .collect();
            assert_eq!(
                calls,
                [
                    (
                        "call_mock_0".into(),
                        "get_weather".into(),
                        json!({"n": 0, "city": "Paris"})
                    ),
                    (
                        "call_mock_1".into(),
                        "get_weather".into(),
                        json!({"n": 1, "city": "Rome"})
                    ),
                ]
            );
            let tokens = usage["usage"]["completion_tokens"].as_u64().unwrap();
            assert_eq!(tokens, argument_deltas + if text { 3 } else { 0 });
        }
    }

    #[test]
    fn tool_calls_stream_as_anthropic_does() {
        let req = json!({"model": "c", "messages": [], "stream": true});
        for text in [false, true] {
            let ev = Exchange::new(Endpoint::Messages, &req, 40, &tools(2, text)).stream_events();
            let names: Vec<&str> = ev
                .iter()
                .map(|e| e.lines().next().unwrap().strip_prefix("event: ").unwrap())
                .collect();
            let d = data(&ev);
            for (n, v) in names.iter().zip(&d) {
                assert_eq!(v["type"], *n);
            }
            assert_eq!(names[0], "message_start");
            assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
            assert_eq!(d[d.len() - 2]["delta"]["stop_reason"], "tool_use");
            // Blocks open and close one at a time, indexes in order;
            // each tool_use block starts with input {} and is fed pieces.
            let (mut open, mut blocks) = (None::<u64>, Vec::<Value>::new());
            let mut argument_deltas = 0;
            for v in &d {
                match v["type"].as_str().unwrap() {
                    "content_block_start" => {
                        assert_eq!(open, None);
                        let i = v["index"].as_u64().unwrap();
                        assert_eq!(i as usize, blocks.len());
                        open = Some(i);
                        let mut b = v["content_block"].clone();
                        if b["type"] == "tool_use" {
                            assert_eq!(b["input"], json!({}));
                            b["partial"] = json!("");
                        }
                        blocks.push(b);
                    }
                    "content_block_delta" => {
                        let i = v["index"].as_u64().unwrap();
                        assert_eq!(open, Some(i));
                        let b = &mut blocks[i as usize];
                        match v["delta"]["type"].as_str().unwrap() {
                            "text_delta" => {
                                let t = b["text"].as_str().unwrap().to_string();
                                b["text"] = json!(t + v["delta"]["text"].as_str().unwrap());
                            }
                            "input_json_delta" => {
                                let p = b["partial"].as_str().unwrap().to_string();
                                let piece = v["delta"]["partial_json"].as_str().unwrap();
                                argument_deltas += usize::from(!piece.is_empty());
                                b["partial"] = json!(p + piece);
                            }
                            other => panic!("{other}"),
                        }
                    }
                    "content_block_stop" => {
                        assert_eq!(open.take(), v["index"].as_u64());
                    }
                    _ => {}
                }
            }
            let got: Vec<Value> = blocks
                .into_iter()
                .map(|mut b| {
                    if let Some(p) = b.as_object_mut().unwrap().remove("partial") {
                        b["input"] = serde_json::from_str(p.as_str().unwrap()).unwrap();
                    }
                    b
                })
                .collect();
            let mut want = vec![
                json!({"type": "tool_use", "id": "toolu_mock_0", "name": "mock_tool", "input": {"n": 0, "city": "Paris"}}),
                json!({"type": "tool_use", "id": "toolu_mock_1", "name": "mock_tool", "input": {"n": 1, "city": "Rome"}}),
            ];
            if text {
                want.insert(0, json!({"type": "text", "text": "Hello from the"}));
            }
            assert_eq!(got, want);
            assert!(argument_deltas >= 2 * 3, "{argument_deltas}");
            assert_eq!(
                d[d.len() - 2]["usage"]["output_tokens"],
                argument_deltas + if text { 3 } else { 0 }
            );
        }
    }
}
