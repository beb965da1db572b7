"""The official SDKs against translated routes (issue 24).

Usage: families.py GATEWAY_URL AGENT_KEY
Routes (tests/translate.rs): claude-via-openai (an OpenAI-shaped
provider), gpt-via-anthropic (an Anthropic provider), claude-fallback
(Anthropic 503, OpenAI 503, then a local OpenAI-compatible server).
"""
import json
import sys

import anthropic
import openai

base, key = sys.argv[1], sys.argv[2]
HELLO = "Hello from the Loopgate mock provider. "

an = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)

# Anthropic SDK, OpenAI-shaped upstream: create, and the streaming helper.
m = an.messages.create(
    model="claude-via-openai", max_tokens=64, system="Be brief.",
    messages=[{"role": "user", "content": "hi"}],
)
assert m.content[0].text == HELLO, m
assert m.stop_reason == "end_turn", m
assert m.usage.output_tokens == 8, m.usage

with an.messages.stream(
    model="claude-via-openai", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
) as stream:
    streamed = "".join(stream.text_stream)
    final = stream.get_final_message()
assert streamed == HELLO, repr(streamed)
assert final.content[0].text == HELLO, final
assert final.stop_reason == "end_turn", final
assert final.usage.output_tokens == 8, final.usage
assert final.usage.input_tokens > 0, final.usage
print("anthropic stream via openai:", final.model_dump_json())

# A tool-result turn goes through (the mock answers text).
m = an.messages.create(
    model="claude-via-openai", max_tokens=64,
    tools=[{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    messages=[
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "21C"},
        ]},
    ],
)
assert m.content[0].text == HELLO, m

# Parallel tool calls answered by OpenAI reach the Anthropic SDK as
# tool_use blocks, ids and inputs kept (the mock's raw-body fault).
calls = {"id": "chatcmpl-t", "object": "chat.completion", "created": 1, "model": "m",
         "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
             "role": "assistant", "content": None, "tool_calls": [
                 {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                 {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]}}],
         "usage": {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50,
                   "prompt_tokens_details": {"cached_tokens": 10}}}
m = an.messages.create(
    model="claude-via-openai", max_tokens=64, messages=[{"role": "user", "content": "Weather?"}],
    extra_headers={"x-mock-body": json.dumps(calls)},
)
assert [(b.type, b.id, b.input) for b in m.content] == [
    ("tool_use", "call_a", {"city": "Paris"}), ("tool_use", "call_b", {"city": "Rome"})], m
assert m.stop_reason == "tool_use", m
assert (m.usage.input_tokens, m.usage.cache_read_input_tokens) == (20, 10), m.usage

# An upstream error, in Anthropic's shape with its status.
try:
    an.messages.create(
        model="claude-via-openai", max_tokens=64, messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-mock-status": "429"},
    )
    raise AssertionError("a 429 must raise")
except anthropic.RateLimitError as e:
    assert e.status_code == 429
    assert e.body["error"]["type"] == "rate_limit_error", e.body

# Untranslatable: refused before sending, the field named.
try:
    an.messages.create(
        model="claude-via-openai", max_tokens=64, messages=[{"role": "user", "content": "hi"}],
        extra_body={"top_k": 5},
    )
    raise AssertionError("top_k must be refused")
except anthropic.BadRequestError as e:
    assert "top_k" in str(e.body), e.body
    assert e.response.headers["x-loopgate-error"] == "untranslatable_request"

# A stream cut mid-way raises in the SDK.
try:
    with an.messages.stream(
        model="claude-via-openai", max_tokens=64, messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-mock-reset-after": "4"},
    ) as stream:
        stream.get_final_message()
    raise AssertionError("a cut stream must raise")
except anthropic.APIError:
    pass

# The seed's scenario: Anthropic and OpenAI answer 503, a local server answers.
with an.messages.stream(
    model="claude-fallback", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
) as stream:
    final = stream.get_final_message()
    assert stream.response.headers["x-loopgate-fallback"] == "an_down"
    assert stream.response.headers["x-loopgate-provider"] == "local"
assert final.content[0].text == HELLO, final
raw = an.messages.with_raw_response.create(
    model="claude-fallback", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
)
assert raw.headers["x-loopgate-provider"] == "local"
assert raw.parse().content[0].text == HELLO

# OpenAI SDK, Anthropic upstream: create, and the streaming helper.
oa = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
r = oa.chat.completions.create(model="gpt-via-anthropic", messages=[{"role": "user", "content": "hi"}])
assert r.choices[0].message.content == HELLO, r
assert r.choices[0].finish_reason == "stop", r
with oa.chat.completions.stream(
    model="gpt-via-anthropic", messages=[{"role": "user", "content": "hi"}],
    stream_options={"include_usage": True},
) as stream:
    for _ in stream:
        pass
    done = stream.get_final_completion()
assert done.choices[0].message.content == HELLO, done
assert done.usage is not None and done.usage.completion_tokens == 8, done.usage

uses = {"id": "msg_t", "type": "message", "role": "assistant", "model": "c", "stop_reason": "tool_use",
        "stop_sequence": None, "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_b", "name": "get_weather", "input": {"city": "Rome"}}],
        "usage": {"input_tokens": 5, "output_tokens": 9, "cache_read_input_tokens": 40}}
r = oa.chat.completions.create(
    model="gpt-via-anthropic", messages=[{"role": "user", "content": "Weather?"}],
    extra_headers={"x-mock-body": json.dumps(uses)},
)
msg = r.choices[0].message
assert msg.content == "Checking.", r
assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
    ("toolu_a", "get_weather", {"city": "Paris"}), ("toolu_b", "get_weather", {"city": "Rome"})], r
assert r.choices[0].finish_reason == "tool_calls", r
assert r.usage.prompt_tokens == 45 and r.usage.prompt_tokens_details.cached_tokens == 40, r.usage

try:
    oa.chat.completions.create(
        model="gpt-via-anthropic", messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-mock-status": "529"},
    )
    raise AssertionError("a 529 must raise")
except openai.APIStatusError as e:
    assert e.status_code == 529, e
    assert e.body["code"] == "overloaded_error", e.body

print("families ok")
