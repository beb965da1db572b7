"""The official SDKs against translated routes (issue 24).

Usage: families.py GATEWAY_URL AGENT_KEY MOCK_URL
MOCK_URL is the provider mock behind the routes (its /_mock/requests
shows what reached it). Routes (tests/translate.rs): claude-via-openai (an OpenAI-shaped
provider), gpt-via-anthropic (an Anthropic provider), claude-fallback
(Anthropic 503, OpenAI 503, then a local OpenAI-compatible server).
"""
import json
import sys
import urllib.request

import anthropic
import openai

base, key, mock = sys.argv[1], sys.argv[2], sys.argv[3]
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

# ----- Parallel tool calls, both directions (the mock's x-mock-tool-calls) --

def last_upstream_body():
    with urllib.request.urlopen(mock + "/_mock/requests", timeout=10) as r:
        reqs = json.load(r)["requests"]
    return reqs[-1]["path"], json.loads(reqs[-1]["body"])

TWO_CALLS = {"x-mock-tool-calls": "2"}
WANT_INPUTS = [{"city": "Paris", "n": 0}, {"city": "Rome", "n": 1}]
AN_TOOLS = [
    {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
    {"name": "get_time", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
]
OA_TOOLS = [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
            for t in AN_TOOLS]

# Anthropic SDK, OpenAI-shaped upstream: the streaming helpers assemble two
# tool_use blocks from OpenAI's tool-call deltas (arguments in pieces).
for text in ("0", "1"):
    with an.messages.stream(
        model="claude-via-openai", max_tokens=64, tools=AN_TOOLS,
        messages=[{"role": "user", "content": "Weather and time in Paris and Rome?"}],
        extra_headers={**TWO_CALLS, "x-mock-tool-text": text},
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    blocks = [b for b in final.content if b.type == "tool_use"]
    assert [(b.id, b.name, b.input) for b in blocks] == [
        ("call_mock_0", "get_weather", WANT_INPUTS[0]), ("call_mock_1", "get_time", WANT_INPUTS[1])], final
    assert final.stop_reason == "tool_use", final
    assert kinds.count("input_json") >= 6, kinds  # several pieces per call
    assert final.usage.output_tokens > 0, final.usage
    if text == "1":
        assert final.content[0].type == "text" and final.content[0].text == HELLO, final
    else:
        assert len(final.content) == 2, final
    path, sent = last_upstream_body()
    assert path == "/v1/chat/completions" and sent["tools"][1]["function"]["name"] == "get_time", sent
print("anthropic stream tool calls via openai:", final.model_dump_json())

m = an.messages.create(
    model="claude-via-openai", max_tokens=64, tools=AN_TOOLS,
    messages=[{"role": "user", "content": "Weather?"}], extra_headers=TWO_CALLS,
)
assert [(b.type, b.id, b.name, b.input) for b in m.content] == [
    ("tool_use", "call_mock_0", "get_weather", WANT_INPUTS[0]),
    ("tool_use", "call_mock_1", "get_time", WANT_INPUTS[1])], m
assert m.stop_reason == "tool_use", m

# A stream cut in the middle of a tool call's arguments raises, with no
# message handed over as complete.
an_short = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=20)
try:
    with an_short.messages.stream(
        model="claude-via-openai", max_tokens=64, tools=AN_TOOLS,
        messages=[{"role": "user", "content": "Weather?"}],
        extra_headers={**TWO_CALLS, "x-mock-reset-after": "3"},
    ) as stream:
        stream.get_final_message()
    raise AssertionError("a cut tool stream must raise")
except anthropic.APIStatusError as e:
    assert e.body["type"] == "error" and e.body["error"]["type"] == "api_error", e.body

# OpenAI SDK, Anthropic upstream: the streaming helpers assemble two tool
# calls from tool_use blocks and input_json_delta pieces.
oa_short = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=20)
for text in ("0", "1"):
    with oa.chat.completions.stream(
        model="gpt-via-anthropic", tools=OA_TOOLS,
        messages=[{"role": "user", "content": "Weather and time in Paris and Rome?"}],
        stream_options={"include_usage": True},
        extra_headers={**TWO_CALLS, "x-mock-tool-text": text},
    ) as stream:
        deltas = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
        done = stream.get_final_completion()
    choice = done.choices[0]
    calls = choice.message.tool_calls
    assert [(c.id, c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("toolu_mock_0", "function", "get_weather", WANT_INPUTS[0]),
        ("toolu_mock_1", "function", "get_time", WANT_INPUTS[1])], done
    assert choice.finish_reason == "tool_calls", done
    assert [d.index for d in deltas].count(0) >= 3 and [d.index for d in deltas].count(1) >= 3, deltas
    # As from OpenAI itself: no content at all before the calls.
    assert choice.message.content == (HELLO if text == "1" else None), done
    assert done.usage is not None and done.usage.completion_tokens > 0, done.usage
    path, sent = last_upstream_body()
    assert path == "/v1/messages" and [t["name"] for t in sent["tools"]] == ["get_weather", "get_time"], sent
print("openai stream tool calls via anthropic:", done.model_dump_json())

r = oa.chat.completions.create(
    model="gpt-via-anthropic", tools=OA_TOOLS,
    messages=[{"role": "user", "content": "Weather?"}], extra_headers=TWO_CALLS,
)
calls = r.choices[0].message.tool_calls
assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
    ("toolu_mock_0", "get_weather", WANT_INPUTS[0]), ("toolu_mock_1", "get_time", WANT_INPUTS[1])], r
assert r.choices[0].finish_reason == "tool_calls", r
assert r.choices[0].message.content is None, r

# The tool-result turn: the assistant's calls and the tool messages reach
# Anthropic as tool_use and tool_result blocks with the same ids.
turn = [
    {"role": "user", "content": "Weather and time in Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in calls]},
    {"role": "tool", "tool_call_id": calls[0].id, "content": "18C"},
    {"role": "tool", "tool_call_id": calls[1].id, "content": "21:00"},
]
with oa.chat.completions.stream(model="gpt-via-anthropic", tools=OA_TOOLS, messages=turn) as stream:
    done = stream.get_final_completion()
assert done.choices[0].message.content == HELLO, done
assert done.choices[0].finish_reason == "stop", done
path, sent = last_upstream_body()
assert path == "/v1/messages", path
assert sent["messages"][1] == {"role": "assistant", "content": [
    {"type": "tool_use", "id": "toolu_mock_0", "name": "get_weather", "input": WANT_INPUTS[0]},
    {"type": "tool_use", "id": "toolu_mock_1", "name": "get_time", "input": WANT_INPUTS[1]}]}, sent
assert sent["messages"][2] == {"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "toolu_mock_0", "content": "18C"},
    {"type": "tool_result", "tool_use_id": "toolu_mock_1", "content": "21:00"}]}, sent
assert len(sent["messages"]) == 3, sent

# Upstream errors: the SDK's own error classes, the status kept, an
# OpenAI-shaped body.
for status, cls, ty in [("429", openai.RateLimitError, "rate_limit_error"),
                        ("500", openai.InternalServerError, "server_error")]:
    try:
        with oa_short.chat.completions.stream(
            model="gpt-via-anthropic", tools=OA_TOOLS, messages=[{"role": "user", "content": "hi"}],
            extra_headers={**TWO_CALLS, "x-mock-status": status},
        ) as stream:
            stream.get_final_completion()
        raise AssertionError(f"a {status} must raise")
    except cls as e:
        assert e.status_code == int(status), e
        assert e.body["type"] == ty and isinstance(e.body["message"], str), e.body
        assert e.body["code"] == ("rate_limit_error" if status == "429" else "api_error"), e.body
        assert e.response.headers["content-type"].startswith("application/json"), e.response.headers

# A stream cut mid-way (before any block, in the text, before and inside
# a call's arguments, between two calls) raises an APIError with an
# OpenAI-shaped body: never a hang, never a completion handed over as if
# whole.
for cut, text in [("1", "0"), ("4", "1"), ("3", "0"), ("5", "0"), ("9", "0")]:
    got = []
    try:
        with oa_short.chat.completions.stream(
            model="gpt-via-anthropic", tools=OA_TOOLS, messages=[{"role": "user", "content": "hi"}],
            extra_headers={**TWO_CALLS, "x-mock-tool-text": text, "x-mock-reset-after": cut},
        ) as stream:
            for e in stream:
                got.append(e.type)
            stream.get_final_completion()
        raise AssertionError(f"a stream cut after {cut} events must raise")
    except openai.APIStatusError:
        raise
    except openai.APIError as e:
        assert e.body["code"] == "upstream_error" and e.body["retryable"] is True, (cut, e.body)
        assert isinstance(e.body["message"], str) and e.body["message"], e.body
    assert "chunk" in got or cut == "1", (cut, got)

# Anthropic SDK, OpenAI-shaped upstream, streamed: the tool-result turn
# reaches OpenAI as the assistant's tool_calls and tool messages, ids and
# arguments kept, and upstream errors raise the SDK's own classes.
an_turn = [
    {"role": "user", "content": "Weather and time in Paris and Rome?"},
    {"role": "assistant", "content": [
        {"type": "tool_use", "id": "call_mock_0", "name": "get_weather", "input": WANT_INPUTS[0]},
        {"type": "tool_use", "id": "call_mock_1", "name": "get_time", "input": WANT_INPUTS[1]},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_mock_0", "content": "18C"},
        {"type": "tool_result", "tool_use_id": "call_mock_1", "content": [{"type": "text", "text": "21:00"}]},
    ]},
]
with an.messages.stream(model="claude-via-openai", max_tokens=64, tools=AN_TOOLS, messages=an_turn) as stream:
    final = stream.get_final_message()
assert final.content[0].text == HELLO and final.stop_reason == "end_turn", final
path, sent = last_upstream_body()
assert path == "/v1/chat/completions", path
assistant = sent["messages"][1]
assert assistant["role"] == "assistant", sent
assert [(c["id"], c["type"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in assistant["tool_calls"]] == [
    ("call_mock_0", "function", "get_weather", WANT_INPUTS[0]),
    ("call_mock_1", "function", "get_time", WANT_INPUTS[1])], sent
tools_back = [(m["role"], m["tool_call_id"]) for m in sent["messages"][2:]]
assert tools_back == [("tool", "call_mock_0"), ("tool", "call_mock_1")], sent
assert sent["messages"][2]["content"] == "18C", sent
assert "21:00" in json.dumps(sent["messages"][3]["content"]), sent

for status, cls, ty in [("429", anthropic.RateLimitError, "rate_limit_error"),
                        ("500", anthropic.InternalServerError, "api_error")]:
    try:
        with an_short.messages.stream(
            model="claude-via-openai", max_tokens=64, tools=AN_TOOLS,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={**TWO_CALLS, "x-mock-status": status},
        ) as stream:
            stream.get_final_message()
        raise AssertionError(f"a {status} must raise")
    except cls as e:
        assert e.status_code == int(status), e
        assert e.body["type"] == "error" and e.body["error"]["type"] == ty, e.body
        assert isinstance(e.body["error"]["message"], str), e.body

print("families ok")
