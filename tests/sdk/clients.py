"""Drives Loopgate with the official OpenAI and Anthropic Python SDKs.

Usage: clients.py GATEWAY_URL AGENT_KEY
Only the base URL and the key differ from talking to the providers directly.
"""
import sys

import anthropic
import openai

base, key = sys.argv[1], sys.argv[2]

oa = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
r = oa.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
assert r.choices[0].message.content.startswith("Hello"), r
assert r.usage.completion_tokens == 8, r.usage

text, usage = "", None
for chunk in oa.chat.completions.create(
    model="gpt-4o-mini",
    messages=[{"role": "user", "content": "hi"}],
    stream=True,
    stream_options={"include_usage": True},
):
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
    if chunk.usage:
        usage = chunk.usage
assert text == "Hello from the Loopgate mock provider. ", repr(text)
assert usage is not None and usage.completion_tokens == 8, usage

resp = oa.responses.create(model="gpt-4o-mini", input="hi")
assert resp.output_text.startswith("Hello"), resp

# The streaming helper checks the event order (issue 42: the mock's stream
# lacked response.output_item.added and content_part.added, and the helper
# raised "Received a content event for output index 0 before receiving its
# output item").
with oa.responses.stream(model="gpt-4o-mini", input="hi") as stream:
    deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
    final = stream.get_final_response()
assert "".join(deltas) == "Hello from the Loopgate mock provider. ", deltas
assert final.output_text == "".join(deltas), final
assert final.usage.output_tokens == 8, final.usage

emb = oa.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
assert len(emb.data) == 2

assert [m.id for m in oa.models.list()] == ["gpt-4o-mini", "text-embedding-3-small"]

try:
    oa.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("gpt-4o must be denied for this agent")
except openai.PermissionDeniedError as e:
    assert e.code == "model_not_allowed", e.body
    assert e.response.headers["x-loopgate-error"] == "model_not_allowed"

try:
    openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
    raise AssertionError("a wrong key must be refused")
except openai.AuthenticationError as e:
    assert e.code == "unknown_key", e.body

an = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
m = an.messages.create(
    model="claude-3-5-haiku-latest", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
)
assert m.content[0].text.startswith("Hello"), m

with an.messages.stream(
    model="claude-3-5-haiku-latest", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
) as stream:
    streamed = "".join(stream.text_stream)
    final = stream.get_final_message()
assert streamed == "Hello from the Loopgate mock provider. ", repr(streamed)
assert final.usage.output_tokens == 8, final.usage

print("sdk ok")
