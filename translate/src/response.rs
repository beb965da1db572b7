//! Non-streamed answers: an OpenAI `chat.completion` <-> an Anthropic
//! `message`. Content, tool calls (ids kept, `arguments` string <->
//! `input` object), the stop reason table (in the crate root), usage with
//! cached tokens, id and model.
//!
//! Usage: OpenAI's `prompt_tokens` counts every prompt token, cached or
//! not, with `prompt_tokens_details.cached_tokens` the part read from the
//! cache; Anthropic's `input_tokens` counts only the uncached part, with
//! `cache_read_input_tokens` and `cache_creation_input_tokens` beside it.
//! So OpenAI -> Anthropic: `input_tokens = prompt - cached`,
//! `cache_read = cached`, `cache_creation = 0`; Anthropic -> OpenAI:
//! `prompt = input + cache_read + cache_creation`, `cached = cache_read`.
//!
//! A provider's answer the agent's family cannot express (more than one
//! choice, a thinking block, arguments that are not a JSON object) is an
//! [`Untranslatable`] naming the field: the gateway answers it as an
//! upstream error, never passes a half translation.

use crate::{finish_reason, request::tool_arguments, stop_reason, strict, Reason, Untranslatable};
use crate::{Family, R};
use serde_json::{json, Map, Value};

fn bad<T>(field: &str) -> R<T> {
    Err(Untranslatable::new(field, Reason::Malformed))
}

/// Token counts, in one family-neutral form.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Uncached prompt tokens (Anthropic's `input_tokens`).
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_creation: u64,
}

impl Usage {
    pub fn from_openai(u: &Value) -> Usage {
        let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
        let prompt = n(u.get("prompt_tokens"));
        let cached = n(u
            .get("prompt_tokens_details")
            .and_then(|d| d.get("cached_tokens")));
        Usage {
            input: prompt.saturating_sub(cached),
            output: n(u.get("completion_tokens")),
            cache_read: cached.min(prompt),
            cache_creation: 0,
        }
    }

    /// Anthropic's usage object; fields it leaves out keep `self`'s value
    /// (a stream's `message_delta` may carry only `output_tokens`).
    pub fn update_from_anthropic(&mut self, u: &Value) {
        let set = |slot: &mut u64, k: &str| {
            if let Some(n) = u.get(k).and_then(Value::as_u64) {
                *slot = n;
            }
        };
        set(&mut self.input, "input_tokens");
        set(&mut self.output, "output_tokens");
        set(&mut self.cache_read, "cache_read_input_tokens");
        set(&mut self.cache_creation, "cache_creation_input_tokens");
    }

    pub fn from_anthropic(u: &Value) -> Usage {
        let mut usage = Usage::default();
        usage.update_from_anthropic(u);
        usage
    }

    pub fn prompt(&self) -> u64 {
        self.input
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_creation)
    }

    pub fn to_openai(&self) -> Value {
        let prompt = self.prompt();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": self.output,
            "total_tokens": prompt.saturating_add(self.output),
            "prompt_tokens_details": {"cached_tokens": self.cache_read},
        })
    }

    pub fn to_anthropic(&self) -> Value {
        json!({
            "input_tokens": self.input,
            "output_tokens": self.output,
            "cache_read_input_tokens": self.cache_read,
            "cache_creation_input_tokens": self.cache_creation,
        })
    }
}

/// Translate a provider's 2xx answer body (in `upstream`'s family) into
/// the other family. `created` (Unix seconds) stamps an OpenAI answer made
/// from an Anthropic one, which carries no time.
pub fn translate(upstream: Family, body: &[u8], created: u64) -> R<Vec<u8>> {
    let v = match strict::parse(body) {
        Ok(v) => v,
        Err(_) => return bad("body"),
    };
    let out = match upstream {
        Family::OpenAi => openai_to_anthropic(&v)?,
        Family::Anthropic => anthropic_to_openai(&v, created)?,
    };
    serde_json::to_vec(&out).or_else(|_| bad("body"))
}

fn str_field<'a>(o: &'a Value, k: &str) -> R<&'a str> {
    match o.get(k).and_then(Value::as_str) {
        Some(s) => Ok(s),
        None => bad(k),
    }
}

/// An OpenAI `chat.completion` as an Anthropic `message`.
pub fn openai_to_anthropic(resp: &Value) -> R<Value> {
    let id = str_field(resp, "id")?;
    let model = str_field(resp, "model")?;
    let choice = match resp.get("choices").and_then(Value::as_array) {
        Some(c) if c.len() == 1 => c.first().unwrap_or(&Value::Null),
        _ => return bad("choices"),
    };
    let msg = match choice.get("message") {
        Some(m @ Value::Object(_)) => m,
        _ => return bad("choices[0].message"),
    };
    let mut content = Vec::new();
    match msg.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            if !s.is_empty() {
                content.push(json!({"type": "text", "text": s}));
            }
        }
        Some(_) => return bad("choices[0].message.content"),
    }
    let mut refused = false;
    match msg.get("refusal") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            refused = true;
            content.push(json!({"type": "text", "text": s}));
        }
        Some(_) => return bad("choices[0].message.refusal"),
    }
    for k in ["audio", "function_call"] {
        if msg.get(k).is_some_and(|v| !v.is_null()) {
            return Err(Untranslatable::new(
                format!("choices[0].message.{k}"),
                Reason::NoEquivalent,
            ));
        }
    }
    if msg
        .get("annotations")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        return Err(Untranslatable::new(
            "choices[0].message.annotations",
            Reason::NoEquivalent,
        ));
    }
    if let Some(calls) = msg.get("tool_calls").filter(|c| !c.is_null()) {
        let Some(calls) = calls.as_array() else {
            return bad("choices[0].message.tool_calls");
        };
        for (j, c) in calls.iter().enumerate() {
            let p = format!("choices[0].message.tool_calls[{j}]");
            let (Some(id), Some(f)) = (c.get("id").and_then(Value::as_str), c.get("function"))
            else {
                return bad(&p);
            };
            let (Some(name), Some(args)) = (
                f.get("name").and_then(Value::as_str),
                f.get("arguments").and_then(Value::as_str),
            ) else {
                return bad(&format!("{p}.function"));
            };
            let input = tool_arguments(args, &format!("{p}.function.arguments"))?;
            content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
        }
    }
    let stop = match choice.get("finish_reason").and_then(Value::as_str) {
        _ if refused => "refusal",
        Some(f) => match stop_reason(f) {
            Some(s) => s,
            None => return bad("choices[0].finish_reason"),
        },
        None => return bad("choices[0].finish_reason"),
    };
    let usage = resp
        .get("usage")
        .map(Usage::from_openai)
        .unwrap_or_default();
    Ok(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": usage.to_anthropic(),
    }))
}

/// An Anthropic `message` as an OpenAI `chat.completion`.
pub fn anthropic_to_openai(resp: &Value, created: u64) -> R<Value> {
    let id = str_field(resp, "id")?;
    let model = str_field(resp, "model")?;
    let Some(blocks) = resp.get("content").and_then(Value::as_array) else {
        return bad("content");
    };
    let mut text: Option<String> = None;
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => {
                let Some(t) = b.get("text").and_then(Value::as_str) else {
                    return bad(&format!("content[{j}].text"));
                };
                text.get_or_insert_with(String::new).push_str(t);
            }
            Some("tool_use") => {
                let (Some(cid), Some(name), Some(input @ Value::Object(_))) = (
                    b.get("id").and_then(Value::as_str),
                    b.get("name").and_then(Value::as_str),
                    b.get("input"),
                ) else {
                    return bad(&format!("content[{j}]"));
                };
                let args = serde_json::to_string(input).or_else(|_| bad("input"))?;
                calls.push(json!({"id": cid, "type": "function",
                                  "function": {"name": name, "arguments": args}}));
            }
            _ => {
                return Err(Untranslatable::new(
                    format!("content[{j}].type"),
                    Reason::NoEquivalent,
                ))
            }
        }
    }
    let finish = match resp.get("stop_reason").and_then(Value::as_str) {
        Some(s) => match finish_reason(s) {
            Some(f) => f,
            None => return bad("stop_reason"),
        },
        None => return bad("stop_reason"),
    };
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    message.insert("content".into(), text.map_or(Value::Null, Value::String));
    message.insert("refusal".into(), Value::Null);
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    let usage = resp
        .get("usage")
        .map(Usage::from_anthropic)
        .unwrap_or_default();
    Ok(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
        "usage": usage.to_openai(),
    }))
}
