//! Request bodies: OpenAI chat completions <-> Anthropic Messages.
//!
//! Each direction walks the agent's body once against an allow-list of the
//! fields its family defines: each is translated, accepted as a no-op where
//! its value means "default" (`n: 1`, `logprobs: false`, `thinking:
//! {type: disabled}`, ...), or refused with the field's path. An unknown
//! field is refused too: a field the translator does not know is a field
//! it would drop.

use crate::{at, strict, Family, Reason, Untranslatable, R};
use serde_json::{json, Map, Value};

fn refuse<T>(field: impl Into<String>, reason: Reason) -> R<T> {
    Err(Untranslatable::new(field, reason))
}

/// How a request is translated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// `max_tokens` for Anthropic when the OpenAI request sets no output
    /// limit (Anthropic requires one).
    pub default_max_tokens: u64,
    /// Which field carries the output limit for an OpenAI target
    /// (`max_tokens`, or `max_completion_tokens` for reasoning models).
    pub openai_max_tokens_field: MaxTokensField,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            default_max_tokens: 4096,
            openai_max_tokens_field: MaxTokensField::MaxTokens,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxTokensField {
    MaxTokens,
    MaxCompletionTokens,
}

/// A translated request and what its answer's translation needs to know.
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    pub body: Value,
    /// The agent asked for a stream.
    pub stream: bool,
    /// An OpenAI agent's `stream_options.include_usage`: its stream ends
    /// with a usage chunk (choices empty) only when it asked for one.
    pub usage_chunk: bool,
}

/// Translate a request body (bytes, parsed strictly) from `from` to the
/// other family.
pub fn translate(from: Family, body: &[u8], opts: &Options) -> R<Translated> {
    let v = strict::parse(body).or_else(|e| {
        refuse(
            "body",
            if e.is_data() {
                Reason::Duplicate
            } else {
                Reason::Malformed
            },
        )
    })?;
    match from {
        Family::OpenAi => openai_to_anthropic(&v, opts),
        Family::Anthropic => anthropic_to_openai(&v, opts),
    }
}

// ----- small readers --------------------------------------------------

fn obj<'a>(v: &'a Value, field: &str) -> R<&'a Map<String, Value>> {
    match v.as_object() {
        Some(o) => Ok(o),
        None => refuse(field, Reason::Malformed),
    }
}

fn arr<'a>(v: &'a Value, field: &str) -> R<&'a Vec<Value>> {
    match v.as_array() {
        Some(a) => Ok(a),
        None => refuse(field, Reason::Malformed),
    }
}

fn string<'a>(v: &'a Value, field: &str) -> R<&'a str> {
    match v.as_str() {
        Some(s) => Ok(s),
        None => refuse(field, Reason::Malformed),
    }
}

fn boolean(v: &Value, field: &str) -> R<bool> {
    match v.as_bool() {
        Some(b) => Ok(b),
        None => refuse(field, Reason::Malformed),
    }
}

fn number(v: &Value, field: &str) -> R<Value> {
    if v.is_number() {
        Ok(v.clone())
    } else {
        refuse(field, Reason::Malformed)
    }
}

fn positive_int(v: &Value, field: &str) -> R<u64> {
    match v.as_u64() {
        Some(n) if n > 0 => Ok(n),
        _ => refuse(field, Reason::Malformed),
    }
}

/// Every key of `o` must be in `allowed`.
fn only(o: &Map<String, Value>, allowed: &[&str], parent: &str) -> R<()> {
    for k in o.keys() {
        if !allowed.contains(&k.as_str()) {
            return refuse(at(parent, k), Reason::Unknown);
        }
    }
    Ok(())
}

/// A field that must be absent or null (no equivalent in the target).
fn must_be_null(v: &Value, field: &str) -> R<()> {
    if v.is_null() {
        Ok(())
    } else {
        refuse(field, Reason::NoEquivalent)
    }
}

/// Anthropic's image media types.
const IMAGE_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

// ----- OpenAI -> Anthropic --------------------------------------------

/// An OpenAI chat completions request as an Anthropic Messages request.
pub fn openai_to_anthropic(req: &Value, opts: &Options) -> R<Translated> {
    let o = obj(req, "body")?;
    let mut out = Map::new();
    let mut max_tokens: Option<u64> = None;
    let mut stream = false;
    let mut usage_chunk = false;
    let mut tool_choice: Option<Value> = None;
    let mut parallel: Option<bool> = None;
    for (k, v) in o {
        let k = k.as_str();
        match k {
            "model" => {
                out.insert("model".into(), Value::String(string(v, k)?.to_owned()));
            }
            "messages" => {
                let (system, messages) = openai_messages(arr(v, k)?)?;
                if let Some(s) = system {
                    out.insert("system".into(), s);
                }
                out.insert("messages".into(), Value::Array(messages));
            }
            "max_tokens" | "max_completion_tokens" => {
                if v.is_null() {
                    continue;
                }
                if max_tokens.is_some() {
                    return refuse(k, Reason::Duplicate);
                }
                max_tokens = Some(positive_int(v, k)?);
            }
            "temperature" => {
                if v.is_null() {
                    continue;
                }
                // OpenAI's range is 0-2, Anthropic's 0-1: the same number
                // above 1 has no Anthropic reading.
                match v.as_f64() {
                    Some(t) if (0.0..=1.0).contains(&t) => {
                        out.insert(k.into(), v.clone());
                    }
                    Some(_) => return refuse(k, Reason::OutOfRange),
                    None => return refuse(k, Reason::Malformed),
                }
            }
            "top_p" => {
                if !v.is_null() {
                    out.insert(k.into(), number(v, k)?);
                }
            }
            "stop" => match v {
                Value::Null => {}
                Value::String(s) => {
                    out.insert("stop_sequences".into(), json!([s]));
                }
                Value::Array(a) => {
                    for (i, s) in a.iter().enumerate() {
                        string(s, &format!("stop[{i}]"))?;
                    }
                    out.insert("stop_sequences".into(), v.clone());
                }
                _ => return refuse(k, Reason::Malformed),
            },
            "stream" => {
                if !v.is_null() {
                    stream = boolean(v, k)?;
                    out.insert("stream".into(), Value::Bool(stream));
                }
            }
            "stream_options" => {
                if v.is_null() {
                    continue;
                }
                let so = obj(v, k)?;
                only(so, &["include_usage"], k)?;
                if let Some(u) = so.get("include_usage") {
                    if !u.is_null() {
                        usage_chunk = boolean(u, "stream_options.include_usage")?;
                    }
                }
            }
            "tools" => {
                if v.is_null() {
                    continue;
                }
                let tools = arr(v, k)?
                    .iter()
                    .enumerate()
                    .map(|(i, t)| openai_tool(t, &format!("tools[{i}]")))
                    .collect::<R<Vec<_>>>()?;
                out.insert("tools".into(), Value::Array(tools));
            }
            "tool_choice" => {
                if !v.is_null() {
                    tool_choice = Some(openai_tool_choice(v)?);
                }
            }
            "parallel_tool_calls" => {
                if !v.is_null() {
                    parallel = Some(boolean(v, k)?);
                }
            }
            "user" => {
                if !v.is_null() {
                    out.insert(
                        "metadata".into(),
                        json!({"user_id": string(v, k)?.to_owned()}),
                    );
                }
            }
            "n" => match v {
                Value::Null => {}
                v if v.as_u64() == Some(1) => {}
                _ => return refuse(k, Reason::NoEquivalent),
            },
            "logprobs" | "store" => match v {
                Value::Null | Value::Bool(false) => {}
                _ => return refuse(k, Reason::NoEquivalent),
            },
            "presence_penalty" | "frequency_penalty" => match v.as_f64() {
                _ if v.is_null() => {}
                Some(0.0) => {}
                _ => return refuse(k, Reason::NoEquivalent),
            },
            "response_format" => {
                if v.is_null() {
                    continue;
                }
                let rf = obj(v, k)?;
                if rf.len() != 1 || rf.get("type").and_then(Value::as_str) != Some("text") {
                    return refuse(k, Reason::NoEquivalent);
                }
            }
            "modalities" => match v {
                Value::Null => {}
                Value::Array(a) if a.iter().all(|m| m.as_str() == Some("text")) => {}
                _ => return refuse(k, Reason::NoEquivalent),
            },
            "logit_bias" => match v {
                Value::Null => {}
                Value::Object(m) if m.is_empty() => {}
                _ => return refuse(k, Reason::NoEquivalent),
            },
            "top_logprobs" | "seed" | "audio" | "prediction" | "reasoning_effort"
            | "web_search_options" | "functions" | "function_call" | "metadata"
            | "service_tier" | "verbosity" | "prompt_cache_key" | "safety_identifier" => {
                must_be_null(v, k)?
            }
            _ => return refuse(at("", k), Reason::Unknown),
        }
    }
    if !out.contains_key("model") {
        return refuse("model", Reason::Missing);
    }
    if !out.contains_key("messages") {
        return refuse("messages", Reason::Missing);
    }
    out.insert(
        "max_tokens".into(),
        Value::from(max_tokens.unwrap_or(opts.default_max_tokens)),
    );
    match (tool_choice, parallel) {
        (Some(mut tc), Some(false)) => {
            if tc.get("type").and_then(Value::as_str) != Some("none") {
                if let Some(m) = tc.as_object_mut() {
                    m.insert("disable_parallel_tool_use".into(), Value::Bool(true));
                }
            }
            out.insert("tool_choice".into(), tc);
        }
        (Some(tc), _) => {
            out.insert("tool_choice".into(), tc);
        }
        (None, Some(false)) if out.contains_key("tools") => {
            out.insert(
                "tool_choice".into(),
                json!({"type": "auto", "disable_parallel_tool_use": true}),
            );
        }
        (None, _) => {}
    }
    if !stream && usage_chunk {
        return refuse("stream_options", Reason::Order);
    }
    Ok(Translated {
        body: Value::Object(out),
        stream,
        usage_chunk,
    })
}

fn openai_tool(t: &Value, p: &str) -> R<Value> {
    let o = obj(t, p)?;
    if o.get("type").and_then(Value::as_str) != Some("function") {
        return refuse(format!("{p}.type"), Reason::NoEquivalent);
    }
    only(o, &["type", "function"], p)?;
    let fp = format!("{p}.function");
    let f = obj(o.get("function").unwrap_or(&Value::Null), &fp)?;
    only(f, &["name", "description", "parameters", "strict"], &fp)?;
    let name = string(f.get("name").unwrap_or(&Value::Null), &format!("{fp}.name"))?;
    let mut out = Map::new();
    out.insert("name".into(), Value::String(name.to_owned()));
    if let Some(d) = f.get("description").filter(|d| !d.is_null()) {
        out.insert(
            "description".into(),
            Value::String(string(d, &format!("{fp}.description"))?.to_owned()),
        );
    }
    let schema = match f.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(s) => Value::Object(obj(s, &format!("{fp}.parameters"))?.clone()),
    };
    out.insert("input_schema".into(), schema);
    match f.get("strict") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(_) => return refuse(format!("{fp}.strict"), Reason::NoEquivalent),
    }
    Ok(Value::Object(out))
}

fn openai_tool_choice(v: &Value) -> R<Value> {
    const P: &str = "tool_choice";
    match v {
        Value::String(s) => match s.as_str() {
            "auto" => Ok(json!({"type": "auto"})),
            "none" => Ok(json!({"type": "none"})),
            "required" => Ok(json!({"type": "any"})),
            _ => refuse(P, Reason::OutOfRange),
        },
        Value::Object(o) => {
            only(o, &["type", "function"], P)?;
            if o.get("type").and_then(Value::as_str) != Some("function") {
                return refuse("tool_choice.type", Reason::NoEquivalent);
            }
            let f = obj(
                o.get("function").unwrap_or(&Value::Null),
                "tool_choice.function",
            )?;
            only(f, &["name"], "tool_choice.function")?;
            let name = string(
                f.get("name").unwrap_or(&Value::Null),
                "tool_choice.function.name",
            )?;
            Ok(json!({"type": "tool", "name": name}))
        }
        _ => refuse(P, Reason::Malformed),
    }
}

/// OpenAI messages -> (Anthropic `system`, Anthropic `messages`).
fn openai_messages(msgs: &[Value]) -> R<(Option<Value>, Vec<Value>)> {
    let mut system: Vec<Value> = Vec::new();
    let mut system_string: Option<String> = None;
    let mut system_count = 0usize;
    let mut out: Vec<Value> = Vec::with_capacity(msgs.len());
    // Whether the last message out holds tool results (consecutive `tool`
    // messages, the answers to parallel calls, become one user turn).
    let mut last_is_results = false;
    for (i, m) in msgs.iter().enumerate() {
        let p = format!("messages[{i}]");
        let mo = obj(m, &p)?;
        let role = string(mo.get("role").unwrap_or(&Value::Null), &format!("{p}.role"))?;
        match role {
            "system" | "developer" => {
                if !out.is_empty() {
                    // Anthropic's system prompt comes before the conversation.
                    return refuse(format!("{p}.role"), Reason::Order);
                }
                only(mo, &["role", "content"], &p)?;
                system_count += 1;
                let cp = format!("{p}.content");
                match mo.get("content").unwrap_or(&Value::Null) {
                    Value::String(s) => {
                        system_string = Some(s.clone());
                        system.push(json!({"type": "text", "text": s}));
                    }
                    Value::Array(parts) => {
                        system_string = None;
                        for (j, part) in parts.iter().enumerate() {
                            system.push(openai_text_part(part, &format!("{cp}[{j}]"))?);
                        }
                    }
                    _ => return refuse(cp, Reason::Malformed),
                }
                last_is_results = false;
            }
            "user" => {
                only(mo, &["role", "content"], &p)?;
                let cp = format!("{p}.content");
                let content = match mo.get("content").unwrap_or(&Value::Null) {
                    Value::String(s) => Value::String(s.clone()),
                    Value::Array(parts) => Value::Array(
                        parts
                            .iter()
                            .enumerate()
                            .map(|(j, part)| openai_user_part(part, &format!("{cp}[{j}]")))
                            .collect::<R<Vec<_>>>()?,
                    ),
                    _ => return refuse(cp, Reason::Malformed),
                };
                // Words after tool results join their turn (Anthropic puts
                // the results first in the user turn that follows a call).
                let joined = if last_is_results {
                    let blocks = match content {
                        Value::String(s) => vec![json!({"type": "text", "text": s})],
                        Value::Array(b) => b,
                        other => vec![other],
                    };
                    out.last_mut()
                        .and_then(|m| m.get_mut("content"))
                        .and_then(Value::as_array_mut)
                        .map(|c| c.extend(blocks))
                        .is_some()
                } else {
                    out.push(json!({"role": "user", "content": content}));
                    true
                };
                if !joined {
                    return refuse(cp, Reason::Order);
                }
                last_is_results = false;
            }
            "assistant" => {
                only(
                    mo,
                    &[
                        "role",
                        "content",
                        "tool_calls",
                        "refusal",
                        "audio",
                        "function_call",
                    ],
                    &p,
                )?;
                for k in ["refusal", "audio", "function_call"] {
                    if let Some(v) = mo.get(k) {
                        must_be_null(v, &format!("{p}.{k}"))?;
                    }
                }
                out.push(openai_assistant(mo, &p)?);
                last_is_results = false;
            }
            "tool" => {
                only(mo, &["role", "content", "tool_call_id"], &p)?;
                let id = string(
                    mo.get("tool_call_id").unwrap_or(&Value::Null),
                    &format!("{p}.tool_call_id"),
                )?;
                let cp = format!("{p}.content");
                let content = match mo.get("content").unwrap_or(&Value::Null) {
                    Value::String(s) => Value::String(s.clone()),
                    Value::Array(parts) => Value::Array(
                        parts
                            .iter()
                            .enumerate()
                            .map(|(j, part)| openai_text_part(part, &format!("{cp}[{j}]")))
                            .collect::<R<Vec<_>>>()?,
                    ),
                    _ => return refuse(cp, Reason::Malformed),
                };
                let block = json!({"type": "tool_result", "tool_use_id": id, "content": content});
                let merged = if last_is_results {
                    out.last_mut()
                        .and_then(|m| m.get_mut("content"))
                        .and_then(Value::as_array_mut)
                        .map(|c| c.push(block.clone()))
                        .is_some()
                } else {
                    false
                };
                if !merged {
                    out.push(json!({"role": "user", "content": [block]}));
                }
                last_is_results = true;
            }
            _ => return refuse(format!("{p}.role"), Reason::NoEquivalent),
        }
    }
    let system = match (system_count, system_string) {
        (0, _) => None,
        (1, Some(s)) => Some(Value::String(s)),
        _ => Some(Value::Array(system)),
    };
    Ok((system, out))
}

/// A text part (system, assistant and tool content admit only text).
fn openai_text_part(part: &Value, p: &str) -> R<Value> {
    let o = obj(part, p)?;
    match o.get("type").and_then(Value::as_str) {
        Some("text") => {
            only(o, &["type", "text"], p)?;
            let t = string(o.get("text").unwrap_or(&Value::Null), &format!("{p}.text"))?;
            Ok(json!({"type": "text", "text": t}))
        }
        Some(_) => refuse(format!("{p}.type"), Reason::NoEquivalent),
        None => refuse(format!("{p}.type"), Reason::Missing),
    }
}

fn openai_user_part(part: &Value, p: &str) -> R<Value> {
    let o = obj(part, p)?;
    match o.get("type").and_then(Value::as_str) {
        Some("image_url") => {
            only(o, &["type", "image_url"], p)?;
            let ip = format!("{p}.image_url");
            let img = obj(o.get("image_url").unwrap_or(&Value::Null), &ip)?;
            only(img, &["url", "detail"], &ip)?;
            match img.get("detail") {
                None | Some(Value::Null) => {}
                Some(d) if d.as_str() == Some("auto") => {}
                // Anthropic has no resolution hint.
                Some(_) => return refuse(format!("{ip}.detail"), Reason::NoEquivalent),
            }
            let up = format!("{ip}.url");
            let url = string(img.get("url").unwrap_or(&Value::Null), &up)?;
            Ok(json!({"type": "image", "source": image_source(url, &up)?}))
        }
        _ => openai_text_part(part, p),
    }
}

/// An OpenAI image URL as an Anthropic image source: a base64 data URL
/// of one of Anthropic's media types, or an http(s) URL.
fn image_source(url: &str, p: &str) -> R<Value> {
    if let Some(rest) = url.strip_prefix("data:") {
        let Some((media, data)) = rest.split_once(";base64,") else {
            return refuse(p, Reason::OutOfRange);
        };
        if !IMAGE_TYPES.contains(&media) {
            return refuse(p, Reason::OutOfRange);
        }
        return Ok(json!({"type": "base64", "media_type": media, "data": data}));
    }
    if url.starts_with("https://") || url.starts_with("http://") {
        return Ok(json!({"type": "url", "url": url}));
    }
    refuse(p, Reason::OutOfRange)
}

fn openai_assistant(mo: &Map<String, Value>, p: &str) -> R<Value> {
    let cp = format!("{p}.content");
    let calls = match mo.get("tool_calls") {
        None | Some(Value::Null) => None,
        Some(v) => Some(arr(v, &format!("{p}.tool_calls"))?),
    };
    let mut blocks: Vec<Value> = Vec::new();
    let content = mo.get("content").unwrap_or(&Value::Null);
    match content {
        Value::Null => {}
        Value::String(s) => {
            if calls.is_none() {
                return Ok(json!({"role": "assistant", "content": s}));
            }
            if !s.is_empty() {
                blocks.push(json!({"type": "text", "text": s}));
            }
        }
        Value::Array(parts) => {
            for (j, part) in parts.iter().enumerate() {
                blocks.push(openai_text_part(part, &format!("{cp}[{j}]"))?);
            }
        }
        _ => return refuse(cp, Reason::Malformed),
    }
    if let Some(calls) = calls {
        for (j, c) in calls.iter().enumerate() {
            let tp = format!("{p}.tool_calls[{j}]");
            let co = obj(c, &tp)?;
            only(co, &["id", "type", "function"], &tp)?;
            if co.get("type").and_then(Value::as_str) != Some("function") {
                return refuse(format!("{tp}.type"), Reason::NoEquivalent);
            }
            let id = string(co.get("id").unwrap_or(&Value::Null), &format!("{tp}.id"))?;
            let fp = format!("{tp}.function");
            let f = obj(co.get("function").unwrap_or(&Value::Null), &fp)?;
            only(f, &["name", "arguments"], &fp)?;
            let name = string(f.get("name").unwrap_or(&Value::Null), &format!("{fp}.name"))?;
            let ap = format!("{fp}.arguments");
            let args = string(f.get("arguments").unwrap_or(&Value::Null), &ap)?;
            let input = tool_arguments(args, &ap)?;
            blocks.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
        }
    } else if content.is_null() {
        return refuse(cp, Reason::Missing);
    }
    Ok(json!({"role": "assistant", "content": blocks}))
}

/// A tool call's `arguments` (a JSON string) as Anthropic's `input` (an
/// object), parsed strictly.
pub(crate) fn tool_arguments(args: &str, p: &str) -> R<Value> {
    // OpenAI models sometimes send "" for a call without arguments.
    if args.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    match strict::parse_str(args) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => refuse(p, Reason::Malformed),
        Err(e) if e.is_data() => refuse(p, Reason::Duplicate),
        Err(_) => refuse(p, Reason::Malformed),
    }
}

// ----- Anthropic -> OpenAI --------------------------------------------

/// An Anthropic Messages request as an OpenAI chat completions request.
pub fn anthropic_to_openai(req: &Value, opts: &Options) -> R<Translated> {
    let o = obj(req, "body")?;
    let mut out = Map::new();
    let mut stream = false;
    let mut system: Option<Value> = None;
    let mut messages: Option<Vec<Value>> = None;
    let mut tools_given = false;
    for (k, v) in o {
        let k = k.as_str();
        match k {
            "model" => {
                out.insert("model".into(), Value::String(string(v, k)?.to_owned()));
            }
            "messages" => messages = Some(anthropic_messages(arr(v, k)?)?),
            "system" => system = anthropic_system(v)?,
            "max_tokens" => {
                let field = match opts.openai_max_tokens_field {
                    MaxTokensField::MaxTokens => "max_tokens",
                    MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
                };
                out.insert(field.into(), Value::from(positive_int(v, k)?));
            }
            "temperature" | "top_p" => {
                if !v.is_null() {
                    out.insert(k.into(), number(v, k)?);
                }
            }
            "stop_sequences" => {
                if v.is_null() {
                    continue;
                }
                for (i, s) in arr(v, k)?.iter().enumerate() {
                    string(s, &format!("stop_sequences[{i}]"))?;
                }
                out.insert("stop".into(), v.clone());
            }
            "stream" => {
                if !v.is_null() {
                    stream = boolean(v, k)?;
                    out.insert("stream".into(), Value::Bool(stream));
                }
            }
            "metadata" => {
                if v.is_null() {
                    continue;
                }
                let m = obj(v, k)?;
                only(m, &["user_id"], k)?;
                if let Some(u) = m.get("user_id").filter(|u| !u.is_null()) {
                    out.insert(
                        "user".into(),
                        Value::String(string(u, "metadata.user_id")?.to_owned()),
                    );
                }
            }
            "tools" => {
                if v.is_null() {
                    continue;
                }
                let tools = arr(v, k)?
                    .iter()
                    .enumerate()
                    .map(|(i, t)| anthropic_tool(t, &format!("tools[{i}]")))
                    .collect::<R<Vec<_>>>()?;
                tools_given = true;
                out.insert("tools".into(), Value::Array(tools));
            }
            "tool_choice" => {
                if v.is_null() {
                    continue;
                }
                let (choice, parallel) = anthropic_tool_choice(v)?;
                out.insert("tool_choice".into(), choice);
                if let Some(p) = parallel {
                    out.insert("parallel_tool_calls".into(), Value::Bool(p));
                }
            }
            "thinking" => match v {
                Value::Null => {}
                Value::Object(t)
                    if t.len() == 1
                        && t.get("type").and_then(Value::as_str) == Some("disabled") => {}
                _ => return refuse(k, Reason::NoEquivalent),
            },
            "service_tier" => match v {
                Value::Null => {}
                v if v.as_str() == Some("auto") => {}
                _ => return refuse(k, Reason::NoEquivalent),
            },
            "top_k" | "container" | "mcp_servers" | "context_management" | "output_format" => {
                must_be_null(v, k)?
            }
            _ => return refuse(at("", k), Reason::Unknown),
        }
    }
    if !out.contains_key("model") {
        return refuse("model", Reason::Missing);
    }
    if !out.contains_key("max_tokens") && !out.contains_key("max_completion_tokens") {
        return refuse("max_tokens", Reason::Missing);
    }
    let Some(messages) = messages else {
        return refuse("messages", Reason::Missing);
    };
    let mut all = Vec::with_capacity(messages.len() + 1);
    all.extend(system);
    all.extend(messages);
    out.insert("messages".into(), Value::Array(all));
    if stream {
        // Anthropic streams always report usage; ask OpenAI for it too.
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if out.contains_key("parallel_tool_calls") && !tools_given {
        out.remove("parallel_tool_calls");
    }
    Ok(Translated {
        body: Value::Object(out),
        stream,
        usage_chunk: false,
    })
}

fn anthropic_system(v: &Value) -> R<Option<Value>> {
    Ok(match v {
        Value::Null => None,
        Value::String(s) => Some(json!({"role": "system", "content": s})),
        Value::Array(blocks) => {
            let parts = blocks
                .iter()
                .enumerate()
                .map(|(i, b)| anthropic_text_block(b, &format!("system[{i}]")))
                .collect::<R<Vec<_>>>()?;
            Some(json!({"role": "system", "content": parts}))
        }
        _ => return refuse("system", Reason::Malformed),
    })
}

/// A text block as an OpenAI text part. `cache_control` is a caching hint
/// OpenAI has no field for (it caches prompts by itself): dropped, as the
/// README says.
fn anthropic_text_block(b: &Value, p: &str) -> R<Value> {
    let o = obj(b, p)?;
    match o.get("type").and_then(Value::as_str) {
        Some("text") => {
            only(o, &["type", "text", "cache_control", "citations"], p)?;
            if let Some(c) = o.get("citations") {
                if !(c.is_null() || c.as_array().is_some_and(Vec::is_empty)) {
                    return refuse(format!("{p}.citations"), Reason::NoEquivalent);
                }
            }
            let t = string(o.get("text").unwrap_or(&Value::Null), &format!("{p}.text"))?;
            Ok(json!({"type": "text", "text": t}))
        }
        Some(_) => refuse(format!("{p}.type"), Reason::NoEquivalent),
        None => refuse(format!("{p}.type"), Reason::Missing),
    }
}

fn anthropic_tool(t: &Value, p: &str) -> R<Value> {
    let o = obj(t, p)?;
    match o.get("type") {
        None | Some(Value::Null) => {}
        Some(t) if t.as_str() == Some("custom") => {}
        // Server tools (web search, bash, text editor, ...) run at Anthropic.
        Some(_) => return refuse(format!("{p}.type"), Reason::NoEquivalent),
    }
    only(
        o,
        &[
            "type",
            "name",
            "description",
            "input_schema",
            "cache_control",
        ],
        p,
    )?;
    let name = string(o.get("name").unwrap_or(&Value::Null), &format!("{p}.name"))?;
    let schema = obj(
        o.get("input_schema").unwrap_or(&Value::Null),
        &format!("{p}.input_schema"),
    )?;
    let mut f = Map::new();
    f.insert("name".into(), Value::String(name.to_owned()));
    if let Some(d) = o.get("description").filter(|d| !d.is_null()) {
        f.insert(
            "description".into(),
            Value::String(string(d, &format!("{p}.description"))?.to_owned()),
        );
    }
    f.insert("parameters".into(), Value::Object(schema.clone()));
    Ok(json!({"type": "function", "function": f}))
}

/// (OpenAI `tool_choice`, `parallel_tool_calls`).
fn anthropic_tool_choice(v: &Value) -> R<(Value, Option<bool>)> {
    const P: &str = "tool_choice";
    let o = obj(v, P)?;
    let ty = string(o.get("type").unwrap_or(&Value::Null), "tool_choice.type")?;
    let parallel = match o.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => None,
        Some(d) => Some(!boolean(d, "tool_choice.disable_parallel_tool_use")?),
    };
    let choice = match ty {
        "auto" => {
            only(o, &["type", "disable_parallel_tool_use"], P)?;
            json!("auto")
        }
        "any" => {
            only(o, &["type", "disable_parallel_tool_use"], P)?;
            json!("required")
        }
        "none" => {
            only(o, &["type"], P)?;
            json!("none")
        }
        "tool" => {
            only(o, &["type", "name", "disable_parallel_tool_use"], P)?;
            let name = string(o.get("name").unwrap_or(&Value::Null), "tool_choice.name")?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return refuse("tool_choice.type", Reason::NoEquivalent),
    };
    Ok((choice, parallel))
}

fn anthropic_messages(msgs: &[Value]) -> R<Vec<Value>> {
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let p = format!("messages[{i}]");
        let mo = obj(m, &p)?;
        only(mo, &["role", "content"], &p)?;
        let role = string(mo.get("role").unwrap_or(&Value::Null), &format!("{p}.role"))?;
        let cp = format!("{p}.content");
        let content = mo.get("content").unwrap_or(&Value::Null);
        match (role, content) {
            ("user", Value::String(s)) => out.push(json!({"role": "user", "content": s})),
            ("assistant", Value::String(s)) => out.push(json!({"role": "assistant", "content": s})),
            ("user", Value::Array(blocks)) => anthropic_user(blocks, &cp, &mut out)?,
            ("assistant", Value::Array(blocks)) => out.push(anthropic_assistant(blocks, &cp)?),
            ("user" | "assistant", _) => return refuse(cp, Reason::Malformed),
            _ => return refuse(format!("{p}.role"), Reason::NoEquivalent),
        }
    }
    Ok(out)
}

/// A user turn: its tool results (which Anthropic puts first) become
/// `tool` messages, the rest one user message after them.
fn anthropic_user(blocks: &[Value], cp: &str, out: &mut Vec<Value>) -> R<()> {
    let mut parts = Vec::new();
    let mut results = 0usize;
    for (j, b) in blocks.iter().enumerate() {
        let bp = format!("{cp}[{j}]");
        let o = obj(b, &bp)?;
        match o.get("type").and_then(Value::as_str) {
            Some("tool_result") => {
                if !parts.is_empty() {
                    // OpenAI's tool messages precede the user's next words.
                    return refuse(bp, Reason::Order);
                }
                results += 1;
                out.push(anthropic_tool_result(o, &bp)?);
            }
            Some("image") => {
                only(o, &["type", "source", "cache_control"], &bp)?;
                let url = anthropic_image_url(o.get("source").unwrap_or(&Value::Null), &bp)?;
                parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            _ => parts.push(anthropic_text_block(b, &bp)?),
        }
    }
    if !parts.is_empty() || results == 0 {
        out.push(json!({"role": "user", "content": parts}));
    }
    Ok(())
}

fn anthropic_image_url(source: &Value, bp: &str) -> R<String> {
    let sp = format!("{bp}.source");
    let s = obj(source, &sp)?;
    match s.get("type").and_then(Value::as_str) {
        Some("base64") => {
            only(s, &["type", "media_type", "data"], &sp)?;
            let mt = string(
                s.get("media_type").unwrap_or(&Value::Null),
                &format!("{sp}.media_type"),
            )?;
            if !IMAGE_TYPES.contains(&mt) {
                return refuse(format!("{sp}.media_type"), Reason::OutOfRange);
            }
            let data = string(s.get("data").unwrap_or(&Value::Null), &format!("{sp}.data"))?;
            Ok(format!("data:{mt};base64,{data}"))
        }
        Some("url") => {
            only(s, &["type", "url"], &sp)?;
            let url = string(s.get("url").unwrap_or(&Value::Null), &format!("{sp}.url"))?;
            if url.starts_with("https://") || url.starts_with("http://") {
                Ok(url.to_owned())
            } else {
                refuse(format!("{sp}.url"), Reason::OutOfRange)
            }
        }
        _ => refuse(format!("{sp}.type"), Reason::NoEquivalent),
    }
}

fn anthropic_tool_result(o: &Map<String, Value>, bp: &str) -> R<Value> {
    only(
        o,
        &[
            "type",
            "tool_use_id",
            "content",
            "is_error",
            "cache_control",
        ],
        bp,
    )?;
    match o.get("is_error") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        // OpenAI's tool message has no error flag.
        Some(_) => return refuse(format!("{bp}.is_error"), Reason::NoEquivalent),
    }
    let id = string(
        o.get("tool_use_id").unwrap_or(&Value::Null),
        &format!("{bp}.tool_use_id"),
    )?;
    let cp = format!("{bp}.content");
    let content = match o.get("content") {
        None | Some(Value::Null) => Value::String(String::new()),
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(Value::Array(blocks)) => Value::Array(
            blocks
                .iter()
                .enumerate()
                .map(|(k, b)| anthropic_text_block(b, &format!("{cp}[{k}]")))
                .collect::<R<Vec<_>>>()?,
        ),
        Some(_) => return refuse(cp, Reason::Malformed),
    };
    Ok(json!({"role": "tool", "tool_call_id": id, "content": content}))
}

fn anthropic_assistant(blocks: &[Value], cp: &str) -> R<Value> {
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let bp = format!("{cp}[{j}]");
        let o = obj(b, &bp)?;
        match o.get("type").and_then(Value::as_str) {
            Some("tool_use") => {
                only(o, &["type", "id", "name", "input", "cache_control"], &bp)?;
                let id = string(o.get("id").unwrap_or(&Value::Null), &format!("{bp}.id"))?;
                let name = string(o.get("name").unwrap_or(&Value::Null), &format!("{bp}.name"))?;
                let input = obj(
                    o.get("input").unwrap_or(&Value::Null),
                    &format!("{bp}.input"),
                )?;
                let args = serde_json::to_string(input)
                    .or_else(|_| refuse(format!("{bp}.input"), Reason::Malformed))?;
                calls.push(json!({"id": id, "type": "function",
                                  "function": {"name": name, "arguments": args}}));
            }
            Some("text") => {
                if !calls.is_empty() {
                    // OpenAI puts an assistant's text before its tool calls.
                    return refuse(bp, Reason::Order);
                }
                parts.push(anthropic_text_block(b, &bp)?);
            }
            // thinking, redacted_thinking, server tool blocks, ...
            Some(_) => return refuse(format!("{bp}.type"), Reason::NoEquivalent),
            None => return refuse(format!("{bp}.type"), Reason::Missing),
        }
    }
    let mut m = Map::new();
    m.insert("role".into(), json!("assistant"));
    m.insert(
        "content".into(),
        if parts.is_empty() && !calls.is_empty() {
            Value::Null
        } else {
            Value::Array(parts)
        },
    );
    if !calls.is_empty() {
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    Ok(Value::Object(m))
}
