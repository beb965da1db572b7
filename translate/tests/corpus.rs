//! The corpus: request and response pairs in both directions, and the
//! requests each direction refuses (with the field it names).

use loopgate_translate::request::{self, MaxTokensField, Options};
use loopgate_translate::{response, Family, Reason};
use serde_json::{json, Value};

fn opts() -> Options {
    Options {
        default_max_tokens: 1024,
        openai_max_tokens_field: MaxTokensField::MaxTokens,
    }
}

fn to_anthropic(v: Value) -> Value {
    request::openai_to_anthropic(&v, &opts())
        .unwrap_or_else(|e| panic!("{e}"))
        .body
}

fn to_openai(v: Value) -> Value {
    request::anthropic_to_openai(&v, &opts())
        .unwrap_or_else(|e| panic!("{e}"))
        .body
}

#[test]
fn openai_requests_as_anthropic() {
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "system, sampling, stop string, user, default max_tokens",
            json!({"model": "m", "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"}],
                "temperature": 0.5, "top_p": 0.9, "stop": "END", "user": "u-1",
                "n": 1, "logprobs": false, "stream": false}),
            json!({"model": "m", "system": "Be brief.", "max_tokens": 1024,
                   "messages": [{"role": "user", "content": "Hi"}],
                   "temperature": 0.5, "top_p": 0.9, "stop_sequences": ["END"],
                   "metadata": {"user_id": "u-1"}, "stream": false}),
        ),
        (
            "several system messages (developer too) become blocks",
            json!({"model": "m", "max_completion_tokens": 77, "messages": [
                {"role": "developer", "content": "A"},
                {"role": "system", "content": [{"type": "text", "text": "B"}]},
                {"role": "user", "content": [{"type": "text", "text": "Q"}]}]}),
            json!({"model": "m", "max_tokens": 77,
                   "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
                   "messages": [{"role": "user", "content": [{"type": "text", "text": "Q"}]}]}),
        ),
        (
            "images: base64 data URL and https URL",
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg", "detail": "auto"}}]}]}),
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}}]}]}),
        ),
        (
            "tools, parallel tool calls, their results in one turn, then words",
            json!({"model": "m", "max_tokens": 100,
                "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
                          {"type": "function", "function": {"name": "now"}}],
                "tool_choice": "required", "parallel_tool_calls": false,
                "messages": [
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
                {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "21C"}]},
                {"role": "user", "content": "Thanks"}]}),
            json!({"model": "m", "max_tokens": 100,
                "tools": [{"name": "get_weather", "description": "Weather",
                           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
                          {"name": "now", "input_schema": {"type": "object", "properties": {}}}],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
                "messages": [
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {"city": "Rome"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
                    {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "21C"}]},
                    {"type": "text", "text": "Thanks"}]}]}),
        ),
        (
            "a named tool choice; a call with no content and empty arguments",
            json!({"model": "m", "max_tokens": 1,
                "tools": [{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}, "strict": false}}],
                "tool_choice": {"type": "function", "function": {"name": "now"}},
                "messages": [{"role": "user", "content": "t?"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "now", "arguments": ""}}]},
                    {"role": "tool", "tool_call_id": "c", "content": "noon"}]}),
            json!({"model": "m", "max_tokens": 1,
                "tools": [{"name": "now", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "now"},
                "messages": [{"role": "user", "content": "t?"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "c", "name": "now", "input": {}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": "noon"}]}]}),
        ),
        (
            "a stream asking for usage (Anthropic streams always carry it)",
            json!({"model": "m", "max_tokens": 9, "stream": true, "stream_options": {"include_usage": true},
                   "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                                {"role": "user", "content": "z"}]}),
            json!({"model": "m", "max_tokens": 9, "stream": true,
                   "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                                {"role": "user", "content": "z"}]}),
        ),
    ];
    for (name, openai, anthropic) in cases {
        assert_eq!(to_anthropic(openai), anthropic, "{name}");
    }
    let t = request::openai_to_anthropic(
        &json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}, "messages": []}),
        &opts(),
    )
    .unwrap();
    assert!(t.stream && t.usage_chunk);
}

#[test]
fn anthropic_requests_as_openai() {
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "system string, sampling, stop sequences, metadata, stream",
            json!({"model": "c", "max_tokens": 50, "system": "Be brief.",
                   "messages": [{"role": "user", "content": "Hi"}],
                   "temperature": 0.2, "top_p": 0.5, "stop_sequences": ["A", "B"],
                   "metadata": {"user_id": "u"}, "stream": true,
                   "thinking": {"type": "disabled"}, "service_tier": "auto"}),
            json!({"model": "c", "max_tokens": 50, "messages": [
                       {"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "Hi"}],
                   "temperature": 0.2, "top_p": 0.5, "stop": ["A", "B"], "user": "u",
                   "stream": true, "stream_options": {"include_usage": true}}),
        ),
        (
            "system blocks with cache hints (dropped), images",
            json!({"model": "c", "max_tokens": 50,
                   "system": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}],
                   "messages": [{"role": "user", "content": [
                       {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4A=="}},
                       {"type": "image", "source": {"type": "url", "url": "https://e.x/a.webp"}},
                       {"type": "text", "text": "Which?", "cache_control": {"type": "ephemeral"}}]}]}),
            json!({"model": "c", "max_tokens": 50, "messages": [
                       {"role": "system", "content": [{"type": "text", "text": "S"}]},
                       {"role": "user", "content": [
                           {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4A=="}},
                           {"type": "image_url", "image_url": {"url": "https://e.x/a.webp"}},
                           {"type": "text", "text": "Which?"}]}]}),
        ),
        (
            "tools, parallel tool use, results then words, tool choice",
            json!({"model": "c", "max_tokens": 10,
                "tools": [{"name": "get_weather", "description": "W", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
                "messages": [
                    {"role": "user", "content": "Paris and Rome?"},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                        {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "21C"}], "is_error": false},
                        {"type": "text", "text": "Thanks"}]}]}),
            json!({"model": "c", "max_tokens": 10,
                "tools": [{"type": "function", "function": {"name": "get_weather", "description": "W", "parameters": {"type": "object"}}}],
                "tool_choice": "required", "parallel_tool_calls": false,
                "messages": [
                    {"role": "user", "content": "Paris and Rome?"},
                    {"role": "assistant", "content": [{"type": "text", "text": "Checking."}], "tool_calls": [
                        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                        {"id": "toolu_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]},
                    {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
                    {"role": "tool", "tool_call_id": "toolu_2", "content": [{"type": "text", "text": "21C"}]},
                    {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}]}),
        ),
        (
            "tool use alone; a named tool; max_completion_tokens when configured",
            json!({"model": "c", "max_tokens": 10,
                "tools": [{"type": "custom", "name": "now", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "now"},
                "messages": [{"role": "user", "content": "t?"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "now", "input": {}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "noon"}]}]}),
            json!({"model": "c", "max_tokens": 10,
                "tools": [{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}],
                "tool_choice": {"type": "function", "function": {"name": "now"}},
                "messages": [{"role": "user", "content": "t?"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "t1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "t1", "content": "noon"}]}),
        ),
    ];
    for (name, anthropic, openai) in cases {
        assert_eq!(to_openai(anthropic), openai, "{name}");
    }
    let o = Options {
        openai_max_tokens_field: MaxTokensField::MaxCompletionTokens,
        ..opts()
    };
    let t =
        request::anthropic_to_openai(&json!({"model": "c", "max_tokens": 3, "messages": []}), &o)
            .unwrap();
    assert_eq!(t.body["max_completion_tokens"], 3);
    assert!(t.body.get("max_tokens").is_none());
}

fn refused(from: Family, body: Value) -> (String, Reason) {
    let r = match from {
        Family::OpenAi => request::openai_to_anthropic(&body, &opts()),
        Family::Anthropic => request::anthropic_to_openai(&body, &opts()),
    };
    match r {
        Ok(t) => panic!("translated: {}", t.body),
        Err(e) => (e.field, e.reason),
    }
}

#[test]
fn what_openai_requests_cannot_say_in_anthropic_is_refused() {
    use Reason::*;
    let user = json!([{"role": "user", "content": "hi"}]);
    let with = |k: &str, v: Value| {
        let mut b = json!({"model": "m", "messages": user.clone()});
        b[k] = v;
        b
    };
    let cases: Vec<(Value, &str, Reason)> = vec![
        (with("n", json!(2)), "n", NoEquivalent),
        (with("logprobs", json!(true)), "logprobs", NoEquivalent),
        (with("top_logprobs", json!(2)), "top_logprobs", NoEquivalent),
        (
            with(
                "response_format",
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
            ),
            "response_format",
            NoEquivalent,
        ),
        (
            with("response_format", json!({"type": "json_object"})),
            "response_format",
            NoEquivalent,
        ),
        (with("temperature", json!(1.5)), "temperature", OutOfRange),
        (with("temperature", json!("hot")), "temperature", Malformed),
        (with("seed", json!(7)), "seed", NoEquivalent),
        (
            with("presence_penalty", json!(0.5)),
            "presence_penalty",
            NoEquivalent,
        ),
        (
            with("logit_bias", json!({"50256": -100})),
            "logit_bias",
            NoEquivalent,
        ),
        (
            with("audio", json!({"voice": "alloy"})),
            "audio",
            NoEquivalent,
        ),
        (
            with("modalities", json!(["text", "audio"])),
            "modalities",
            NoEquivalent,
        ),
        (
            with("reasoning_effort", json!("high")),
            "reasoning_effort",
            NoEquivalent,
        ),
        (with("store", json!(true)), "store", NoEquivalent),
        (
            with("stream_options", json!({"include_usage": true})),
            "stream_options",
            Order,
        ),
        (
            with("stream_options", json!({"include_obfuscation": true})),
            "stream_options.include_obfuscation",
            Unknown,
        ),
        (with("max_tokens", json!(0)), "max_tokens", Malformed),
        (with("frobnicate", json!(1)), "frobnicate", Unknown),
        (with("my secret plan", json!(1)), "<unnamed field>", Unknown),
        (
            with("tool_choice", json!("sometimes")),
            "tool_choice",
            OutOfRange,
        ),
        (
            with(
                "tools",
                json!([{"type": "function", "function": {"name": "f", "strict": true}}]),
            ),
            "tools[0].function.strict",
            NoEquivalent,
        ),
        (
            with(
                "tools",
                json!([{"type": "custom", "custom": {"name": "f"}}]),
            ),
            "tools[0].type",
            NoEquivalent,
        ),
        (
            json!({"model": "m", "max_tokens": 1, "max_completion_tokens": 1, "messages": user.clone()}),
            "max_tokens",
            Duplicate,
        ),
        (json!({"messages": user.clone()}), "model", Missing),
        (json!({"model": "m"}), "messages", Missing),
        (
            with(
                "messages",
                json!([{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]),
            ),
            "messages[1].role",
            Order,
        ),
        (
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]),
            ),
            "messages[0].content[0].type",
            NoEquivalent,
        ),
        (
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]),
            ),
            "messages[0].content[0].type",
            NoEquivalent,
        ),
        (
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://e/x.png", "detail": "high"}}]}]),
            ),
            "messages[0].content[0].image_url.detail",
            NoEquivalent,
        ),
        (
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/svg+xml;base64,PHN2Zz4="}}]}]),
            ),
            "messages[0].content[0].image_url.url",
            OutOfRange,
        ),
        (
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://e/x.png"}}]}]),
            ),
            "messages[0].content[0].image_url.url",
            OutOfRange,
        ),
        (
            with(
                "messages",
                json!([{"role": "user", "name": "bob", "content": "hi"}]),
            ),
            "messages[0].name",
            Unknown,
        ),
        (
            with(
                "messages",
                json!([{"role": "function", "name": "f", "content": "x"}]),
            ),
            "messages[0].role",
            NoEquivalent,
        ),
        (
            with(
                "messages",
                json!([{"role": "assistant", "content": "x", "refusal": "no"}]),
            ),
            "messages[0].refusal",
            NoEquivalent,
        ),
        (
            with(
                "messages",
                json!([{"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]),
            ),
            "messages[0].content[0].type",
            NoEquivalent,
        ),
        (
            with(
                "messages",
                json!([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]),
            ),
            "messages[0].tool_calls[0].function.arguments",
            Malformed,
        ),
        (
            with(
                "messages",
                json!([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]),
            ),
            "messages[0].tool_calls[0].function.arguments",
            Malformed,
        ),
        (
            with(
                "messages",
                json!([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1,\"a\":2}"}}]}]),
            ),
            "messages[0].tool_calls[0].function.arguments",
            Duplicate,
        ),
        (
            with("messages", json!([{"role": "assistant"}])),
            "messages[0].content",
            Missing,
        ),
        (
            with("messages", json!([{"role": "tool", "content": "x"}])),
            "messages[0].tool_call_id",
            Malformed,
        ),
        (with("messages", json!("hi")), "messages", Malformed),
        (json!([1]), "body", Malformed),
    ];
    for (body, field, reason) in cases {
        assert_eq!(
            refused(Family::OpenAi, body.clone()),
            (field.to_string(), reason),
            "{body}"
        );
    }
}

#[test]
fn what_anthropic_requests_cannot_say_in_openai_is_refused() {
    use Reason::*;
    let with = |k: &str, v: Value| {
        let mut b =
            json!({"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
        b[k] = v;
        b
    };
    let msgs = |m: Value| with("messages", m);
    let cases: Vec<(Value, &str, Reason)> = vec![
        (
            with(
                "thinking",
                json!({"type": "enabled", "budget_tokens": 1024}),
            ),
            "thinking",
            NoEquivalent,
        ),
        (with("top_k", json!(5)), "top_k", NoEquivalent),
        (
            with("service_tier", json!("standard_only")),
            "service_tier",
            NoEquivalent,
        ),
        (
            with("mcp_servers", json!([{"type": "url"}])),
            "mcp_servers",
            NoEquivalent,
        ),
        (
            with("metadata", json!({"user_id": "u", "x": 1})),
            "metadata.x",
            Unknown,
        ),
        (with("inference_geo", json!("us")), "inference_geo", Unknown),
        (json!({"model": "c", "messages": []}), "max_tokens", Missing),
        (
            with(
                "tools",
                json!([{"type": "web_search_20250305", "name": "web_search"}]),
            ),
            "tools[0].type",
            NoEquivalent,
        ),
        (
            with("tools", json!([{"name": "f"}])),
            "tools[0].input_schema",
            Malformed,
        ),
        (
            with("tool_choice", json!({"type": "auto", "x": 1})),
            "tool_choice.x",
            Unknown,
        ),
        (
            with("system", json!([{"type": "image", "source": {}}])),
            "system[0].type",
            NoEquivalent,
        ),
        (
            msgs(
                json!([{"role": "user", "content": [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}}]}]),
            ),
            "messages[0].content[0].type",
            NoEquivalent,
        ),
        (
            msgs(
                json!([{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]),
            ),
            "messages[0].content[0].source.type",
            NoEquivalent,
        ),
        (
            msgs(
                json!([{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/tiff", "data": "x"}}]}]),
            ),
            "messages[0].content[0].source.media_type",
            OutOfRange,
        ),
        (
            msgs(
                json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]),
            ),
            "messages[0].content[1]",
            Order,
        ),
        (
            msgs(
                json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x", "is_error": true}]}]),
            ),
            "messages[0].content[0].is_error",
            NoEquivalent,
        ),
        (
            msgs(
                json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}]}]),
            ),
            "messages[0].content[0].content[0].type",
            NoEquivalent,
        ),
        (
            msgs(
                json!([{"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}]}]),
            ),
            "messages[0].content[0].type",
            NoEquivalent,
        ),
        (
            msgs(
                json!([{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}]),
            ),
            "messages[0].content[0].type",
            NoEquivalent,
        ),
        (
            msgs(json!([{"role": "assistant", "content": [
                {"type": "tool_use", "id": "t", "name": "f", "input": {}}, {"type": "text", "text": "after"}]}])),
            "messages[0].content[1]",
            Order,
        ),
        (
            msgs(
                json!([{"role": "user", "content": [{"type": "text", "text": "a", "citations": [{"type": "x"}]}]}]),
            ),
            "messages[0].content[0].citations",
            NoEquivalent,
        ),
        (
            msgs(json!([{"role": "system", "content": "x"}])),
            "messages[0].role",
            NoEquivalent,
        ),
        (
            msgs(json!([{"role": "user", "content": 5}])),
            "messages[0].content",
            Malformed,
        ),
    ];
    for (body, field, reason) in cases {
        assert_eq!(
            refused(Family::Anthropic, body.clone()),
            (field.to_string(), reason),
            "{body}"
        );
    }
}

#[test]
fn duplicate_keys_in_the_body_are_refused() {
    let e = request::translate(
        Family::OpenAi,
        br#"{"model":"m","model":"n","messages":[]}"#,
        &opts(),
    )
    .unwrap_err();
    assert_eq!((e.field.as_str(), e.reason), ("body", Reason::Duplicate));
    let e = request::translate(Family::Anthropic, b"{\"model\":", &opts()).unwrap_err();
    assert_eq!((e.field.as_str(), e.reason), ("body", Reason::Malformed));
}

#[test]
fn refusals_name_fields_never_values() {
    let secret = "SECRET-PROMPT-TEXT";
    let bodies = [
        json!({"model": "m", "messages": [{"role": "user", "content": [{"type": secret}]}]}),
        json!({"model": "m", "messages": [{"role": secret, "content": "x"}]}),
        json!({"model": "m", "temperature": 1.7, "messages": [{"role": "user", "content": secret}]}),
        json!({"model": "m", secret: 1, "messages": []}),
    ];
    for b in bodies {
        let e = request::openai_to_anthropic(&b, &opts()).unwrap_err();
        assert!(!e.to_string().contains(secret), "{e}");
        let e = request::anthropic_to_openai(&b, &opts()).unwrap_err();
        assert!(!e.to_string().contains(secret), "{e}");
    }
}

// ----- responses ------------------------------------------------------

#[test]
fn openai_answers_as_anthropic() {
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "text, cached prompt tokens",
            json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
                   "system_fingerprint": "fp", "choices": [{"index": 0, "message": {"role": "assistant",
                   "content": "Hello!", "refusal": null, "annotations": []}, "logprobs": null, "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107,
                             "prompt_tokens_details": {"cached_tokens": 60}}}),
            json!({"id": "chatcmpl-1", "type": "message", "role": "assistant", "model": "gpt-4o",
                   "content": [{"type": "text", "text": "Hello!"}], "stop_reason": "end_turn", "stop_sequence": null,
                   "usage": {"input_tokens": 40, "output_tokens": 7, "cache_read_input_tokens": 60,
                             "cache_creation_input_tokens": 0}}),
        ),
        (
            "parallel tool calls",
            json!({"id": "c2", "model": "gpt-4o", "choices": [{"index": 0, "message": {"role": "assistant",
                   "content": null, "tool_calls": [
                     {"id": "call_a", "type": "function", "function": {"name": "w", "arguments": "{\"city\":\"Paris\"}"}},
                     {"id": "call_b", "type": "function", "function": {"name": "w", "arguments": "{\"city\":\"Rome\"}"}}]},
                   "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 5, "completion_tokens": 9}}),
            json!({"id": "c2", "type": "message", "role": "assistant", "model": "gpt-4o",
                   "content": [{"type": "tool_use", "id": "call_a", "name": "w", "input": {"city": "Paris"}},
                               {"type": "tool_use", "id": "call_b", "name": "w", "input": {"city": "Rome"}}],
                   "stop_reason": "tool_use", "stop_sequence": null,
                   "usage": {"input_tokens": 5, "output_tokens": 9, "cache_read_input_tokens": 0,
                             "cache_creation_input_tokens": 0}}),
        ),
        (
            "cut by the output limit",
            json!({"id": "c3", "model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hel"},
                   "finish_reason": "length"}]}),
            json!({"id": "c3", "type": "message", "role": "assistant", "model": "m",
                   "content": [{"type": "text", "text": "Hel"}], "stop_reason": "max_tokens", "stop_sequence": null,
                   "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0,
                             "cache_creation_input_tokens": 0}}),
        ),
        (
            "a refusal",
            json!({"id": "c4", "model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": null,
                   "refusal": "I can't help with that."}, "finish_reason": "stop"}]}),
            json!({"id": "c4", "type": "message", "role": "assistant", "model": "m",
                   "content": [{"type": "text", "text": "I can't help with that."}], "stop_reason": "refusal",
                   "stop_sequence": null,
                   "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0,
                             "cache_creation_input_tokens": 0}}),
        ),
    ];
    for (name, openai, anthropic) in cases {
        assert_eq!(
            response::openai_to_anthropic(&openai).unwrap(),
            anthropic,
            "{name}"
        );
    }
    for (bad, field) in [
        (
            json!({"id": "x", "model": "m", "choices": [{}, {}]}),
            "choices",
        ),
        (
            json!({"id": "x", "model": "m", "choices": [{"message": {"content": "a"}, "finish_reason": "weird"}]}),
            "choices[0].finish_reason",
        ),
        (
            json!({"id": "x", "model": "m", "choices": [{"message": {"tool_calls": [
                {"id": "c", "function": {"name": "f", "arguments": "{\"a\":"}}]}, "finish_reason": "tool_calls"}]}),
            "choices[0].message.tool_calls[0].function.arguments",
        ),
        (json!({"model": "m", "choices": []}), "id"),
    ] {
        assert_eq!(
            response::openai_to_anthropic(&bad).unwrap_err().field,
            field,
            "{bad}"
        );
    }
}

#[test]
fn anthropic_answers_as_openai() {
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "text and tool use, cache reads and writes",
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
                   "content": [{"type": "text", "text": "Let me "}, {"type": "text", "text": "check."},
                               {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Paris"}},
                               {"type": "tool_use", "id": "toolu_2", "name": "w", "input": {}}],
                   "stop_reason": "tool_use", "stop_sequence": null,
                   "usage": {"input_tokens": 10, "output_tokens": 20, "cache_read_input_tokens": 30,
                             "cache_creation_input_tokens": 5}}),
            json!({"id": "msg_1", "object": "chat.completion", "created": 1700000000, "model": "claude-x",
                   "choices": [{"index": 0, "logprobs": null, "finish_reason": "tool_calls", "message": {
                       "role": "assistant", "content": "Let me check.", "refusal": null, "tool_calls": [
                       {"id": "toolu_1", "type": "function", "function": {"name": "w", "arguments": "{\"city\":\"Paris\"}"}},
                       {"id": "toolu_2", "type": "function", "function": {"name": "w", "arguments": "{}"}}]}}],
                   "usage": {"prompt_tokens": 45, "completion_tokens": 20, "total_tokens": 65,
                             "prompt_tokens_details": {"cached_tokens": 30}}}),
        ),
        (
            "a stop sequence",
            json!({"id": "msg_2", "type": "message", "role": "assistant", "model": "c",
                   "content": [{"type": "text", "text": "a"}], "stop_reason": "stop_sequence", "stop_sequence": "END",
                   "usage": {"input_tokens": 1, "output_tokens": 1}}),
            json!({"id": "msg_2", "object": "chat.completion", "created": 1700000000, "model": "c",
                   "choices": [{"index": 0, "logprobs": null, "finish_reason": "stop", "message": {
                       "role": "assistant", "content": "a", "refusal": null}}],
                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2,
                             "prompt_tokens_details": {"cached_tokens": 0}}}),
        ),
    ];
    for (name, anthropic, openai) in cases {
        assert_eq!(
            response::anthropic_to_openai(&anthropic, 1_700_000_000).unwrap(),
            openai,
            "{name}"
        );
    }
    let thinking = json!({"id": "m", "model": "c", "stop_reason": "end_turn",
                          "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}]});
    let e = response::anthropic_to_openai(&thinking, 0).unwrap_err();
    assert_eq!(
        (e.field.as_str(), e.reason),
        ("content[0].type", Reason::NoEquivalent)
    );
}

#[test]
fn answers_translate_from_bytes_and_back() {
    let openai = br#"{"id":"c","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
    let anthropic = response::translate(Family::OpenAi, openai, 0).unwrap();
    let back = response::translate(Family::Anthropic, &anthropic, 9).unwrap();
    let v: Value = serde_json::from_slice(&back).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "hi");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert!(response::translate(Family::OpenAi, b"{\"id\":1,\"id\":2}", 0).is_err());
}
