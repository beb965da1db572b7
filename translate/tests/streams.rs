//! Streams: recorded chunk sequences in each family, translated whole and
//! split at every byte boundary (the output must not change), assembled
//! the way the SDKs assemble them, and broken mid-way.

use loopgate_translate::stream::{End, StreamOptions, StreamTranslator};
use loopgate_translate::Family;
use serde_json::{json, Value};

/// OpenAI: text, then the finish chunk, the usage chunk and [DONE]
/// (`stream_options.include_usage`), as api.openai.com sends them.
const OPENAI_TEXT: &str = concat!(
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\", \\\"w\\u00f6rld\\\"\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":4,\"total_tokens\":24,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n",
    "data: [DONE]\n\n",
);

/// OpenAI: text, then two parallel tool calls with arguments in pieces.
const OPENAI_TOOLS: &str = concat!(
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Checking.\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"ci\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"ty\\\": \\\"Paris\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_b\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\"\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\": \\\"Rome\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":30,\"total_tokens\":80}}\n\n",
    "data: [DONE]\n\n",
);

/// Anthropic: text with a ping, cache usage, as api.anthropic.com sends it.
const ANTHROPIC_TEXT: &str = concat!(
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":3,\"cache_read_input_tokens\":40,\"output_tokens\":1}}}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: ping\ndata: {\"type\": \"ping\"}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\", w\\u00f6rld\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":6}}\n\n",
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
);

/// Anthropic: text, then two tool_use blocks with input_json_delta.
const ANTHROPIC_TOOLS: &str = concat!(
    "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":100,\"output_tokens\":1}}}\r\n\r\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Checking.\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_a\",\"name\":\"get_weather\",\"input\":{}}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \\\"Pa\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"ris\\\"}\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_b\",\"name\":\"get_weather\",\"input\":{}}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \\\"Rome\\\"}\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":2}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":40}}\n\n",
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
);

/// Anthropic: two tool_use blocks and no text, as api.anthropic.com sends
/// them (the ping after the first block starts, an empty first piece).
const ANTHROPIC_TOOLS_ONLY: &str = concat!(
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_3\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":80,\"output_tokens\":1}}}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_a\",\"name\":\"get_weather\",\"input\":{}}}\n\n",
    "event: ping\ndata: {\"type\": \"ping\"}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \\\"Pa\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"ris\\\"}\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_b\",\"name\":\"get_time\",\"input\":{}}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \\\"Rome\\\"}\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":33}}\n\n",
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
);

fn opts(usage_chunk: bool) -> StreamOptions {
    StreamOptions {
        created: 1_700_000_000,
        usage_chunk,
        ..StreamOptions::default()
    }
}

/// Translate `input` fed in the given pieces; the translator's end.
fn run(upstream: Family, usage_chunk: bool, pieces: &[&[u8]]) -> (Vec<u8>, End) {
    let mut t = StreamTranslator::new(upstream, opts(usage_chunk));
    let mut out = Vec::new();
    for p in pieces {
        t.feed(p, &mut out).unwrap_or_else(|e| panic!("{e}"));
    }
    t.finish().unwrap_or_else(|e| panic!("{e}"));
    (out, t.end())
}

fn every_split_gives_the_same(upstream: Family, usage_chunk: bool, input: &str) -> Vec<u8> {
    let b = input.as_bytes();
    let (whole, end) = run(upstream, usage_chunk, &[b]);
    assert_eq!(end, End::Complete);
    for i in 0..=b.len() {
        let (x, y) = b.split_at(i);
        assert_eq!(run(upstream, usage_chunk, &[x, y]).0, whole, "split at {i}");
    }
    let bytes: Vec<&[u8]> = b.chunks(1).collect();
    assert_eq!(run(upstream, usage_chunk, &bytes).0, whole, "byte by byte");
    let threes: Vec<&[u8]> = b.chunks(3).collect();
    assert_eq!(
        run(upstream, usage_chunk, &threes).0,
        whole,
        "three by three"
    );
    whole
}

/// SSE events: (event name, data).
fn events(sse: &[u8]) -> Vec<(String, String)> {
    let text = std::str::from_utf8(sse).unwrap().replace("\r\n", "\n");
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = String::new();
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = d.to_string();
                } else {
                    panic!("unexpected line {line:?}");
                }
            }
            (name, data)
        })
        .collect()
}

/// An Anthropic stream assembled as the SDK's `get_final_message()` does,
/// checking the protocol on the way (block order, start/stop pairing).
fn assemble_anthropic(sse: &[u8]) -> Value {
    let mut message = Value::Null;
    let mut open: Option<u64> = None;
    let mut partial = String::new();
    let mut stopped = false;
    for (name, data) in events(sse) {
        let v: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(v["type"], name.as_str(), "event name and data type agree");
        assert!(!stopped, "nothing after message_stop");
        match name.as_str() {
            "message_start" => {
                assert!(message.is_null());
                message = v["message"].clone();
            }
            "content_block_start" => {
                assert!(open.is_none(), "blocks do not overlap");
                let i = v["index"].as_u64().unwrap();
                assert_eq!(i as usize, message["content"].as_array().unwrap().len());
                open = Some(i);
                partial.clear();
                message["content"]
                    .as_array_mut()
                    .unwrap()
                    .push(v["content_block"].clone());
            }
            "content_block_delta" => {
                let i = v["index"].as_u64().unwrap();
                assert_eq!(open, Some(i));
                let block = &mut message["content"][i as usize];
                match v["delta"]["type"].as_str().unwrap() {
                    "text_delta" => {
                        let t = format!(
                            "{}{}",
                            block["text"].as_str().unwrap(),
                            v["delta"]["text"].as_str().unwrap()
                        );
                        block["text"] = json!(t);
                    }
                    "input_json_delta" => {
                        partial.push_str(v["delta"]["partial_json"].as_str().unwrap());
                        block["input"] = serde_json::from_str(&partial).unwrap_or(json!({}));
                    }
                    other => panic!("{other}"),
                }
            }
            "content_block_stop" => {
                let i = v["index"].as_u64().unwrap();
                assert_eq!(open.take(), Some(i));
                let block = &message["content"][i as usize];
                if block["type"] == "tool_use" && !partial.is_empty() {
                    let _: Value = serde_json::from_str(&partial).expect("complete tool input");
                }
            }
            "message_delta" => {
                assert!(open.is_none());
                message["stop_reason"] = v["delta"]["stop_reason"].clone();
                for (k, n) in v["usage"].as_object().unwrap() {
                    message["usage"][k] = n.clone();
                }
            }
            "message_stop" => stopped = true,
            "ping" => {}
            other => panic!("{other}"),
        }
    }
    assert!(stopped, "ends with message_stop");
    message
}

/// An OpenAI stream assembled as the SDK's stream helper does.
fn assemble_openai(sse: &[u8]) -> Value {
    let evs = events(sse);
    let (last, chunks) = evs.split_last().unwrap();
    assert_eq!(last, &(String::new(), "[DONE]".to_string()));
    let mut text = String::new();
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = Value::Null;
    let mut usage = Value::Null;
    let mut id = Value::Null;
    for (name, data) in chunks {
        assert!(name.is_empty());
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk");
        id = v["id"].clone();
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
        for c in v["choices"].as_array().unwrap() {
            if let Some(t) = c["delta"]["content"].as_str() {
                text.push_str(t);
            }
            for tc in c["delta"]["tool_calls"].as_array().unwrap_or(&vec![]) {
                let i = tc["index"].as_u64().unwrap() as usize;
                if i == calls.len() {
                    assert!(tc["id"].is_string(), "a new call starts with its id");
                    calls.push(
                        json!({"id": tc["id"], "name": tc["function"]["name"], "arguments": ""}),
                    );
                }
                let a = format!(
                    "{}{}",
                    calls[i]["arguments"].as_str().unwrap(),
                    tc["function"]["arguments"].as_str().unwrap_or("")
                );
                calls[i]["arguments"] = json!(a);
            }
            if !c["finish_reason"].is_null() {
                finish = c["finish_reason"].clone();
            }
        }
    }
    for c in &mut calls {
        let args: Value = serde_json::from_str(c["arguments"].as_str().unwrap()).unwrap();
        c["arguments"] = args;
    }
    json!({"id": id, "text": text, "tool_calls": calls, "finish_reason": finish, "usage": usage})
}

#[test]
fn openai_text_stream_as_anthropic_events() {
    let out = every_split_gives_the_same(Family::OpenAi, false, OPENAI_TEXT);
    let expected = concat!(
        "event: message_start\ndata: {\"message\":{\"content\":[],\"id\":\"chatcmpl-9\",\"model\":\"gpt-4o-mini\",\"role\":\"assistant\",\"stop_reason\":null,\"stop_sequence\":null,\"type\":\"message\",\"usage\":{\"input_tokens\":0,\"output_tokens\":0}},\"type\":\"message_start\"}\n\n",
        "event: content_block_start\ndata: {\"content_block\":{\"text\":\"\",\"type\":\"text\"},\"index\":0,\"type\":\"content_block_start\"}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\", \\\"wörld\\\"\"}}\n\n",
        "event: content_block_stop\ndata: {\"index\":0,\"type\":\"content_block_stop\"}\n\n",
        "event: message_delta\ndata: {\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"type\":\"message_delta\",\"usage\":{\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":8,\"input_tokens\":12,\"output_tokens\":4}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    assert_eq!(String::from_utf8(out.clone()).unwrap(), expected);
    let m = assemble_anthropic(&out);
    assert_eq!(
        m["content"],
        json!([{"type": "text", "text": "Hello, \"wörld\""}])
    );
}

#[test]
fn openai_tool_stream_as_anthropic_events() {
    let out = every_split_gives_the_same(Family::OpenAi, false, OPENAI_TOOLS);
    let m = assemble_anthropic(&out);
    assert_eq!(
        m["content"],
        json!([{"type": "text", "text": "Checking."},
               {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {"city": "Paris"}},
               {"type": "tool_use", "id": "call_b", "name": "get_weather", "input": {"city": "Rome"}}])
    );
    assert_eq!(m["stop_reason"], "tool_use");
    assert_eq!(m["usage"]["input_tokens"], 50);
    assert_eq!(m["usage"]["output_tokens"], 30);
}

#[test]
fn anthropic_text_stream_as_openai_chunks() {
    let out = every_split_gives_the_same(Family::Anthropic, true, ANTHROPIC_TEXT);
    let first = events(&out)[0].1.clone();
    assert_eq!(
        first,
        "{\"id\":\"msg_1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"claude-sonnet-4-5\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\",\"role\":\"assistant\"},\"logprobs\":null,\"finish_reason\":null}]}"
    );
    let a = assemble_openai(&out);
    assert_eq!(a["text"], "Hello, wörld");
    assert_eq!(a["finish_reason"], "stop");
    assert_eq!(
        a["usage"],
        json!({"prompt_tokens": 55, "completion_tokens": 6, "total_tokens": 61,
               "prompt_tokens_details": {"cached_tokens": 40}})
    );
    // Without include_usage, no usage chunk (clients read choices[0]).
    let (plain, _) = run(Family::Anthropic, false, &[ANTHROPIC_TEXT.as_bytes()]);
    assert!(assemble_openai(&plain)["usage"].is_null());
    assert!(events(&plain)
        .iter()
        .all(|(_, d)| d == "[DONE]" || d.contains("\"choices\":[{")));
}

#[test]
fn anthropic_tool_stream_as_openai_chunks() {
    let out = every_split_gives_the_same(Family::Anthropic, true, ANTHROPIC_TOOLS);
    let a = assemble_openai(&out);
    assert_eq!(a["text"], "Checking.");
    assert_eq!(
        a["tool_calls"],
        json!([{"id": "toolu_a", "name": "get_weather", "arguments": {"city": "Paris"}},
               {"id": "toolu_b", "name": "get_weather", "arguments": {"city": "Rome"}}])
    );
    assert_eq!(a["finish_reason"], "tool_calls");
    assert_eq!(a["usage"]["completion_tokens"], 40);
}

#[test]
fn an_answer_of_tool_calls_only_has_null_content_as_openai_sends_it() {
    let out = every_split_gives_the_same(Family::Anthropic, false, ANTHROPIC_TOOLS_ONLY);
    let evs = events(&out);
    // The role comes with the first call, `content: null`: an SDK's
    // assembled message has no content, as for a non-streamed answer.
    let first: Value = serde_json::from_str(&evs[0].1).unwrap();
    assert_eq!(
        first["choices"][0]["delta"],
        json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": "toolu_a",
               "type": "function", "function": {"name": "get_weather", "arguments": ""}}]})
    );
    assert!(evs[1..].iter().all(|(_, d)| !d.contains("\"role\"")));
    let a = assemble_openai(&out);
    assert_eq!(a["text"], "");
    assert_eq!(
        a["tool_calls"],
        json!([{"id": "toolu_a", "name": "get_weather", "arguments": {"city": "Paris"}},
               {"id": "toolu_b", "name": "get_time", "arguments": {"city": "Rome"}}])
    );
    assert_eq!(a["finish_reason"], "tool_calls");

    // An answer with no block at all still starts with its role.
    let empty = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\",\"usage\":{\"input_tokens\":1}}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":0}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    let out = every_split_gives_the_same(Family::Anthropic, false, empty);
    let evs = events(&out);
    assert_eq!(evs.len(), 3, "{evs:?}");
    assert!(evs[0]
        .1
        .contains("\"delta\":{\"content\":\"\",\"role\":\"assistant\"}"));
    assert!(evs[1].1.contains("\"finish_reason\":\"stop\""));
}

#[test]
fn there_and_back_keeps_the_answer() {
    for input in [OPENAI_TEXT, OPENAI_TOOLS] {
        let (anthropic, _) = run(Family::OpenAi, false, &[input.as_bytes()]);
        let (back, end) = run(Family::Anthropic, true, &[&anthropic]);
        assert_eq!(end, End::Complete);
        let (a, b) = (assemble_openai(input.as_bytes()), assemble_openai(&back));
        assert_eq!(a["text"], b["text"]);
        assert_eq!(a["tool_calls"], b["tool_calls"]);
        assert_eq!(a["finish_reason"], b["finish_reason"]);
        assert_eq!(a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"]);
    }
    for input in [ANTHROPIC_TEXT, ANTHROPIC_TOOLS] {
        let (openai, _) = run(Family::Anthropic, true, &[input.as_bytes()]);
        let (back, _) = run(Family::OpenAi, false, &[&openai]);
        let (a, b) = (
            assemble_anthropic(input.as_bytes()),
            assemble_anthropic(&back),
        );
        assert_eq!(a["content"], b["content"]);
        assert_eq!(a["stop_reason"], b["stop_reason"]);
        assert_eq!(a["usage"]["output_tokens"], b["usage"]["output_tokens"]);
    }
}

/// The events before a broken one, read in the same piece, come out whole;
/// nothing of the broken event does, so they can be sent before the
/// error event.
#[test]
fn events_read_before_a_broken_one_are_kept_whole() {
    for (upstream, good, broken) in [
        (
            Family::OpenAi,
            &OPENAI_TEXT[..OPENAI_TEXT.find("data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{},").unwrap()],
            "data: {\"id\":\"chatcmpl-9\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}\n\n",
        ),
        (
            Family::Anthropic,
            &ANTHROPIC_TEXT[..ANTHROPIC_TEXT.find("event: content_block_stop").unwrap()],
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":7}}\n\n",
        ),
    ] {
        let mut whole = StreamTranslator::new(upstream, opts(false));
        let mut before = Vec::new();
        whole.feed(good.as_bytes(), &mut before).unwrap();
        assert!(!before.is_empty());
        let mut t = StreamTranslator::new(upstream, opts(false));
        let mut out = Vec::new();
        assert!(t.feed(format!("{good}{broken}").as_bytes(), &mut out).is_err());
        assert_eq!(out, before, "{upstream:?}: the good events, whole, and nothing else");
        t.fail("the provider's stream broke", &mut out);
        assert!(events(&out).len() > 2);
    }
}

#[test]
fn a_stream_cut_mid_way_ends_with_an_error_event() {
    // OpenAI upstream cut after two chunks: the Anthropic agent gets an
    // error event after what it already had, and nothing after it.
    let cut = &OPENAI_TEXT.as_bytes()[..OPENAI_TEXT.find("\"finish_reason\":\"stop\"").unwrap()];
    let mut t = StreamTranslator::new(Family::OpenAi, opts(false));
    let mut out = Vec::new();
    t.feed(cut, &mut out).unwrap();
    assert!(t.finish().is_err());
    t.fail("the provider's stream broke", &mut out);
    t.fail("twice", &mut out);
    t.feed(b"data: [DONE]\n\n", &mut out).unwrap();
    assert_eq!(t.end(), End::Failed);
    let evs = events(&out);
    assert_eq!(evs.len(), 5, "{evs:?}");
    assert_eq!(evs[4].0, "error");
    let e: Value = serde_json::from_str(&evs[4].1).unwrap();
    assert_eq!(
        e,
        json!({"type": "error", "error": {"type": "api_error", "message": "the provider's stream broke"}})
    );

    // Anthropic upstream cut: the OpenAI agent gets an error chunk, no [DONE].
    let cut = &ANTHROPIC_TOOLS.as_bytes()[..ANTHROPIC_TOOLS.find("ris\\\"}").unwrap()];
    let mut t = StreamTranslator::new(Family::Anthropic, opts(true));
    let mut out = Vec::new();
    t.feed(cut, &mut out).unwrap();
    assert!(t.finish().is_err());
    t.fail("the provider's stream broke", &mut out);
    let evs = events(&out);
    let (_, last) = evs.last().unwrap();
    let e: Value = serde_json::from_str(last).unwrap();
    assert_eq!(e["error"]["type"], "server_error");
    assert!(!evs.iter().any(|(_, d)| d == "[DONE]"));
}

#[test]
fn an_upstream_error_event_reaches_the_agent_in_its_family() {
    let input = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\",\"usage\":{\"input_tokens\":1}}}\n\n",
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
    );
    let (out, end) = run(Family::Anthropic, false, &[input.as_bytes()]);
    assert_eq!(end, End::UpstreamError);
    let evs = events(&out);
    assert_eq!(evs.len(), 1, "nothing but the error: no block began");
    let e: Value = serde_json::from_str(&evs[0].1).unwrap();
    assert_eq!(e["error"]["message"], "Overloaded");
    assert_eq!(e["error"]["code"], "overloaded_error");

    let input =
        "data: {\"error\":{\"message\":\"Rate limit\",\"type\":\"rate_limit_exceeded\"}}\n\n";
    let (out, end) = run(Family::OpenAi, false, &[input.as_bytes()]);
    assert_eq!(end, End::UpstreamError);
    let evs = events(&out);
    assert_eq!(evs[0].0, "error");
    let e: Value = serde_json::from_str(&evs[0].1).unwrap();
    assert_eq!(e["error"]["type"], "rate_limit_error");
}

#[test]
fn what_a_stream_cannot_say_breaks_it() {
    let cases: Vec<(Family, &str)> = vec![
        // Arguments for a call whose block already closed.
        (Family::OpenAi, concat!(
            "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"b\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]}}]}\n\n")),
        // A second choice.
        (Family::OpenAi, "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":1,\"delta\":{\"content\":\"x\"}}]}\n\n"),
        // [DONE] without a finish reason.
        (Family::OpenAi, "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n"),
        // A duplicate key.
        (Family::OpenAi, "data: {\"id\":\"c\",\"id\":\"d\",\"model\":\"m\",\"choices\":[]}\n\n"),
        // Not JSON.
        (Family::Anthropic, "event: message_start\ndata: {oops\n\n"),
        // Thinking.
        (Family::Anthropic, concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\"}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n")),
        // The event name and the data disagree.
        (Family::Anthropic, "event: message_stop\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\"}}\n\n"),
        // A delta before message_start.
        (Family::Anthropic, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n"),
        // An unknown event type.
        (Family::Anthropic, concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\"}}\n\n",
            "event: surprise\ndata: {\"type\":\"surprise\"}\n\n")),
    ];
    for (upstream, input) in cases {
        let mut t = StreamTranslator::new(upstream, opts(false));
        let mut out = Vec::new();
        assert!(t.feed(input.as_bytes(), &mut out).is_err(), "{input}");
        t.fail("broken", &mut out);
        assert_eq!(t.end(), End::Failed);
    }
    // An event past the bound.
    let mut t = StreamTranslator::new(
        Family::OpenAi,
        StreamOptions {
            max_event_bytes: 64,
            ..opts(false)
        },
    );
    let mut out = Vec::new();
    assert!(t.feed(&[b'x'; 65], &mut out).is_err());
}
