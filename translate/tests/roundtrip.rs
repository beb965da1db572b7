//! Property: a request translated to the other family and back keeps
//! every field the README says is kept (system text, turns in order with
//! their text, images, tool calls with ids and arguments, tool results,
//! the output limit, sampling, stop sequences, stream, tools, tool choice
//! and parallelism, the user id). Shapes that carry the same meaning are
//! compared in one normal form (a string content and a one-text-part
//! array; several system messages and one with several parts).
//!
//! And: no body, however odd, makes translation panic.

use loopgate_translate::request::{self, MaxTokensField, Options};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn opts() -> Options {
    Options {
        default_max_tokens: 1024,
        openai_max_tokens_field: MaxTokensField::MaxTokens,
    }
}

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 ,.!?\"\\\\é\n{}]{0,16}"
}

fn ident() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_]{0,7}"
}

fn args() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        text().prop_map(Value::String),
        any::<i32>().prop_map(Value::from),
        any::<bool>().prop_map(Value::Bool),
        Just(Value::Null),
    ];
    prop::collection::btree_map("[a-z]{1,5}", leaf, 0..4)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
}

fn image_url() -> impl Strategy<Value = String> {
    prop_oneof![
        ("(png|jpeg|gif|webp)", "[A-Za-z0-9+/]{4,12}={0,2}")
            .prop_map(|(t, d)| format!("data:image/{t};base64,{d}")),
        "[a-z]{1,8}".prop_map(|p| format!("https://example.com/{p}.png")),
    ]
}

/// (tools, tool_choice, parallel_tool_calls) in one family's shape.
fn tool_defs() -> impl Strategy<Value = Vec<(String, Option<String>, Value)>> {
    prop::collection::vec((ident(), prop::option::of(text()), args()), 0..3)
}

// ----- OpenAI ---------------------------------------------------------

fn openai_user() -> impl Strategy<Value = Value> {
    prop_oneof![
        text().prop_map(|t| json!({"role": "user", "content": t})),
        prop::collection::vec(
            prop_oneof![
                text().prop_map(|t| json!({"type": "text", "text": t})),
                image_url().prop_map(|u| json!({"type": "image_url", "image_url": {"url": u}})),
            ],
            1..3
        )
        .prop_map(|parts| json!({"role": "user", "content": parts})),
    ]
}

/// An assistant turn: words, or tool calls (with their results after).
fn openai_assistant() -> impl Strategy<Value = Vec<Value>> {
    prop_oneof![
        text().prop_map(|t| vec![json!({"role": "assistant", "content": t})]),
        (
            prop::option::of(text()),
            prop::collection::vec((ident(), ident(), args(), text()), 1..4)
        )
            .prop_map(|(words, calls)| {
                let mut out = vec![json!({"role": "assistant", "content": words,
                    "tool_calls": calls.iter().enumerate().map(|(i, (id, name, a, _))| json!({
                        "id": format!("{id}{i}"), "type": "function",
                        "function": {"name": name, "arguments": a.to_string()}})).collect::<Vec<_>>()})];
                for (i, (id, _, _, result)) in calls.iter().enumerate() {
                    out.push(json!({"role": "tool", "tool_call_id": format!("{id}{i}"), "content": result}));
                }
                out
            }),
    ]
}

fn openai_request() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(text(), 0..3),
        prop::collection::vec((openai_user(), openai_assistant()), 0..4),
        (
            prop::option::of(1u64..100_000),
            prop::option::of(0u32..=100),
            prop::option::of(0u32..=100),
            prop::option::of(prop_oneof![
                text().prop_map(Value::String),
                prop::collection::vec(text(), 0..3).prop_map(|v| json!(v)),
            ]),
            prop::option::of(any::<bool>()),
            prop::option::of(ident()),
        ),
        tool_defs(),
        prop::option::of(0usize..4),
        prop::option::of(any::<bool>()),
    )
        .prop_map(
            |(system, turns, (max, temp, top_p, stop, stream, user), tools, choice, parallel)| {
                let mut messages: Vec<Value> = system
                    .into_iter()
                    .map(|s| json!({"role": "system", "content": s}))
                    .collect();
                for (u, a) in turns {
                    messages.push(u);
                    messages.extend(a);
                }
                let mut r = Map::new();
                r.insert("model".into(), json!("gpt-x"));
                r.insert("messages".into(), Value::Array(messages));
                if let Some(m) = max {
                    r.insert("max_tokens".into(), json!(m));
                }
                if let Some(t) = temp {
                    r.insert("temperature".into(), json!(f64::from(t) / 100.0));
                }
                if let Some(t) = top_p {
                    r.insert("top_p".into(), json!(f64::from(t) / 100.0));
                }
                if let Some(s) = stop {
                    r.insert("stop".into(), s);
                }
                if let Some(s) = stream {
                    r.insert("stream".into(), json!(s));
                }
                if let Some(u) = user {
                    r.insert("user".into(), json!(u));
                }
                if !tools.is_empty() {
                    let first = tools.first().map(|t| t.0.clone()).unwrap_or_default();
                    r.insert(
                        "tools".into(),
                        tools
                            .iter()
                            .map(|(n, d, p)| {
                                let mut f = json!({"name": n, "parameters": {"type": "object", "properties": p}});
                                if let Some(d) = d {
                                    f["description"] = json!(d);
                                }
                                json!({"type": "function", "function": f})
                            })
                            .collect(),
                    );
                    if let Some(c) = choice {
                        r.insert(
                            "tool_choice".into(),
                            match c {
                                0 => json!("auto"),
                                1 => json!("none"),
                                2 => json!("required"),
                                _ => json!({"type": "function", "function": {"name": first}}),
                            },
                        );
                    }
                    if let Some(p) = parallel {
                        r.insert("parallel_tool_calls".into(), json!(p));
                    }
                }
                Value::Object(r)
            },
        )
}

fn texts(content: &Value) -> Vec<Value> {
    match content {
        Value::String(s) => vec![json!({"text": s})],
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p["type"].as_str() {
                Some("image_url") => json!({"image": p["image_url"]["url"]}),
                _ => json!({"text": p["text"]}),
            })
            .collect(),
        _ => vec![],
    }
}

/// What the README says an OpenAI request keeps, in one normal form.
fn kept_openai(r: &Value) -> Value {
    let mut system = Vec::new();
    let mut turns = Vec::new();
    for m in r["messages"].as_array().unwrap() {
        match m["role"].as_str().unwrap() {
            "system" | "developer" => system.extend(texts(&m["content"])),
            "user" => turns.push(json!({"user": texts(&m["content"])})),
            "tool" => {
                turns.push(json!({"tool": m["tool_call_id"], "content": texts(&m["content"])}))
            }
            "assistant" => {
                let words: Vec<Value> = texts(&m["content"])
                    .into_iter()
                    .filter(|t| t["text"] != "" || m["tool_calls"].is_null())
                    .collect();
                let calls: Vec<Value> = m["tool_calls"]
                    .as_array()
                    .map(|c| {
                        c.iter()
                            .map(|c| {
                                let a: Value = serde_json::from_str(
                                    c["function"]["arguments"].as_str().unwrap(),
                                )
                                .unwrap();
                                json!({"id": c["id"], "name": c["function"]["name"], "args": a})
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                turns.push(json!({"assistant": words, "calls": calls}));
            }
            other => panic!("{other}"),
        }
    }
    let stop = match &r["stop"] {
        Value::String(s) => json!([s]),
        v => v.clone(),
    };
    let tools_given = r["tools"].as_array().is_some_and(|t| !t.is_empty());
    let choice = match &r["tool_choice"] {
        Value::Null if tools_given => json!("auto"),
        v => v.clone(),
    };
    let parallel =
        r["parallel_tool_calls"] == json!(false) && tools_given && choice != json!("none");
    json!({
        "model": r["model"], "system": system, "turns": turns,
        "max_tokens": r.get("max_tokens").cloned().unwrap_or(json!(1024)),
        "temperature": r["temperature"], "top_p": r["top_p"], "stop": stop,
        "stream": r["stream"] == json!(true), "user": r["user"],
        "tools": r["tools"], "tool_choice": choice, "sequential": parallel,
    })
}

// ----- Anthropic ------------------------------------------------------

fn anthropic_text_block() -> impl Strategy<Value = Value> {
    (text(), any::<bool>()).prop_map(|(t, cache)| {
        if cache {
            json!({"type": "text", "text": t, "cache_control": {"type": "ephemeral"}})
        } else {
            json!({"type": "text", "text": t})
        }
    })
}

fn anthropic_image() -> impl Strategy<Value = Value> {
    prop_oneof![
        ("(png|jpeg|gif|webp)", "[A-Za-z0-9+/]{4,12}").prop_map(|(t, d)| json!({"type": "image",
            "source": {"type": "base64", "media_type": format!("image/{t}"), "data": d}})),
        "[a-z]{1,8}".prop_map(|p| json!({"type": "image",
            "source": {"type": "url", "url": format!("https://example.com/{p}.png")}})),
    ]
}

/// (assistant turn, user turn after it).
fn anthropic_exchange() -> impl Strategy<Value = (Value, Value)> {
    (
        prop_oneof![
            text().prop_map(|t| (json!(t), vec![])),
            (
                prop::collection::vec(anthropic_text_block(), 0..2),
                prop::collection::vec((ident(), ident(), args()), 0..3)
            )
                .prop_map(|(words, calls)| {
                    let mut blocks = words;
                    let ids: Vec<String> = calls
                        .iter()
                        .enumerate()
                        .map(|(i, (id, _, _))| format!("{id}{i}"))
                        .collect();
                    for ((_, name, input), id) in calls.iter().zip(&ids) {
                        blocks.push(
                            json!({"type": "tool_use", "id": id, "name": name, "input": input}),
                        );
                    }
                    (Value::Array(blocks), ids)
                }),
        ],
        prop::collection::vec(text(), 3),
        prop::collection::vec(prop_oneof![anthropic_text_block(), anthropic_image()], 0..3),
        any::<bool>(),
    )
        .prop_map(|((assistant, ids), results, words, string_user)| {
            let mut user: Vec<Value> = ids
                .iter()
                .zip(results.iter().cycle())
                .map(|(id, r)| json!({"type": "tool_result", "tool_use_id": id, "content": r}))
                .collect();
            let user = if user.is_empty() && string_user {
                json!("next?")
            } else {
                user.extend(words);
                if user.is_empty() {
                    user.push(json!({"type": "text", "text": "next?"}));
                }
                Value::Array(user)
            };
            (
                json!({"role": "assistant", "content": assistant}),
                json!({"role": "user", "content": user}),
            )
        })
}

fn anthropic_request() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            Just(Value::Null),
            text().prop_map(Value::String),
            prop::collection::vec(anthropic_text_block(), 1..3).prop_map(Value::Array),
        ],
        prop_oneof![
            text().prop_map(|t| json!({"role": "user", "content": t})),
            prop::collection::vec(prop_oneof![anthropic_text_block(), anthropic_image()], 1..3)
                .prop_map(|b| json!({"role": "user", "content": b})),
        ],
        prop::collection::vec(anthropic_exchange(), 0..3),
        (
            1u64..100_000,
            prop::option::of(0u32..=100),
            prop::option::of(0u32..=100),
            prop::option::of(prop::collection::vec(text(), 0..3)),
            prop::option::of(any::<bool>()),
            prop::option::of(ident()),
        ),
        tool_defs(),
        prop::option::of((0usize..4, prop::option::of(any::<bool>()))),
    )
        .prop_map(
            |(system, first, exchanges, (max, temp, top_p, stop, stream, user), tools, choice)| {
                let mut messages = vec![first];
                for (a, u) in exchanges {
                    messages.push(a);
                    messages.push(u);
                }
                let mut r = Map::new();
                r.insert("model".into(), json!("claude-x"));
                r.insert("max_tokens".into(), json!(max));
                r.insert("messages".into(), Value::Array(messages));
                if !system.is_null() {
                    r.insert("system".into(), system);
                }
                if let Some(t) = temp {
                    r.insert("temperature".into(), json!(f64::from(t) / 100.0));
                }
                if let Some(t) = top_p {
                    r.insert("top_p".into(), json!(f64::from(t) / 100.0));
                }
                if let Some(s) = stop {
                    r.insert("stop_sequences".into(), json!(s));
                }
                if let Some(s) = stream {
                    r.insert("stream".into(), json!(s));
                }
                if let Some(u) = user {
                    r.insert("metadata".into(), json!({"user_id": u}));
                }
                if !tools.is_empty() {
                    let first = tools.first().map(|t| t.0.clone()).unwrap_or_default();
                    r.insert(
                        "tools".into(),
                        tools
                            .iter()
                            .map(|(n, d, p)| {
                                let mut t = json!({"name": n, "input_schema": {"type": "object", "properties": p}});
                                if let Some(d) = d {
                                    t["description"] = json!(d);
                                }
                                t
                            })
                            .collect(),
                    );
                    if let Some((c, disable)) = choice {
                        let mut tc = match c {
                            0 => json!({"type": "auto"}),
                            1 => json!({"type": "none"}),
                            2 => json!({"type": "any"}),
                            _ => json!({"type": "tool", "name": first}),
                        };
                        if let (Some(d), false) = (disable, c == 1) {
                            tc["disable_parallel_tool_use"] = json!(d);
                        }
                        r.insert("tool_choice".into(), tc);
                    }
                }
                Value::Object(r)
            },
        )
}

fn blocks(content: &Value) -> Vec<Value> {
    match content {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(b) => b
            .iter()
            .map(|b| {
                let mut b = b.clone();
                if let Some(o) = b.as_object_mut() {
                    o.remove("cache_control");
                }
                b
            })
            .collect(),
        _ => vec![],
    }
}

/// What the README says an Anthropic request keeps, in one normal form.
fn kept_anthropic(r: &Value) -> Value {
    let messages: Vec<Value> = r["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| json!({"role": m["role"], "content": blocks(&m["content"])}))
        .collect();
    let mut choice = r["tool_choice"].clone();
    if choice["disable_parallel_tool_use"] == json!(false) {
        choice
            .as_object_mut()
            .unwrap()
            .remove("disable_parallel_tool_use");
    }
    json!({
        "model": r["model"], "system": blocks(&r["system"]), "messages": messages,
        "max_tokens": r["max_tokens"], "temperature": r["temperature"], "top_p": r["top_p"],
        "stop": r["stop_sequences"], "stream": r["stream"] == json!(true),
        "user": r["metadata"]["user_id"], "tools": r["tools"], "tool_choice": choice,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn openai_there_and_back_keeps_what_the_readme_says(r in openai_request()) {
        let there = request::openai_to_anthropic(&r, &opts()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let back = request::anthropic_to_openai(&there.body, &opts()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(kept_openai(&r), kept_openai(&back.body));
    }

    #[test]
    fn anthropic_there_and_back_keeps_what_the_readme_says(r in anthropic_request()) {
        let there = request::anthropic_to_openai(&r, &opts()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let back = request::openai_to_anthropic(&there.body, &opts()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(kept_anthropic(&r), kept_anthropic(&back.body));
    }

    #[test]
    fn no_body_makes_translation_panic(v in odd_json()) {
        let _ = request::openai_to_anthropic(&v, &opts());
        let _ = request::anthropic_to_openai(&v, &opts());
        let _ = loopgate_translate::response::openai_to_anthropic(&v);
        let _ = loopgate_translate::response::anthropic_to_openai(&v, 0);
        let bytes = v.to_string();
        for upstream in [loopgate_translate::Family::OpenAi, loopgate_translate::Family::Anthropic] {
            let mut t = loopgate_translate::stream::StreamTranslator::new(upstream, Default::default());
            let mut out = Vec::new();
            let _ = t.feed(format!("event: {}\ndata: {bytes}\n\n", v["type"].as_str().unwrap_or("")).as_bytes(), &mut out);
            t.fail("x", &mut out);
        }
    }
}

/// JSON built from the fields both families define, with any values.
fn odd_json() -> impl Strategy<Value = Value> {
    const KEYS: [&str; 28] = [
        "model",
        "messages",
        "role",
        "content",
        "type",
        "text",
        "tool_calls",
        "id",
        "function",
        "name",
        "arguments",
        "tool_call_id",
        "tools",
        "tool_choice",
        "image_url",
        "url",
        "source",
        "tool_use_id",
        "input",
        "system",
        "choices",
        "delta",
        "message",
        "index",
        "usage",
        "content_block",
        "finish_reason",
        "stop_reason",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        prop_oneof![
            Just("user"),
            Just("assistant"),
            Just("tool"),
            Just("system"),
            Just("text"),
            Just("image_url"),
            Just("tool_use"),
            Just("tool_result"),
            Just("function"),
            Just("data:image/png;base64,AA"),
            Just("{}"),
            Just("message_start"),
            Just("stop"),
        ]
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(prop::sample::select(KEYS.to_vec()), inner, 0..6).prop_map(
                |m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            ),
        ]
    })
}
