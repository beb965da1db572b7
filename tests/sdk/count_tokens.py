"""`messages.count_tokens` of the official Anthropic SDK through the
gateway (issue 42 item 4), on both kinds of route.

Usage: count_tokens.py GATEWAY_URL AGENT_KEY
Routes (tests/count_tokens.rs): claude-sonnet-4-5 (an Anthropic provider:
the provider counts), claude-via-openai (only an OpenAI-family provider:
the gateway estimates).
"""
import sys

import anthropic

base, key = sys.argv[1], sys.argv[2]
an = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
messages = [{"role": "user", "content": "Hello, how many tokens is this?"}]

for model, source in [("claude-sonnet-4-5", "provider"), ("claude-via-openai", "estimated")]:
    raw = an.messages.with_raw_response.count_tokens(model=model, messages=messages)
    counted = raw.parse()
    assert raw.headers.get("x-loopgate-count") == source, dict(raw.headers)
    assert isinstance(counted.input_tokens, int) and counted.input_tokens > 0, counted
    print(f"{model}: {source} input_tokens={counted.input_tokens}")

print("count_tokens ok")
