"""The official `openai` SDK against `inferencecache gateway`.

Usage: gateway_openai.py BASE_URL MODEL PROMPT_SEED

Sends chat and completions requests, streamed and not, twice each (the
second time the prompt is cached somewhere), and prints one JSON object
per call: which engine the gateway chose and why (response headers), the
tokens it expected the engine to reuse, and the usage the engine reported.
"""

import json
import sys
import time
import urllib.request

import openai

base, model, seed = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)

text = f"[{seed}] " + " ".join(f"Fact {i}: the {seed} gateway routes by cache." for i in range(40))


def settle(kind, body, prompt_tokens, block=32):
    """Waits (bounded) until the gateway would route `body` to the engine
    holding it: its KV events have reached the index. Uses the gateway's
    dry-run endpoint; the SDK call that follows is then judged exactly."""
    want = (prompt_tokens - 1) // block * block
    deadline = time.time() + 15
    while time.time() < deadline:
        req = urllib.request.Request(
            f"{base}/inferencecache/route/{kind}", data=json.dumps(body).encode(),
            headers={"content-type": "application/json"})
        d = json.load(urllib.request.urlopen(req))
        if d["reusable_tokens"] >= want:
            return
        time.sleep(0.05)


last_prompt_tokens = [0]


def record(kind, stream, raw, usage, content):
    last_prompt_tokens[0] = usage.prompt_tokens if usage else 0
    h = raw.headers
    print(json.dumps({
        "kind": kind,
        "stream": stream,
        "engine": h.get("x-inferencecache-engine"),
        "route": h.get("x-inferencecache-route"),
        "reusable": int(h.get("x-inferencecache-reusable-tokens") or 0),
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "cached_tokens": (usage.prompt_tokens_details.cached_tokens
                          if usage and usage.prompt_tokens_details else None),
        "content": content,
    }), flush=True)


for stream in (False, True):
    for attempt in range(2):
        msgs = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": f"{text} (chat, stream={stream})"}]
        if not stream:
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=msgs, max_tokens=4, temperature=0)
            r = raw.parse()
            record("chat", stream, raw, r.usage, r.choices[0].message.content)
        else:
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=msgs, max_tokens=4, temperature=0, stream=True,
                stream_options={"include_usage": True})
            usage, parts = None, []
            for chunk in raw.parse():
                if chunk.usage:
                    usage = chunk.usage
                for c in chunk.choices:
                    parts.append(c.delta.content or "")
            record("chat", stream, raw, usage, "".join(parts))
        if attempt == 0:
            settle("chat", {"model": model, "messages": msgs}, last_prompt_tokens[0])

        prompt = f"{text} (completion, stream={stream})"
        if not stream:
            raw = client.completions.with_raw_response.create(
                model=model, prompt=prompt, max_tokens=4, temperature=0)
            r = raw.parse()
            record("completions", stream, raw, r.usage, r.choices[0].text)
        else:
            raw = client.completions.with_raw_response.create(
                model=model, prompt=prompt, max_tokens=4, temperature=0, stream=True,
                stream_options={"include_usage": True})
            usage, parts = None, []
            for chunk in raw.parse():
                if chunk.usage:
                    usage = chunk.usage
                for c in chunk.choices:
                    parts.append(c.text or "")
            record("completions", stream, raw, usage, "".join(parts))
        if attempt == 0:
            settle("completions", {"model": model, "prompt": prompt}, last_prompt_tokens[0])

print(json.dumps({"models": sorted(m.id for m in client.models.list().data)}), flush=True)
