"""The official OpenAI Python SDK streams at its default settings (no
`stream_options`) through a priced route whose provider, like OpenAI,
reports a stream's usage only when asked.

Usage: settle.py GATEWAY_URL AGENT_KEY CHUNKS
The gateway asks the provider for the usage (to settle the budget on
it) and drops the usage chunk the SDK did not ask for: every chunk the
SDK sees has a choice and no usage, as a stream without usage has.
"""
import sys

import openai

base, key, chunks = sys.argv[1], sys.argv[2], int(sys.argv[3])

oa = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
stream = oa.chat.completions.create(
    model="priced",
    messages=[{"role": "user", "content": "hi"}],
    stream=True,
    extra_headers={
        "x-mock-usage-if-asked": "1",
        "x-mock-prompt-tokens": "2",
        "x-mock-chunks": str(chunks),
    },
)
seen = list(stream)
assert all(c.usage is None for c in seen), [c.usage for c in seen if c.usage]
assert all(c.choices for c in seen), "a chunk without choices reached the SDK"
text = "".join(c.choices[0].delta.content or "" for c in seen)
# The role chunk, one per piece, the finish chunk.
assert len(seen) == chunks + 2, len(seen)
assert seen[-1].choices[0].finish_reason == "stop"
print(f"chunks {len(seen)} text {len(text)} bytes")
print("sdk settle ok")
