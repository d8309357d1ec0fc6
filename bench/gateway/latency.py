"""The gateway's own added latency on a cache-hit request.

Usage: latency.py ENGINE_URL GATEWAY_URL MODEL [N]

Warms one chat prompt into the engine, then sends it N times directly and N
times through the gateway, interleaved (direct, gateway, direct, ...), one
at a time, max_tokens=1, on a kept-alive connection each. Prints p50/p90/p99
of both, of the paired differences, and the gateway's own pre-forward time
(inferencecache_gateway_routing_overhead_seconds) over the run.
"""

import http.client
import json
import statistics
import sys
import time
import urllib.parse

engine, gateway, model = sys.argv[1], sys.argv[2], sys.argv[3]
n = int(sys.argv[4]) if len(sys.argv) > 4 else 200
body = json.dumps({
    "model": model,
    "messages": [{"role": "system", "content": "You are a benchmark."},
                 {"role": "user", "content": " ".join(f"Item {i} is cached." for i in range(60))}],
    "max_tokens": 1, "temperature": 0,
})


def conn(url):
    u = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port)


def once(c):
    t = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    dt = time.perf_counter() - t
    assert r.status == 200, data
    return dt, json.loads(data)["usage"]


def overhead(url):
    c = conn(url)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    vals = {}
    for line in text.splitlines():
        if line.startswith("inferencecache_gateway_routing_overhead_seconds_"):
            k, v = line.rsplit(" ", 1)
            vals[k] = float(v)
    return vals


d, g = conn(engine), conn(gateway)
for _ in range(5):
    once(d), once(g)
time.sleep(0.5)
before = overhead(gateway)
direct, via, cached = [], [], []
for _ in range(n):
    t, u = once(d)
    direct.append(t)
    t, u = once(g)
    via.append(t)
    cached.append((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
after = overhead(gateway)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


diff = [b - a for a, b in zip(direct, via)]
out = {"n": n, "prompt_cached_tokens_min": min(cached)}
for name, xs in (("direct_ms", direct), ("gateway_ms", via), ("added_ms", diff)):
    out[name] = {f"p{p}": round(pct(xs, p) * 1000, 3) for p in (50, 90, 99)}
    out[name]["mean"] = round(statistics.mean(xs) * 1000, 3)
cnt = after.get("inferencecache_gateway_routing_overhead_seconds_count", 0) - before.get(
    "inferencecache_gateway_routing_overhead_seconds_count", 0)
s = after.get("inferencecache_gateway_routing_overhead_seconds_sum", 0) - before.get(
    "inferencecache_gateway_routing_overhead_seconds_sum", 0)
out["pre_forward_mean_ms"] = round(s / cnt * 1000, 3) if cnt else None
le = {}
for k, v in after.items():
    if "_bucket" in k:
        le[k.split('le="')[1].rstrip('"}')] = v - before.get(k, 0)
out["pre_forward_buckets"] = le
print(json.dumps(out, indent=1))
