"""The official OpenAI and Anthropic Python SDKs meet a money budget.

Usage: money.py GATEWAY_URL AGENT_KEY
Calls as one task until its money budget refuses: the SDKs raise their
status error (402) carrying Loopgate's code and the budget's level.
"""
import sys

import anthropic
import openai

base, key = sys.argv[1], sys.argv[2]


def until_refused(call):
    for n in range(50):
        try:
            call()
        except (openai.APIStatusError, anthropic.APIStatusError) as e:
            return n, e
    raise AssertionError("the budget never refused")


oa = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
n, e = until_refused(
    lambda: oa.chat.completions.create(
        model="priced",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-agent-task-id": "sdk-openai"},
    )
)
assert n >= 1, n
assert e.status_code == 402, e
assert e.code == "budget_exceeded", e.body
assert e.body["budget"]["level"] == "task", e.body
assert e.body["budget"]["limit_usd"] == 0.0015, e.body
assert e.response.headers["x-loopgate-error"] == "budget_exceeded"
assert "retry-after" not in e.response.headers

an = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
n, e = until_refused(
    lambda: an.messages.create(
        model="claude-priced",
        max_tokens=64,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-agent-task-id": "sdk-anthropic"},
    )
)
assert n >= 1, n
assert e.status_code == 402, e
assert e.body["error"]["code"] == "budget_exceeded", e.body
assert e.body["error"]["budget"]["level"] == "task", e.body

print("sdk money ok", n)
