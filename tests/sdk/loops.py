"""A looping task driven by the official SDKs at their default settings.

Usage: loops.py GATEWAY_URL AGENT_KEY COOLDOWN_SECONDS
The SDKs retry 408, 409, 429 and 5xx answers by themselves (twice, waiting
out Retry-After) unless the answer says `x-should-retry: false`. Each SDK
repeats one call as a stuck agent would: the first two reach the provider,
the third is refused 409 `loop_detected` and not retried; once the
cool-down is over the same call again stops the task (429 `task_stopped`,
not retried), and so does any other call of that task. The Rust side
(tests/sdk.rs) counts what reached the provider.
"""
import sys
import time

import anthropic
import openai

base, key, cooldown = sys.argv[1], sys.argv[2], float(sys.argv[3])

# Default settings: max_retries is the SDKs' own (2); only the base URL and
# the key differ from talking to the providers directly.
oa = openai.OpenAI(base_url=base + "/v1", api_key=key)
an = anthropic.Anthropic(base_url=base, api_key=key)
assert oa.max_retries == 2 and an.max_retries == 2, (oa.max_retries, an.max_retries)


def oa_call(content="the search found nothing; search again"):
    return oa.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": content}],
        extra_headers={"x-agent-task-id": "oa-loop"},
    )


def an_call(content="the search found nothing; search again"):
    return an.messages.with_raw_response.create(
        model="claude-3-5-haiku-latest",
        max_tokens=64,
        messages=[{"role": "user", "content": content}],
        extra_headers={"x-agent-task-id": "an-loop"},
    )


def refused(call, err, status, code):
    try:
        call()
    except err as e:
        assert e.status_code == status, (e.status_code, e.body)
        assert e.response.headers["x-loopgate-error"] == code, e.response.headers
        assert e.response.headers["x-should-retry"] == "false", e.response.headers
        return e
    raise AssertionError(f"{code} expected")


for name, call, conflict, stopped in [
    ("openai", oa_call, openai.ConflictError, openai.RateLimitError),
    ("anthropic", an_call, anthropic.ConflictError, anthropic.RateLimitError),
]:
    for i in range(2):
        raw = call()
        assert raw.retries_taken == 0, (name, i, raw.retries_taken)
    e = refused(call, conflict, 409, "loop_detected")
    # Still cooling down: the Retry-After is there for the agent to read.
    assert int(e.response.headers["retry-after"]) >= 1, e.response.headers
    time.sleep(cooldown + 0.5)
    # The same call after the cool-down: stopped, not slowed.
    refused(call, stopped, 429, "task_stopped")
    refused(lambda: call("something else"), stopped, 429, "task_stopped")
    print(name, "loop stopped")

print("loops ok")
