#!/usr/bin/env python3
"""The gateway's own added latency on a cache-hit request, alone and at a
request rate (issue 34's target: p50 <= 0.5 ms, p99 <= 2 ms).

Starts one real vLLM engine (the tiny random Qwen3 of `testkit::vllm`,
pinned to core 0, the same engine `bench/real-vllm/run.py` starts), the
gateway in front of it and, with `--peer`, sglang-router 0.3.2 cache_aware
in front of the same engine (from ROUTERS_VENV, see run.py). Warms one
chat prompt (~450 tokens), then:

1. alone: N probes of that prompt, `max_tokens=1`, non-streamed, one at a
   time, interleaved direct / gateway (/ peer), each on its own kept-alive
   connection;
2. at RATE: the same probes (up to N, for `--seconds`) while an open-loop
   load of the same cache-hit request goes through the gateway at RATE
   requests/s (sent on schedule whether or not earlier ones finished).

For each: p50/p90/p99/mean of each path and of the paired differences
(path minus the direct request before it), and the gateway's own phases
over the window from `inferencecache_gateway_phase_seconds` (pre_forward:
arrival to the request leaving for the engine; relay_first_byte: the
engine's first byte to handed on), as bucket bounds: "p50 <= 0.5 ms".

  V=/var/cache/inferencecache/vllm-venv
  cargo build --release -p inferencecache-cli
  flock /work/helpers/engines.lock $V/bin/python bench/gateway/latency.py --rate 200 --peer
"""
import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench/real-vllm"))
import run as rv  # noqa: E402  (the real-vLLM bench's engine and process helpers)

BODY = json.dumps({
    "model": "m",
    "messages": [{"role": "system", "content": "You are a benchmark."},
                 {"role": "user", "content": " ".join(f"Item {i} is cached." for i in range(60))}],
    "max_tokens": 1, "temperature": 0,
})
HEADERS = {"content-type": "application/json"}


async def once(session, url):
    t = time.perf_counter()
    async with session.post(f"{url}/v1/chat/completions", data=BODY, headers=HEADERS) as r:
        data = await r.read()
    dt = time.perf_counter() - t
    if r.status != 200:
        raise RuntimeError(f"{url}: {r.status} {data[:200]!r}")
    usage = json.loads(data)["usage"]
    return dt, (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


async def phases(session, gateway):
    """{(phase, le): cumulative count} and {phase: (sum, count)}."""
    async with session.get(f"{gateway}/metrics") as r:
        text = await r.text()
    buckets, sums = {}, {}
    for line in text.splitlines():
        if not line.startswith("inferencecache_gateway_phase_seconds"):
            continue
        name, v = line.rsplit(" ", 1)
        phase = name.split('phase="')[1].split('"')[0]
        if "_bucket" in name:
            buckets[(phase, name.split('le="')[1].split('"')[0])] = float(v)
        elif name.startswith("inferencecache_gateway_phase_seconds_sum"):
            sums.setdefault(phase, [0.0, 0.0])[0] = float(v)
        elif name.startswith("inferencecache_gateway_phase_seconds_count"):
            sums.setdefault(phase, [0.0, 0.0])[1] = float(v)
    return buckets, sums


def phase_summary(b0, s0, b1, s1):
    out = {}
    for phase in sorted({p for p, _ in b1}):
        d = sorted(((float("inf") if le == "+Inf" else float(le)), b1[(phase, le)] - b0.get((phase, le), 0))
                   for (p, le) in b1 if p == phase)
        total = d[-1][1] if d else 0
        if not total:
            continue
        row = {"n": int(total)}
        for q in (50, 90, 99):
            le = next(le for le, c in d if c >= q / 100 * total)
            row[f"p{q}_le_ms"] = le * 1000
        s = s1[phase][0] - s0.get(phase, [0, 0])[0]
        row["mean_ms"] = round(s / total * 1000, 4)
        out[phase] = row
    return out


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def stats(xs):
    out = {f"p{p}": round(pct(xs, p) * 1000, 3) for p in (50, 90, 99)}
    out["mean"] = round(statistics.mean(xs) * 1000, 3)
    return out


async def probes(targets, n, until=None):
    """n rounds of one request per target, in order (or fewer, when the
    clock passes `until`); per target its times."""
    sessions = {k: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for k in targets}
    try:
        times = {k: [] for k in targets}
        cached = []
        for _ in range(n):
            if until is not None and time.perf_counter() > until:
                break
            for k, url in targets.items():
                dt, c = await once(sessions[k], url)
                times[k].append(dt)
                cached.append(c)
        return times, min(cached) if cached else None
    finally:
        for s in sessions.values():
            await s.close()


async def load(url, rate, stop, out):
    """Open loop: one request every 1/rate s until `stop`, never waiting for
    answers (at most 512 outstanding: beyond that the engine is not keeping
    up, and a send is counted as dropped)."""
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    pending = set()
    t0 = time.perf_counter()
    k = 0

    async def one():
        try:
            dt, _ = await once(session, url)
            out["lat"].append(dt)
        except Exception as e:  # counted, the run goes on
            out["errors"] += 1
            out["last_error"] = repr(e)[:200]

    try:
        while not stop.is_set():
            k += 1
            due = t0 + k / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(pending) >= 512:
                out["dropped"] += 1
                continue
            t = asyncio.create_task(one())
            pending.add(t)
            t.add_done_callback(pending.discard)
            out["sent"] += 1
        out["seconds"] = time.perf_counter() - t0
        if pending:
            await asyncio.wait(pending, timeout=60)
    finally:
        await session.close()


async def measure(targets, gateway, n, rate, seconds, gw_pid):
    async with aiohttp.ClientSession() as s:
        b0, s0 = await phases(s, gateway)
    cpu0, t0 = rv.cpu_seconds(gw_pid), time.perf_counter()
    stop = asyncio.Event()
    bg = {"sent": 0, "dropped": 0, "errors": 0, "lat": []}
    task = asyncio.create_task(load(gateway, rate, stop, bg)) if rate else None
    if task:
        await asyncio.sleep(2)  # the load reaches its steady state first
    times, cached_min = await probes(targets, n, time.perf_counter() + seconds if task else None)
    if task:
        stop.set()
        await task
    async with aiohttp.ClientSession() as s:
        b1, s1 = await phases(s, gateway)
    cpu = rv.cpu_seconds(gw_pid) - cpu0
    out = {"n": len(times["direct"]), "prompt_cached_tokens_min": cached_min,
           "gateway_cpu_pct": round(100 * cpu / (time.perf_counter() - t0), 1)}
    for k, xs in times.items():
        out[f"{k}_ms"] = stats(xs)
        if k != "direct":
            out[f"{k}_added_ms"] = stats([b - a for a, b in zip(times["direct"], xs)])
    out["gateway_phases"] = phase_summary(b0, s0, b1, s1)
    if task:
        out["load"] = {"rate_asked": rate, "sent": bg["sent"], "dropped": bg["dropped"],
                       "errors": bg["errors"], "answered": len(bg["lat"]),
                       "rate_sent": round(bg["sent"] / bg["seconds"], 1)}
        if bg["lat"]:
            out["load"]["latency_ms"] = stats(bg["lat"])
        if bg.get("last_error"):
            out["load"]["last_error"] = bg["last_error"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="probe rounds per phase")
    ap.add_argument("--rate", type=float, default=200, help="requests/s of the load phase (0: skip it)")
    ap.add_argument("--seconds", type=float, default=20, help="length of the load phase")
    ap.add_argument("--peer", action="store_true", help="also probe sglang-router cache_aware")
    ap.add_argument("--max-num-seqs", type=int, default=256, help="the engine's batch limit")
    ap.add_argument("--bin", default=str(ROOT / "target/release/inferencecache"))
    ap.add_argument("--out", default=None, help="write the report as JSON here")
    ap.add_argument("--engine-busy-wait", type=rv.busy_wait_arg, default=0.0, metavar="S|vllm",
                    help="a bench setting, never a product one: vLLM's shm readers busy-wait S s"
                         " after each read; default 0 as in run.py, 'vllm' for vLLM's own 1 s"
                         " (see bench/real-vllm/engine_busy_wait)")
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ic-gw-latency-"))
    model = rv.make_model()
    engine = rv.Engine(model, 0, None, work, extra=["--max-num-seqs", str(a.max_num_seqs)],
                       busy_wait=a.engine_busy_wait)
    procs = []
    try:
        rv.wait_http(f"{engine.url}/health", 900, engine.proc.p, engine.proc.log)
        port = rv.free_port()
        gw = rv.Proc([a.bin, "--log-level", "warn", "gateway", "--listen", f"127.0.0.1:{port}",
                      "--engine", engine.url], work / "gateway.log")
        procs.append(gw)
        gateway = f"http://127.0.0.1:{port}"
        rv.wait_http(f"{gateway}/health", 120, gw.p, gw.log)
        rv.wait_routed(gateway, 120, gw.p, gw.log)
        targets = {"direct": engine.url, "gateway": gateway}
        if a.peer:
            pport = rv.free_port()
            peer = rv.Proc([str(rv.ROUTERS / "bin/python"), "-m", "sglang_router.launch_router",
                            "--host", "127.0.0.1", "--port", str(pport), "--policy", "cache_aware",
                            "--worker-urls", engine.url], work / "sglang-router.log")
            procs.append(peer)
            targets["sglang_router"] = f"http://127.0.0.1:{pport}"
            rv.wait_http(f"{targets['sglang_router']}/health", 120, peer.p, peer.log)
            rv.wait_routed(targets["sglang_router"], 120, peer.p, peer.log)
        asyncio.run(probes(targets, 5))  # warm the prompt and every connection
        time.sleep(0.5)
        report = {"machine": rv.os.uname().nodename, "alone": asyncio.run(measure(targets, gateway, a.n, 0, 0, gw.p.pid))}
        print(json.dumps(report["alone"]), flush=True)
        if a.rate:
            report[f"at_{a.rate:g}_per_s"] = asyncio.run(
                measure(targets, gateway, a.n, a.rate, a.seconds, gw.p.pid))
            print(json.dumps(report[f"at_{a.rate:g}_per_s"]), flush=True)
        print(json.dumps(report, indent=1))
        if a.out:
            Path(a.out).write_text(json.dumps(report, indent=1))
    finally:
        for p in procs:
            p.stop()
        engine.proc.stop()
        rv.shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
