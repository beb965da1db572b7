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
    pieces: Vec<&'static str>,
    include_usage: bool,
    inputs: usize,
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
        // A stream carries usage unless the client explicitly opted out.
        let include_usage = req
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            != Some(false);
        let inputs = match req.get("input") {
            Some(Value::Array(a)) => a.len().max(1),
            _ => 1,
        };
        Exchange {
            endpoint,
            model,
            prompt_tokens,
            cached_tokens: faults.cached_tokens.min(prompt_tokens),
            cache_write_tokens: faults
                .cache_write_tokens
                .min(prompt_tokens.saturating_sub(faults.cached_tokens)),
            pieces: (0..chunks).map(|i| WORDS[i % WORDS.len()]).collect(),
            include_usage,
            inputs,
        }
    }

    fn text(&self) -> String {
        self.pieces.concat()
    }

    fn completion_tokens(&self) -> u64 {
        self.pieces.len() as u64
    }

    fn openai_usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens(),
            "total_tokens": self.prompt_tokens + self.completion_tokens(),
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens, "audio_tokens": 0},
        })
    }

    /// Anthropic's usage: `input_tokens` is the uncached part of the
    /// prompt; cache reads and writes are reported beside it.
    fn anthropic_usage(&self, output_tokens: u64) -> Value {
        json!({
            "input_tokens": self.prompt_tokens - self.cached_tokens - self.cache_write_tokens,
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
                "total_tokens": self.prompt_tokens + self.completion_tokens(),
            }) } else { Value::Null },
        })
    }

    pub fn full_response(&self) -> Value {
        match self.endpoint {
            Endpoint::ChatCompletions => json!({
                "id": "chatcmpl-mock", "object": "chat.completion", "created": CREATED, "model": self.model,
                "choices": [{
                    "index": 0, "message": {"role": "assistant", "content": self.text()},
                    "logprobs": null, "finish_reason": "stop"
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
                "content": [{"type": "text", "text": self.text()}],
                "stop_reason": "end_turn", "stop_sequence": null,
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
                out.push(data(chunk(
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                )));
                for p in &self.pieces {
                    out.push(data(chunk(json!({"content": p}), Value::Null)));
                }
                out.push(data(chunk(json!({}), json!("stop"))));
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
                out.push(ev(
                    "response.created",
                    json!({"response": self.responses_object("in_progress", false)}),
                ));
                for p in &self.pieces {
                    out.push(ev(
                        "response.output_text.delta",
                        json!({"item_id": "msg_mock", "output_index": 0, "content_index": 0, "delta": p}),
                    ));
                }
                out.push(ev(
                    "response.output_text.done",
                    json!({"item_id": "msg_mock", "output_index": 0, "content_index": 0, "text": self.text()}),
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
                out.push(named(
                    "message_delta",
                    json!({
                        "type": "message_delta",
                        "delta": {"stop_reason": "end_turn", "stop_sequence": null},
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
}
