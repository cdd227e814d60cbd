#!/usr/bin/env python3
"""Drives `r2vpo serve` with the official OpenAI Python client, as users'
code does, and checks what comes back: completions with top log-probs,
chat with top log-probs, both streamed (the deltas equal the unstreamed
answer for the same seed; usage last; log-probs per chunk), and errors
raised as the client's own exception classes.

Usage: client_check.py BASE_URL API_KEY   (run by
crates/r2vpo-cli/tests/openai_client.rs with .deps/venv-openai's python)
"""
import math
import sys

import openai


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main(base, key):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
    done = []

    # Completions with five alternatives per token.
    c = client.completions.create(model="r2vpo", prompt="The capital of France is", max_tokens=8, logprobs=5, seed=3)
    ch = c.choices[0]
    lp = ch.logprobs
    check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == c.usage.completion_tokens, "lengths")
    check(all(x <= 0 for x in lp.token_logprobs), "log-probs are <= 0")
    for alts in lp.top_logprobs:
        check(1 <= len(alts) <= 5 and all(v <= 0 for v in alts.values()), f"top_logprobs {alts}")
        check(math.fsum(math.exp(v) for v in alts.values()) <= 1 + 1e-5, "alternatives' mass <= 1")
    done.append("completions logprobs=5")

    # Chat with five alternatives per token.
    msgs = [{"role": "user", "content": "What is 2 + 2? Answer briefly."}]
    r = client.chat.completions.create(
        model="r2vpo", messages=msgs, max_tokens=8, logprobs=True, top_logprobs=5, seed=3
    )
    m = r.choices[0]
    check(m.message.role == "assistant" and isinstance(m.message.content, str), "assistant message")
    check(r.usage.prompt_tokens > 5 and r.usage.completion_tokens == len(m.logprobs.content), "usage")
    for t in m.logprobs.content:
        check(t.logprob <= 0 and len(t.top_logprobs) == 5, f"token {t}")
        check(all(a.logprob <= 0 and a.bytes is not None for a in t.top_logprobs), "alternatives")
        check([a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True),
              "most likely first")
    done.append("chat top_logprobs=5")

    # Streamed completions: the deltas add up to the unstreamed text.
    whole = client.completions.create(model="r2vpo", prompt="Once upon a time", max_tokens=12, seed=7, logprobs=2)
    chunks = list(client.completions.create(
        model="r2vpo", prompt="Once upon a time", max_tokens=12, seed=7, logprobs=2,
        stream=True, stream_options={"include_usage": True},
    ))
    text = "".join(k.choices[0].text for k in chunks if k.choices)
    check(text == whole.choices[0].text, f"streamed {text!r} != {whole.choices[0].text!r}")
    streamed_lp = [x for k in chunks if k.choices for x in k.choices[0].logprobs.token_logprobs]
    check(streamed_lp == whole.choices[0].logprobs.token_logprobs, "streamed log-probs")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens,
          "usage last")
    check([k.choices[0].finish_reason for k in chunks if k.choices][-1] == whole.choices[0].finish_reason,
          "finish reason")
    done.append(f"completions stream ({len(chunks)} chunks)")

    # Streamed chat.
    whole = client.chat.completions.create(model="r2vpo", messages=msgs, max_tokens=12, seed=5, logprobs=True,
                                           top_logprobs=3)
    chunks = list(client.chat.completions.create(
        model="r2vpo", messages=msgs, max_tokens=12, seed=5, logprobs=True, top_logprobs=3,
        stream=True, stream_options={"include_usage": True},
    ))
    text = "".join(k.choices[0].delta.content or "" for k in chunks if k.choices)
    check(text == whole.choices[0].message.content, f"streamed {text!r} != {whole.choices[0].message.content!r}")
    check(chunks[0].choices[0].delta.role == "assistant", "the first delta names the role")
    streamed = [t for k in chunks if k.choices and k.choices[0].logprobs for t in k.choices[0].logprobs.content]
    check([t.logprob for t in streamed] == [t.logprob for t in whole.choices[0].logprobs.content], "chat log-probs")
    check(all(len(t.top_logprobs) == 3 for t in streamed), "three alternatives a token")
    check(chunks[-1].usage is not None and chunks[-1].usage.total_tokens == whole.usage.total_tokens, "usage last")
    done.append(f"chat stream ({len(chunks)} chunks)")

    # Errors are the client's own exception classes.
    try:
        client.chat.completions.create(model="r2vpo", messages=msgs, logprobs=True, top_logprobs=21)
        check(False, "top_logprobs 21 was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "top_logprobs" in str(e), f"400 names the field: {e}")
    try:
        client.completions.create(model="r2vpo", prompt="x", temperature=-1)
        check(False, "temperature -1 was accepted")
    except openai.BadRequestError as e:
        check("temperature" in str(e), str(e))
    try:
        openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
        check(False, "a wrong key was accepted")
    except openai.AuthenticationError:
        pass
    try:
        client.models.retrieve("no-such-model")
        check(False, "an unknown route was answered")
    except openai.NotFoundError:
        pass
    done.append("errors as BadRequestError, AuthenticationError, NotFoundError")
    print("openai client:", "; ".join(done))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
