"""The official OpenAI and Anthropic Python SDKs read what each answer cost.

Usage: prices.py GATEWAY_URL AGENT_KEY
The routes and prices are tests/prices.rs's (`cost_header: true`): a
non-streamed answer carries `x-loopgate-cost-usd`, which the SDKs' raw
responses show; the cost is checked to the cent of the hand-computed table
(a streamed answer's cost is in the access log, which the Rust test reads).
"""
import sys

import anthropic
import openai

base, key = sys.argv[1], sys.argv[2]


def usage_headers(prompt, cached, written, completion, call):
    return {
        "x-mock-prompt-tokens": str(prompt),
        "x-mock-cached-tokens": str(cached),
        "x-mock-cache-write-tokens": str(written),
        "x-mock-chunks": str(completion),
        "x-agent-call-id": call,
    }


oa = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
# gpt-4o: 200k uncached * 2.50 + 200k cached * 1.25 + 2k * 10 per million.
raw = oa.chat.completions.with_raw_response.create(
    model="gpt-4o", max_tokens=4000, messages=[{"role": "user", "content": "hi"}],
    extra_headers=usage_headers(400_000, 200_000, 0, 2_000, "sdk-openai"),
)
r = raw.parse()
assert r.usage.prompt_tokens == 400_000 and r.usage.prompt_tokens_details.cached_tokens == 200_000, r.usage
assert raw.headers["x-loopgate-cost-usd"] == "0.77", raw.headers
assert round(float(raw.headers["x-loopgate-cost-usd"]) * 100) == 77

# A stream: its usage comes in its last chunk, after the header.
with oa.chat.completions.stream(
    model="gpt-4o", max_tokens=4000, messages=[{"role": "user", "content": "hi"}],
    stream_options={"include_usage": True},
    extra_headers=usage_headers(120_000, 40_000, 0, 1_000, "sdk-openai-stream"),
) as stream:
    done = stream.get_final_completion()
assert done.usage.prompt_tokens == 120_000, done.usage

an = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
# claude-sonnet-4-5: 100k * 3.00 + 300k cache read * 0.30 + 100k cache
# write * 3.75 + 1k * 15 per million.
raw = an.messages.with_raw_response.create(
    model="claude-sonnet-4-5-20250929", max_tokens=4000,
    messages=[{"role": "user", "content": "hi"}],
    extra_headers=usage_headers(500_000, 300_000, 100_000, 1_000, "sdk-anthropic"),
)
m = raw.parse()
assert (m.usage.input_tokens, m.usage.cache_read_input_tokens, m.usage.cache_creation_input_tokens) == (
    100_000, 300_000, 100_000), m.usage
assert raw.headers["x-loopgate-cost-usd"] == "0.78", raw.headers

with an.messages.stream(
    model="claude-sonnet-4-5-20250929", max_tokens=4000,
    messages=[{"role": "user", "content": "hi"}],
    extra_headers=usage_headers(200_000, 100_000, 0, 2_000, "sdk-anthropic-stream"),
) as stream:
    final = stream.get_final_message()
    assert "x-loopgate-cost-usd" not in stream.response.headers
assert final.usage.cache_read_input_tokens == 100_000, final.usage

print("sdk prices ok")
