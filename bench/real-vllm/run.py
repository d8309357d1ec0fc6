#!/usr/bin/env python3
"""Routing policies on real vLLM engines: one run, policies interleaved.

Two real vLLM engines (CPU build, one core each, the tiny random Qwen3 the
tests make) serve the same workload under each routing policy in turn; the
prefix caches are reset between policies. Per policy it reports client-side
TTFT (mean / p50 / p90), the engines' prefix-cache hit rate (cached prompt
tokens over prompt tokens, from each response's
usage.prompt_tokens_details.cached_tokens), full misses (requests whose
system prompt was not reused at all) and, where a hint was asked for, hint
accuracy (hinted matched tokens against what the engine then reused).

Policies:
  rr             the client alternates the engines itself
  e0, e1         the client sends everything to engine 0 (1), no router
  hints          a Python gateway over `inferencecache serve` + one
                 `inferencecache subscribe` per engine, all on default flags:
                 LookupRoute(token_ids) per request, the top replica, else the
                 engine with fewest requests in flight; hints+--flag runs
                 its own serve (and sidecars) with that flag; base-hints[+flag]
                 the same with --base-bin (a baseline build in the same run);
                 plain-hints, plain-base-hints: the same gateway calling
                 LookupRoute only (no ReportCallerLoad, as every gateway of
                 the Go reference), beside the reporting one in one run.
                 The Python gateway forwards in lookup order (a request's
                 lookup and the write of its bytes under one lock, the
                 caller contract of docs/gateway.md); unordered-<policy>
                 lets its threads forward in any order (sessions 42-44)
  gateway        `inferencecache gateway --engine A --engine B` (issue 34);
                 gateway+--flag=value runs it with other flags
  vllm-router    vllm-router 0.1.17 --policy cache_aware / kv_aware
  sglang-router  sglang-router 0.3.2 --policy cache_aware

Run it with the vLLM venv's Python (.ci/install-vllm); the routers come from
a separate venv (ROUTERS_VENV, default /var/cache/inferencecache/routers-venv:
`pip install vllm-router==0.1.17 sglang-router==0.3.2`). Example:

  V=/var/cache/inferencecache/vllm-venv
  cargo build --release -p inferencecache-cli
  $V/bin/python bench/real-vllm/run.py --cache 256 --concurrency 1 4 \
      --policies rr hints gateway vllm-router-cache vllm-router-kv sglang-router
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(tempfile.gettempdir()) / "inferencecache-vllm-models"
VENV = Path(sys.executable).parent.parent
ROUTERS = Path(os.environ.get("ROUTERS_VENV", "/var/cache/inferencecache/routers-venv"))
BLOCK = 32


def free_port():
    import socket

    while True:
        p = random.randint(20000, 31999)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
                return p
            except OSError:
                continue


def wait_http(url, timeout, proc=None, log=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited\n{tail(log)}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready in {timeout}s\n{tail(log)}")


def wait_routed(url, timeout, proc, log):
    """A router may answer /health before its workers are registered: wait
    until a tiny completion goes through (a prompt no workload shares)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: router exited\n{tail(log)}")
        try:
            r = httpx.post(f"{url}/v1/completions", timeout=30,
                           json={"model": "m", "prompt": "ready?", "max_tokens": 1})
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} routes nothing after {timeout}s\n{tail(log)}")


def tail(log, n=30):
    if not log:
        return ""
    try:
        return "\n".join(Path(log).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class Proc:
    """A child in its own process group, killed (group) on stop."""

    def __init__(self, args, log, env=None):
        self.log = log
        self.f = open(log, "w")
        self.p = subprocess.Popen(
            args, stdout=self.f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def stop(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
                self.p.wait(timeout=15)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.p.wait()
        self.f.close()


def make_model():
    d = MODELS / "qwen3-v1"
    if not (d / "config.json").is_file():
        MODELS.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, str(ROOT / "crates/testkit/python/make_model.py"), "qwen3", str(d),
             str(ROOT / ".cache/tokenizers/Qwen/Qwen3"), str(MODELS / "qwen3-v1-lora")],
            check=True,
        )
    return d


class Engine:
    def __init__(self, model, cpu, blocks, work, extra=(), busy_wait=None):
        self.port, self.ev, self.replay = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        kv = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{self.ev}", "replay_endpoint": f"tcp://*:{self.replay}",
              "topic": "kv-events"}
        args = [str(VENV / "bin/vllm"), "serve", str(model), "--served-model-name", "m",
                "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "bfloat16",
                "--max-model-len", "4096", "--enable-prefix-caching", "--block-size", str(BLOCK),
                "--enable-prompt-tokens-details", "--max-num-seqs", "8",
                "--kv-events-config", json.dumps(kv), "--enable-scale-out"]
        if blocks:
            args += ["--num-gpu-blocks-override", str(blocks)]
        args += list(extra)  # later flags win (bench/gateway/latency.py: --max-num-seqs)
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_OMP_THREADS_BIND=str(cpu),
                   OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
                   VLLM_SERVER_DEV_MODE="1", VLLM_NO_USAGE_STATS="1")
        if busy_wait is not None:
            # A bench setting (engine_busy_wait/sitecustomize.py): how long
            # vLLM's shm readers spin after a read; every policy alike.
            env["IC_BENCH_ENGINE_BUSY_WAIT_S"] = str(busy_wait)
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(Path(__file__).resolve().parent / "engine_busy_wait"),
                            env.get("PYTHONPATH")) if p)
        self.proc = Proc(args, work / f"engine-{cpu}.log", env)

    def reset(self):
        r = httpx.post(f"{self.url}/reset_prefix_cache", timeout=30)
        r.raise_for_status()
        # vLLM publishes KV events once per scheduler step, and an idle
        # engine does not step: without a request its AllBlocksCleared
        # waits for the next policy's first request, and an index started
        # meanwhile (the gateway's, from the replay) still holds the last
        # policy's blocks. One tiny request makes the engine step and publish.
        r = httpx.post(f"{self.url}/v1/completions", timeout=60,
                       json={"model": "m", "prompt": "reset", "max_tokens": 1})
        r.raise_for_status()


class EventTap:
    """A second subscriber to one engine's KV events (beside the sidecar):
    when each block hash was stored and when its last copy went, on this
    machine's clock. It is how an over-claimed hint is told apart: the
    engine announced the eviction before the lookup (the index was stale:
    ours) or only after it (the engine evicted after the hint, or in a step
    that had begun before it and was published at its end: no router could
    have known)."""

    def __init__(self, engine):
        import msgspec
        import zmq

        self.decode = msgspec.msgpack.decode
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.RCVTIMEO, 200)
        self.sock.connect(f"tcp://127.0.0.1:{engine.ev}")
        self.child = {}  # (parent hash, block tokens) -> hash
        self.copies = {}  # hash -> physical copies held
        self.flips = {}  # hash -> [(received, held afterwards)] as it came and went
        # Every store and removal as received, in order (--out's `events`:
        # the engine's free-queue order behind an over-claim, per request).
        self.log = []  # (received, "S" | "R" | "C", [hash ids])
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    @staticmethod
    def key(h):
        return bytes(h) if isinstance(h, (bytes, bytearray, list)) else h

    @staticmethod
    def name(h):
        """A hash as JSON can hold it (short: a diagnosis, not an identity)."""
        return bytes(h).hex()[:16] if isinstance(h, (bytes, bytearray)) else str(h)

    def events(self, t0, t1):
        """The log between t0 and t1 (the per-request study's input)."""
        with self.lock:
            return [e for e in self.log if t0 <= e[0] <= t1]

    def run(self):
        import zmq

        while not self.stop.is_set():
            try:
                frames = self.sock.recv_multipart()
            except zmq.Again:
                continue
            try:
                self.apply(self.decode(frames[-1]), time.time())
            except Exception:
                continue

    def apply(self, batch, now):
        """One decoded event batch, received at `now`."""
        ts, events = batch[:2]
        with self.lock:
            for ev in events:
                kind = ev.get("type") if isinstance(ev, dict) else ev[0]
                if kind in ("BlockStored", "BlockRemoved"):
                    self.log.append((now, kind[5], [self.name(self.key(h))
                                                    for h in ev["block_hashes"]]))
                elif kind == "AllBlocksCleared":
                    self.log.append((now, "C", []))
                if kind == "BlockStored":
                    parent = self.key(ev.get("parent_block_hash"))
                    toks, bs = ev["token_ids"], ev["block_size"]
                    for i, h in enumerate(ev["block_hashes"]):
                        h = self.key(h)
                        self.child[(parent, tuple(toks[i * bs:(i + 1) * bs]))] = h
                        self.copies[h] = self.copies.get(h, 0) + 1
                        if self.copies[h] == 1:
                            self.flips.setdefault(h, []).append((now, True))
                        parent = h
                elif kind == "BlockRemoved":
                    for h in ev["block_hashes"]:
                        h = self.key(h)
                        n = self.copies.get(h, 0) - 1
                        self.copies[h] = max(n, 0)
                        if n == 0:
                            self.flips.setdefault(h, []).append((now, False))
                elif kind == "AllBlocksCleared":
                    for h, n in self.copies.items():
                        if n > 0:
                            self.flips.setdefault(h, []).append((now, False))
                    self.copies.clear()

    def chain(self, ids, n_blocks):
        """The engine's hashes of the first n_blocks of `ids` (as far as known)."""
        out, parent = [], None
        with self.lock:
            for i in range(n_blocks):
                h = self.child.get((parent, tuple(ids[i * BLOCK:(i + 1) * BLOCK])))
                if h is None:
                    break
                out.append(h)
                parent = h
        return out

    def held(self, h, at):
        """(held at `at` as announced by then, when that last changed)."""
        with self.lock:
            last = [f for f in self.flips.get(h, []) if f[0] <= at]
        return (last[-1][1], last[-1][0]) if last else (False, None)

    def close(self):
        self.stop.set()
        self.t.join()
        self.sock.close(linger=0)


def announced(row, ids, tap):
    """Tokens of a row's claim on blocks its engine had announced stored by
    the lookup (the rest was claimed on a hint still prefilling there: the
    server's tentative holding, issue 33 session 45)."""
    n = row["hinted"] // BLOCK
    hashes = tap.chain(ids, n)
    held = 0
    for h in hashes:
        if not tap.held(h, row["t_lookup"])[0]:
            break
        held += 1
    return held * BLOCK


def classify(row, ids, tap):
    """Why an over-claimed hint claimed more than the engine reused, judged
    on the first claimed block the engine did not reuse (block cached/32):
    'stale' (the engine had announced it gone before the lookup: the index
    lagged), 'after' (held at the lookup as far as the engine had said, and
    announced gone only after it: a race no router sees), or 'unseen' (still
    held as far as the engine said when it answered). The lag is the
    announcement's time minus the lookup's."""
    first = row["cached"] // BLOCK
    hashes = tap.chain(ids, first + 1)
    if len(hashes) <= first:
        return "unseen", None
    h = hashes[first]
    at_lookup, changed = tap.held(h, row["t_lookup"])
    if not at_lookup and changed is not None:
        return "stale", changed - row["t_lookup"]
    with tap.lock:
        went = [t for t, held in tap.flips.get(h, [])
                if not held and row["t_lookup"] < t <= row["t_done"]]
    if went:
        return "after", went[0] - row["t_lookup"]
    return "unseen", None


def cpu_seconds(pid):
    """User + system CPU time of a process and its threads so far (Linux)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def settle(pid, idle_pct=3.0, window=0.5, limit=20.0):
    """Waits until process `pid` uses under `idle_pct` % of a core over
    `window` s (at most `limit` s); returns the seconds waited."""
    t0 = time.time()
    while time.time() - t0 < limit:
        a = cpu_seconds(pid)
        time.sleep(window)
        b = cpu_seconds(pid)
        if a is None or b is None or (b - a) / window * 100 < idle_pct:
            break
    return round(time.time() - t0, 2)


def wait_indexed(url, limit=60.0):
    """Waits until the gateway at `url` has every engine's KV-event history
    in its index (`indexed` on GET /inferencecache/engines; until then it
    routes by load and its own records, reason `catching_up`); returns the
    seconds waited."""
    t0 = time.time()
    while time.time() - t0 < limit:
        try:
            engines = httpx.get(f"{url}/inferencecache/engines", timeout=2).json()["engines"]
            if engines and all(e.get("indexed") for e in engines):
                break
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    return time.time() - t0


def group_cpu_seconds(sid):
    """CPU time so far of every process in session `sid` (an engine: its API
    server, engine core and workers), threads included."""
    total = 0.0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[3]) == sid:
            total += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return total


def gateway_phases(url):
    """The gateway's own split of each request's time to first byte
    (`inferencecache_gateway_phase_seconds`): {phase: mean ms}."""
    sums = {}
    try:
        body = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    for line in body.splitlines():
        for suffix, k in (("_sum", 0), ("_count", 1)):
            if line.startswith("inferencecache_gateway_phase_seconds" + suffix):
                phase = line.split('phase="')[1].split('"')[0]
                sums.setdefault(phase, [0.0, 0.0])[k] = float(line.rsplit(" ", 1)[1])
    return {p: round(s / c * 1000, 2) for p, (s, c) in sums.items() if c}


def served_by(ids, row, taps):
    """Which engine served a request, from the engines' own KV events: the
    one that stored the prompt's last whole block (its question: unique to
    the request) between the request's start and its answer. Works for
    every policy (the peer routers do not say where they sent it)."""
    n = len(ids) // BLOCK
    if n == 0:
        return None
    for i, tap in enumerate(taps):
        hashes = tap.chain(ids, n)
        if len(hashes) < n:
            continue
        with tap.lock:
            if any(held and row["t_lookup"] - 0.05 <= t <= row["t_done"] + 0.5
                   for t, held in tap.flips.get(hashes[-1], [])):
                return i
    return None


ENGINE_SUMS = ("vllm:time_to_first_token_seconds", "vllm:request_queue_time_seconds",
               "vllm:request_prefill_time_seconds", "vllm:e2e_request_latency_seconds")


def engine_sums(url):
    """{histogram: (sum, count)} from one engine's /metrics (its own view of
    each request: arrival at its API server to first token, queue, prefill)."""
    out = {}
    try:
        body = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return out
    for line in body.splitlines():
        for h in ENGINE_SUMS:
            for suffix, k in (("_sum", 0), ("_count", 1)):
                if line.startswith(h + suffix):
                    v = out.setdefault(h, [0.0, 0.0])
                    v[k] += float(line.rsplit(" ", 1)[1])
    return out


def per_engine(rows, before, after):
    """Per engine: requests, client TTFT mean of the requests it served (by
    the event tap), and the engine's own means over the same interval."""
    out = []
    for i, (b, a) in enumerate(zip(before, after)):
        mine = [r["ttft"] * 1000 for r in rows if r.get("served_by") == i]
        e = {"engine": i, "n": len(mine),
             "client_ttft_ms": round(statistics.mean(mine), 1) if mine else None}
        for h in ENGINE_SUMS:
            s = a.get(h, [0, 0])[0] - b.get(h, [0, 0])[0]
            c = a.get(h, [0, 0])[1] - b.get(h, [0, 0])[1]
            short = h.split(":")[1].replace("_seconds", "").replace("request_", "")
            e[f"engine_{short}_ms"] = round(s / c * 1000, 1) if c else None
        e["engine_n"] = int(a.get(ENGINE_SUMS[0], [0, 0])[1] - b.get(ENGINE_SUMS[0], [0, 0])[1])
        out.append(e)
    return out


def eviction_buckets(urls, series="inferencecache_subscriber_eviction_visible_seconds_bucket"):
    """Σ over the sidecars of `eviction_visible_seconds` (engine batch with
    an eviction at the sidecar -> the server's ack: lookups no longer see
    the block): {upper bound: cumulative count}. With `series` the
    `PublishEvent` call alone (RPC_SERIES): what of the eviction's time is
    the call, the rest waited in the sidecar before it."""
    out = {}
    for u in urls:
        try:
            body = httpx.get(f"{u}/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        name, _, label = series.partition("{")
        for line in body.splitlines():
            if line.startswith(name) and label in line:
                le = line.split('le="')[1].split('"')[0]
                out[le] = out.get(le, 0) + float(line.rsplit(" ", 1)[1])
    return out


# The sidecar's PublishEvent calls (start -> ack), one per eviction, and its
# waits for the report stream's ack (an eviction of a block reported on the
# open stream waits for it first).
RPC_SERIES = 'inferencecache_subscriber_send_latency_seconds_bucket{rpc="PublishEvent"'
ACK_SERIES = 'inferencecache_subscriber_send_latency_seconds_bucket{rpc="ReportCacheState_ack"'


def bucket_quantile(before, after, q):
    """(count, the smallest bucket bound holding quantile q) of after - before."""
    d = sorted(((float("inf") if le == "+Inf" else float(le)), after[le] - before.get(le, 0))
               for le in after)
    total = d[-1][1] if d else 0
    if not total:
        return 0, None
    for le, c in d:
        if c >= q * total:
            return int(total), le
    return int(total), None


def serve_lookups(url):
    """A serve's LookupRoute counters: calls by reason, hints delivered,
    and its handler-latency histogram (cumulative buckets, seconds)."""
    out = {"calls": {}, "delivered": 0.0, "buckets": {}}
    if not url:
        return out
    body = httpx.get(f"{url}/metrics", timeout=10).text
    for line in body.splitlines():
        if line.startswith("inferencecache_lookup_route_calls_total{"):
            reason = line.split('reason_code="')[1].split('"')[0]
            out["calls"][reason] = out["calls"].get(reason, 0.0) + float(line.split()[-1])
        elif line.startswith("inferencecache_delivered_hints_total"):
            out["delivered"] = float(line.split()[-1])
        elif line.startswith("inferencecache_foresight_moved_total"):
            out["moved"] = float(line.split()[-1])
        elif line.startswith("inferencecache_lookup_route_latency_seconds_bucket{"):
            le = line.split('le="')[1].split('"')[0]
            out["buckets"][le] = out["buckets"].get(le, 0.0) + float(line.split()[-1])
    return out


def serve_lookup_delta(before, after):
    """What a serve counted over one policy: calls by reason, hints
    delivered, and its handler latency's p99 / max bucket bounds."""
    calls = {k: int(v - before["calls"].get(k, 0)) for k, v in after["calls"].items()
             if v - before["calls"].get(k, 0) > 0}
    d = {k: after["buckets"][k] - before["buckets"].get(k, 0) for k in after["buckets"]}
    les = sorted(d, key=lambda k: float("inf") if k == "+Inf" else float(k))
    n = d.get("+Inf", 0)
    p99 = mx = None
    for le in les:
        if p99 is None and n and d[le] >= 0.99 * n:
            p99 = le
        if mx is None and n and d[le] >= n:
            mx = le
    return {"server_calls": calls, "server_delivered": int(after["delivered"] - before["delivered"]),
            "foresight_moved": int(after.get("moved", 0) - before.get("moved", 0)),
            "server_latency_p99_le_s": p99, "server_latency_max_le_s": mx}


def workload(tok, n_sys, n_req, sys_tokens, seed):
    rng = random.Random(seed)
    vocab = [t for t in range(1000, 30000)]

    def text(n):
        # Decode random ids, then re-encode: the prompt is text whose own
        # tokenization is what the engine will see.
        return tok.decode([rng.choice(vocab) for _ in range(n)])

    systems = [text(sys_tokens) for _ in range(n_sys)]
    reqs = []
    for i in range(n_req):
        s = i % n_sys if i < n_sys else rng.randrange(n_sys)
        reqs.append((s, systems[s] + f"\n\nQuestion {i}: " + text(40)))
    return reqs


class Result:
    def __init__(self):
        self.rows = []
        self.lock = threading.Lock()

    def add(self, **kw):
        with self.lock:
            self.rows.append(kw)


_clients = threading.local()


def client():
    """One kept-alive HTTP client per sending thread: a new httpx.Client per
    request costs the client ~50 ms (its SSL context) before the request
    leaves, on every policy alike, which only added noise to TTFT."""
    c = getattr(_clients, "c", None)
    if c is None:
        c = _clients.c = httpx.Client(timeout=600)
    return c


def send(url, prompt, extra_headers=None, meta=None, on_first=None, on_sent=None,
         on_headers=None):
    """Streams one completion; returns (ttft seconds, prompt tokens, cached
    tokens). `meta`, when given, receives the gateway's routing headers;
    `on_first` is called at the first token, `on_sent` once the request's
    bytes are written (before its response is awaited), `on_headers` at
    the response's headers (vLLM's API server has rendered the prompt and
    hands the request to its engine as the stream starts)."""
    body = {"model": "m", "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = None
    usage = {}
    ext = {}
    if on_sent is not None:
        # httpcore's trace hook: the body is on the socket, the response not
        # yet read (http.client's request() / getresponse() split).
        def trace(event, _info):
            if event == "http11.send_request_body.complete":
                on_sent()
        ext["trace"] = trace
    with client().stream("POST", f"{url}/v1/completions", json=body,
                         headers=extra_headers or {}, extensions=ext) as r:
        if on_headers is not None:
            on_headers()
        r.raise_for_status()
        if meta is not None:
            # Response headers: the router's routing and its engine's API
            # server accepted the request (vLLM sends a stream's headers
            # before its first token); the rest of the TTFT is the engine's
            # queue and prefill.
            meta["t_headers"] = time.perf_counter() - t0
            for k in ("x-inferencecache-engine", "x-inferencecache-route",
                      "x-inferencecache-reusable-tokens", "x-inferencecache-load",
                      "server-timing"):
                if k in r.headers:
                    meta[k] = r.headers[k]
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ttft is None and ev.get("choices"):
                ttft = time.perf_counter() - t0
                if on_first is not None:
                    on_first()
            if ev.get("usage"):
                usage = ev["usage"]
    pt = usage.get("prompt_tokens", 0)
    ct = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return ttft or (time.perf_counter() - t0), pt, ct


class HintClient:
    """The Python gateway: LookupRoute(token_ids) then forward."""

    def __init__(self, grpc_addr, engines, tok, work, deadline=1.0, caller_load=True,
                 ordered=True):
        import grpc
        from grpc_tools import protoc

        out = work / "pb"
        out.mkdir(exist_ok=True)
        proto = ROOT / "proto"
        rc = protoc.main(["protoc", f"-I{proto}", f"--python_out={out}", f"--grpc_python_out={out}",
                          str(proto / "inferencecache/v1alpha1/inferencecache.proto")])
        assert rc == 0, "protoc failed"
        sys.path.insert(0, str(out))
        from inferencecache.v1alpha1 import inferencecache_pb2 as pb
        from inferencecache.v1alpha1 import inferencecache_pb2_grpc as pbg

        self.pb = pb
        # One persistent channel, connected before the first request (as a
        # gateway connects at startup): the first lookup must not pay the
        # TCP + HTTP/2 handshake inside its deadline.
        self.channel = grpc.insecure_channel(grpc_addr)
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.stub = pbg.InferenceCacheStub(self.channel)
        self.deadline = deadline
        self.engines = engines
        self.ids = {f"r{i}": e for i, e in enumerate(engines)}
        self.tok = tok
        self.inflight = {e.url: 0 for e in engines}
        self.lock = threading.Lock()
        self.rr = 0
        # ReportCallerLoad (issue 36 item 4): the engines' requests in flight
        # and their uncached tokens, sent on every change as the Rust
        # gateway does in --server mode; a server without the call (the
        # baseline build) answers UNIMPLEMENTED and reporting stops.
        self.caller_load = caller_load
        self.caller = f"bench-{os.getpid()}-{id(self)}"
        self.pending = {e.url: 0 for e in engines}
        self.names = {e.url: rid for rid, e in self.ids.items()}
        # Forwarding in lookup order (docs/gateway.md, "The caller contract"):
        # a request's lookup and the write of its bytes to the engine happen
        # under one lock, released once the bytes are written (`sent`), so
        # requests reach the engines in the order the server answered them,
        # as a gateway that forwards as it picks does. Responses are never
        # serialized. ordered=False (policy prefix `unordered-`) is the
        # caller of sessions 42-44: threads may forward in another order.
        self.ordered = ordered
        self.order = threading.Lock()
        # ...and at the engine: vLLM's API server renders (tokenizes) each
        # prompt before handing it to the engine, and two requests written
        # a few ms apart can reach the scheduler the other way round (run
        # F2: request 8, written 7 ms after request 7 of the same new
        # system prompt, was scheduled first and reused none of the 1,568
        # tokens claimed on 7's tentative holding). So a request whose
        # prompt starts with the same block as one sent to the same engine
        # and not yet admitted (no response headers yet) is sent only once
        # that one is: `unadmitted` holds (engine url, first block, event)
        # in lookup order. Requests of other prefixes never wait.
        self.unadmitted = []

    def report_load(self):
        if not self.caller_load:
            return
        with self.lock:
            reps = [self.pb.CallerReplicaLoad(replica_id=self.names[u], in_flight=n,
                                              prefill_tokens=self.pending[u])
                    for u, n in self.inflight.items()]
        try:
            self.stub.ReportCallerLoad(self.pb.CallerLoadReport(
                caller=self.caller, timestamp_us=int(time.time() * 1e6), replicas=reps),
                timeout=self.deadline)
        except Exception as ex:  # never blocks a request
            code = getattr(ex, "code", None)
            if callable(code) and code().name == "UNIMPLEMENTED":
                self.caller_load = False

    def pick(self, prompt):
        """(engine, hinted tokens, lookup seconds, what the lookup said).
        Takes the order lock (when ordered): the caller must call `sent()`
        once the request's bytes are written, or the request failed."""
        ids = self.tok.encode(prompt)
        w0 = time.perf_counter()
        if self.ordered:
            self.order.acquire()
        t0 = time.perf_counter()
        hinted, engine = 0, None
        # order_wait: what forwarding in lookup order cost this request
        # before its lookup (TTFT is counted from the send, after both).
        info = {"failed_open": None, "server_us": None, "reason": None,
                "order_wait": t0 - w0, "t_lookup": time.time()}
        try:
            resp = self.stub.LookupRoute(
                self.pb.LookupRouteRequest(model_id="m", tenant_id="bench", hash_scheme="vllm",
                                           token_ids=ids), timeout=self.deadline)
            info["server_us"] = resp.lookup_latency_us
            info["reason"] = resp.reason_code
            if resp.replica_scores and resp.reason_code == "PREFIX_MATCH":
                engine = self.ids.get(resp.replica_scores[0].replica_id)
                hinted = resp.replica_scores[0].matched_tokens
            elif resp.replica_scores:
                engine = self.ids.get(resp.replica_scores[0].replica_id)
        except Exception as ex:  # fail open
            code = getattr(ex, "code", None)
            info["failed_open"] = code().name if callable(code) else type(ex).__name__
        cost = time.perf_counter() - t0
        with self.lock:
            if engine is None:
                engine = min(self.engines, key=lambda e: self.inflight[e.url])
            self.inflight[engine.url] += 1
            self.pending[engine.url] += max(0, len(ids) - hinted)
            info["uncached"] = max(0, len(ids) - hinted)
            if self.ordered:
                key = (engine.url, tuple(ids[:BLOCK]))
                info["after"] = [ev for k, ev in self.unadmitted if k == key]
                info["admitted"] = threading.Event()
                self.unadmitted.append((key, info["admitted"]))
        self.report_load()
        return engine, hinted, cost, info

    def admit_after(self, info):
        """Waits (outside the order lock) until the earlier requests of the
        same first block on the same engine were admitted; returns the wait."""
        after = info.pop("after", [])
        if not after:
            return 0.0
        t0 = time.perf_counter()
        for ev in after:
            ev.wait(timeout=30)  # set at headers or on failure; never hangs
        return time.perf_counter() - t0

    def admitted(self, info):
        """The request's response headers arrived (or it failed)."""
        ev = info.pop("admitted", None)
        if ev is not None:
            ev.set()
            with self.lock:
                self.unadmitted = [(k, e) for k, e in self.unadmitted if e is not ev]

    def sent(self):
        """The request's bytes are written (or it failed, or it waits for
        admission: the lock orders lookups and writes, the wait does the
        rest): the next lookup may run. Once per request (the caller's
        guard)."""
        if self.ordered:
            self.order.release()

    def prefilled(self, engine, uncached):
        """The first token: the prompt's uncached tokens are prefilled."""
        with self.lock:
            self.pending[engine.url] -= uncached
        self.report_load()

    def done(self, engine, unprefilled=0):
        with self.lock:
            self.inflight[engine.url] -= 1
            self.pending[engine.url] -= unprefilled
        self.report_load()


def hints_policy(name):
    """Whether `name` is a Python-gateway policy: [unordered-][plain-][base-]hints[+flag...]."""
    return (name.removeprefix("unordered-").removeprefix("plain-").removeprefix("base-")
            .split("+")[0] == "hints")


def run_policy(name, engines, reqs, conc, ctx):
    res = Result()
    # The routers are given the engines in this order (--worker-offset):
    # the peers send every new prefix to their first worker, so which engine
    # that is should alternate between runs if the engines are not equal.
    k = ctx.get("worker_offset", 0) % len(engines)
    workers = engines[k:] + engines[:k]
    router = None
    url = None
    hc = None
    rr = [0]
    rr_lock = threading.Lock()
    work = ctx["work"]
    try:
        if name in ("vllm-router-cache", "vllm-router-kv"):
            port = free_port()
            args = [str(ROUTERS / "bin/vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                    "--worker-urls", *[e.url for e in workers]]
            if name == "vllm-router-cache":
                args += ["--policy", "cache_aware"]
            else:
                args += ["--policy", "kv_aware", "--kv-event-block-size", str(BLOCK),
                         "--kv-event-model", "m"]
                for e in engines:
                    args += ["--kv-event-source", f"{e.url}=tcp://127.0.0.1:{e.ev}"]
            router = Proc(args, work / f"{name}.log")
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/health", 120, router.p, router.log)
            wait_routed(url, 120, router.p, router.log)
        elif name == "sglang-router":
            port = free_port()
            router = Proc([str(ROUTERS / "bin/python"), "-m", "sglang_router.launch_router",
                           "--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware",
                           "--worker-urls", *[e.url for e in workers]], work / f"{name}.log")
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/health", 120, router.p, router.log)
            wait_routed(url, 120, router.p, router.log)
        elif name.split("+")[0] == "gateway":
            port = free_port()
            args = [str(ctx["bin"]), "--log-level", "warn", "gateway", "--listen",
                    f"127.0.0.1:{port}"]
            for e in workers:
                args += ["--engine", e.url]
            # gateway+--flag=value+...: the same gateway with other flags.
            args += [a for a in name.split("+")[1:] if a]
            router = Proc(args, work / "gateway.log")
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/health", 120, router.p, router.log)
            wait_routed(url, 120, router.p, router.log)
        elif hints_policy(name):
            hc = ctx["hints"][name]
        if router:
            # Measure the router settled, not starting: a fresh gateway
            # replays each engine's buffered KV events from 0 into its index
            # (the whole run's history), and requests sent meanwhile met a
            # half-replayed index (stale claims at the opening, runs R1-R3 of
            # session 45) and its CPU. Runs AF-AJ waited 4.5 s by way of
            # --idle-probe; every policy waits here until its router is idle.
            waited = 0.0
            if name.split("+")[0] == "gateway":
                # An idle gateway can be waiting for its engines' event
                # histories without using CPU (settle() alone let three of
                # four 4-client passes of runs G4-G5 open `catching_up`).
                waited = wait_indexed(url)
            ctx["router_settle_s"] = round(waited + settle(router.p.pid), 2)

        def one(i_req):
            i, (s, prompt) = i_req
            hinted, cost, lk = None, None, {}
            t_lookup = time.time()
            if name in ("e0", "e1"):
                # One engine takes everything, no router: what a router
                # that keeps every request on one engine gets from it.
                e = engines[int(name[1])]
                target, eng = e.url, e.url
            elif name == "rr":
                with rr_lock:
                    e = engines[rr[0] % len(engines)]
                    rr[0] += 1
                target, eng = e.url, e.url
            elif hc is not None:
                e, hinted, cost, lk = hc.pick(prompt)
                t_lookup = lk.pop("t_lookup")
                target, eng = e.url, e.url
                held = [True]

                def release():
                    if held:
                        held.clear()
                        hc.sent()

                def sent():
                    lk.setdefault("t_sent", time.time())
                    release()

                if lk.get("after"):
                    release()
                    lk["admit_wait"] = hc.admit_after(lk)
            else:
                target, eng = url, None
            meta = {}
            if hc is None:
                t_lookup = time.time()  # the gateway looks up as it receives
            try:
                first = None
                left = {"n": lk.pop("uncached", 0)}
                t_first = {}
                if hc is not None:
                    def first():
                        t_first.setdefault("t", time.time())
                        hc.prefilled(e, left.pop("n", 0))
                ttft, pt, ct = send(target, prompt, meta=meta, on_first=first,
                                    on_sent=sent if hc is not None else None,
                                    on_headers=(lambda: hc.admitted(lk)) if hc is not None
                                    else None)
            finally:
                if hc is not None:
                    release()  # a request that failed before its bytes left
                    hc.admitted(lk)
                    lk.pop("after", None)
                    hc.done(e, left.get("n", 0))
            if name.startswith("gateway") and "x-inferencecache-reusable-tokens" in meta:
                # The gateway's own claim: what it expected this engine to reuse.
                hinted = int(meta["x-inferencecache-reusable-tokens"])
                eng = meta.get("x-inferencecache-engine")
            res.add(i=i, sys=s, ttft=ttft, prompt=pt, cached=ct, hinted=hinted, engine=eng,
                    lookup=cost, route=meta.get("x-inferencecache-route"), **lk,
                    t_headers=meta.get("t_headers"), load=meta.get("x-inferencecache-load"),
                    server_timing=meta.get("server-timing"),
                    t_lookup=t_lookup, t_first=t_first.get("t"), t_done=time.time())

        idle = ctx.get("idle_probe", 0)
        if idle:
            # What the router costs the engines while no request runs (its
            # metric scrapes, health checks): their CPU over `idle` seconds,
            # after a second that lets the last request's busy-wait end.
            time.sleep(1.5)
            r0 = cpu_seconds(router.p.pid) if router else None
            e0 = [group_cpu_seconds(e.proc.p.pid) for e in engines]
            time.sleep(idle)
            e1 = [group_cpu_seconds(e.proc.p.pid) for e in engines]
            r1 = cpu_seconds(router.p.pid) if router else None
            ctx["idle_cpu_pct"] = {
                "engines": [round((b - a) / idle * 100, 1) for a, b in zip(e0, e1)],
                "router": round((r1 - r0) / idle * 100, 1) if router else None}
        cpu0 = cpu_seconds(router.p.pid) if router else None
        ecpu0 = [group_cpu_seconds(e.proc.p.pid) for e in engines]
        # Each sending thread makes its HTTP client before its first request
        # is timed: made inside it (~50 ms of SSL context, run G4), it added
        # to every pass's first request whatever the router.
        with ThreadPoolExecutor(max_workers=conc, initializer=client) as ex:
            list(ex.map(one, enumerate(reqs)))
        cpu1 = cpu_seconds(router.p.pid) if router else None
        ctx["engine_cpu_s"] = [group_cpu_seconds(e.proc.p.pid) - c for e, c in zip(engines, ecpu0)]
        if name.startswith("gateway"):
            ctx["gateway_phases"] = gateway_phases(url)
        # The router's own CPU over the workload (the machine has 2 cores,
        # one per engine: whatever a router burns, an engine waits for).
        ctx["router_cpu_s"] = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    finally:
        if router:
            router.stop()
    return res.rows


def summarize(name, rows, sys_tokens):
    ttfts = sorted(r["ttft"] * 1000 for r in rows)
    q = statistics.quantiles(ttfts, n=10)
    prompt = sum(r["prompt"] for r in rows)
    cached = sum(r["cached"] for r in rows)
    full_miss = sum(1 for r in rows if r["cached"] < sys_tokens // 2)
    # Each full miss past the first of its system prompt (the workload's
    # minimum), with what the lookup said: where the extra ones come from.
    # sys_served_on: the engines that served that system prompt before
    # (the miss's engine among them: evicted there; not: placed away).
    seen, extra = {}, []
    for r in sorted(rows, key=lambda r: r["t_lookup"]):
        if r["cached"] < sys_tokens // 2 and r["sys"] in seen:
            extra.append({k: r.get(k) for k in ("i", "sys", "engine", "reason", "hinted",
                                                "failed_open", "lookup")}
                         | {"sys_served_on": sorted(seen[r["sys"]])})
        seen.setdefault(r["sys"], set()).add(r.get("engine"))
    out = {"policy": name, "n": len(rows), "ttft_mean": statistics.mean(ttfts),
           "ttft_p50": statistics.median(ttfts), "ttft_p90": q[8],
           "hit_rate": cached / prompt if prompt else 0.0, "full_misses": full_miss,
           "extra_full_misses": extra}
    hinted = [r for r in rows if r.get("hinted")]
    if hinted:
        exact = sum(1 for r in hinted if r["hinted"] == r["cached"])
        over = sum(1 for r in hinted if r["hinted"] > r["cached"])
        out.update(hints=len(hinted), hints_exact=exact, hints_over=over,
                   hinted_tokens=sum(r["hinted"] for r in hinted),
                   reused_tokens=sum(r["cached"] for r in hinted))
    routes = {}
    for r in rows:
        if r.get("route"):
            routes[r["route"]] = routes.get(r["route"], 0) + 1
    if routes:
        out["routes"] = routes
    causes = [r["over"] for r in hinted if r.get("over")]
    if causes:
        for c in ("stale", "after", "unseen"):
            out[f"over_{c}"] = sum(1 for x in causes if x[0] == c)
        out["over_lags_ms"] = [round(x[1] * 1000, 1) for x in causes if x[1] is not None]
    lk = sorted(r["lookup"] * 1000 for r in rows if r.get("lookup") is not None)
    if lk:
        out["lookup_ms_p50"] = statistics.median(lk)
        out["lookup_ms_p99"] = lk[min(len(lk) - 1, int(len(lk) * 0.99))]
        out["lookup_ms_max"] = lk[-1]
        failed = [r for r in rows if r.get("failed_open")]
        out["lookups_failed_open"] = len(failed)
        out["lookups_past_50ms"] = sum(1 for x in lk if x > 50)
        out["failed_open_client_ms"] = [round(r["lookup"] * 1000, 1) for r in failed]
        srv = sorted(r["server_us"] for r in rows if r.get("server_us") is not None)
        if srv:
            out["server_lookup_us_p50"] = srv[len(srv) // 2]
            out["server_lookup_us_max"] = srv[-1]
    return out


def run_order(concurrencies, policies, repeat):
    """(concurrency, pass, slot, policy) in the order they run.

    One pass runs every policy once. Where a policy sits in a pass moves its
    figures: in runs AF-AJ (session 44, one pass) the row that ran last had
    the lower 4-client p90 in all five runs. So passes alternate the order
    (ABBA: the policies as given, then reversed; a third pass rotates by
    one, a fourth reverses that, ...) and every policy's mean position is
    the same over an even number of passes; the judged figures are each
    policy's requests pooled over the passes."""
    out = []
    for conc in concurrencies:
        for p in range(repeat):
            k = (p // 2) % len(policies)
            order = policies[k:] + policies[:k]
            if p % 2:
                order = order[::-1]
            out += [(conc, p, slot, name) for slot, name in enumerate(order)]
    return out


def warm_up(engines, reqs, conc, passes):
    """The workload's shape (other system prompts and questions, the same
    lengths) sent round-robin straight to the engines at `conc` clients,
    `passes` times, before the first measured policy at that concurrency:
    the first requests of a new batch mix pay the engines' one-off costs
    (new step shapes), and no policy should pay them for the others. The
    caches are reset before each measured policy as always."""
    if passes <= 0:
        return
    t0 = time.time()
    for _ in range(passes):
        for e in engines:
            e.reset()
        n = [0]
        lock = threading.Lock()

        def one(i_req):
            _, (_, prompt) = i_req
            with lock:
                e = engines[n[0] % len(engines)]
                n[0] += 1
            send(e.url, prompt)

        with ThreadPoolExecutor(max_workers=conc) as ex:
            list(ex.map(one, enumerate(reqs)))
    print(f"warm-up at {conc} client(s): {passes} pass(es) of {len(reqs)} requests,"
          f" {time.time() - t0:.1f} s", flush=True)


def pass_label(s):
    if s.get("pass_") == "all":
        return f" (all {s['passes']} passes)"
    if "pass_" in s:
        return f" (pass {s['pass_']}, slot {s['slot']})"
    return ""


def pooled(runs, sys_tokens):
    """Each (cache, clients, policy)'s requests over every pass, summarized
    as one row: the judged figures of a run with --repeat."""
    groups = {}
    for r in runs:
        s = r["summary"]
        groups.setdefault((s["cache"], s["concurrency"], s["policy"]), []).append(r)
    out = []
    for (cache, conc, name), rs in groups.items():
        s = summarize(name, [x for r in rs for x in r["rows"]], sys_tokens)
        # Full misses and hit rate per pass are the workload's (each pass
        # starts from empty caches): report them per pass, summed.
        s.update(cache=cache, concurrency=conc, pass_="all", passes=len(rs),
                 slots=[r["summary"]["slot"] for r in rs])
        for k in ("router_cpu_ms",):
            v = [r["summary"].get(k) for r in rs if r["summary"].get(k) is not None]
            if v:
                s[k] = round(statistics.mean(v))
        out.append(s)
    return out


def print_order_effect(runs):
    """A policy's later pass against its earlier one, with the slots each
    ran in: the order effect, measured (ABBA puts the same policies early
    in one pass and late in the other)."""
    print("\n| cache | clients | policy | slots | TTFT mean ms, each pass | p90, each pass |")
    print("|---|---|---|---|---|---|")
    groups = {}
    for r in runs:
        s = r["summary"]
        groups.setdefault((s["cache"], s["concurrency"], s["policy"]), []).append(s)
    for (cache, conc, name), ss in groups.items():
        slots = ", ".join(str(s["slot"]) for s in ss)
        means = ", ".join(f"{s['ttft_mean']:.0f}" for s in ss)
        p90s = ", ".join(f"{s['ttft_p90']:.0f}" for s in ss)
        print(f"| {cache} | {conc} | {name} | {slots} | {means} | {p90s} |")


def busy_wait_arg(v):
    """--engine-busy-wait: seconds, or 'vllm' for the engines' own default."""
    if v == "vllm":
        return None
    try:
        return float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r}: seconds (e.g. 0) or 'vllm'") from None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", nargs="+", default=["256"], help="KV cache per engine: 1g or a block count")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--policies", nargs="+", default=["rr", "hints"])
    ap.add_argument("--systems", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--system-tokens", type=int, default=1536)
    ap.add_argument("--bin", default=str(ROOT / "target/release/inferencecache"))
    ap.add_argument("--base-bin", default=None,
                    help="the binary of base-hints[+flags] policies (the build before a change)")
    ap.add_argument("--out", default=None, help="write every row and summary as JSON here")
    ap.add_argument("--keep-logs", default=None, metavar="DIR",
                    help="copy every child's log (serve, subscribe, engines, routers) to DIR at the end; "
                         "with INFERENCECACHE_LOG=info,inferencecache::decisions=debug the serve logs "
                         "hold each routing decision's estimates and the load reports behind them")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--worker-offset", type=int, default=0,
                    help="rotate the engine list the routers are given (1: engine 1 first)")
    ap.add_argument("--engine-busy-wait", type=busy_wait_arg, default=0.0, metavar="S|vllm",
                    help="a bench setting for two engines on two shared cores, never a product one:"
                         " vLLM's shm readers busy-wait S s after each read, for every policy alike"
                         " (engine_busy_wait/sitecustomize.py). Default 0, the setting the comparison"
                         " is judged on (issue 34: on this host the spin of one engine takes the core"
                         " the client and routers share; a real deployment gives each engine its own"
                         " cores); an idle reader then rechecks every 10 ms instead of 5 s."
                         " 'vllm' runs vLLM's own default (1 s)")
    ap.add_argument("--no-caller-load", action="store_true",
                    help="the Python gateway does not report its requests in flight (ReportCallerLoad)")
    ap.add_argument("--hint-deadline-ms", type=float, default=1000, metavar="MS",
                    help="the Python gateway's LookupRoute deadline; past it the lookup fails"
                         " open (the request goes to the engine with fewest in flight). 1 s: on"
                         " this 2-core host the client itself is descheduled for 50-400 ms while"
                         " the server's handler takes < 0.3 ms (docs/decisions.md, issue 33,"
                         " session 42); 50 reproduces runs N1/N2, the SDK's default is 20")
    ap.add_argument("--idle-probe", type=float, default=0, metavar="S",
                    help="per policy, with its router up and no request running, measure the"
                         " engines' and the router's CPU over S s (what its polling costs)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run every policy N times per concurrency, the order alternating"
                         " (ABBA: as given, reversed, rotated by one, ...); the judged rows pool"
                         " each policy's passes (run_order)")
    ap.add_argument("--warmup", type=int, default=1, metavar="N",
                    help="passes of a warm-up workload (other prompts, same shape) sent"
                         " round-robin at each concurrency before its first policy, so no policy"
                         " pays the engines' first requests (0: none, as before session 45)")
    a = ap.parse_args()

    from transformers import AutoTokenizer

    model = make_model()
    tok = AutoTokenizer.from_pretrained(str(model))
    reqs = workload(tok, a.systems, a.requests, a.system_tokens, a.seed)
    work = Path(tempfile.mkdtemp(prefix="ic-real-vllm-"))
    models_dir = work / "models"
    (models_dir).mkdir()
    os.symlink(model, models_dir / "m")
    report = {"machine": os.uname().nodename, "nproc": os.cpu_count(), "runs": []}
    for cache in a.cache:
        blocks = None if cache == "1g" else int(cache)
        engines = [Engine(model, cpu, blocks, work, busy_wait=a.engine_busy_wait) for cpu in (0, 1)]
        side = []
        taps = []
        try:
            for e in engines:
                wait_http(f"{e.url}/health", 900, e.proc.p, e.proc.log)
            taps = [EventTap(e) for e in engines]
            ctx = {"work": work, "bin": Path(a.bin), "models_dir": models_dir,
                   "worker_offset": a.worker_offset, "idle_probe": a.idle_probe}
            # hints+--flag+...: another serve (and sidecars) with those flags.
            for hname in [p for p in a.policies
                          if hints_policy(p)]:
                g, h = free_port(), free_port()
                tag = str(len(ctx.get("hints", {})))
                # base-hints...: the same with --base-bin's serve and sidecars
                # (the build before a change, in the same run).
                core = hname.removeprefix("unordered-")
                bin_ = a.base_bin if core.removeprefix("plain-").startswith("base-") else a.bin
                if not bin_:
                    sys.exit(f"{hname} needs --base-bin")
                side.append(Proc([bin_, "serve", "--grpc-bind-address", f"127.0.0.1:{g}",
                                  "--http-bind-address", f"127.0.0.1:{h}",
                                  "--snapshot-bind-address", f"127.0.0.1:{free_port()}",
                                  *[f for f in hname.split("+")[1:] if f]],
                                 work / f"serve{tag}.log"))
                wait_http(f"http://127.0.0.1:{h}/readyz", 60, side[-1].p, side[-1].log)
                ctx.setdefault("serve_http", {})[hname] = f"http://127.0.0.1:{h}"
                for i, e in enumerate(engines):
                    sc_http = free_port()
                    ctx.setdefault("sidecars", {}).setdefault(hname, []).append(
                        f"http://127.0.0.1:{sc_http}")
                    side.append(Proc([bin_, "subscribe", "--replica-id", f"r{i}", "--model-id", "m",
                                      "--tenant-id", "bench",
                                      "--engine-endpoint", f"tcp://127.0.0.1:{e.ev}",
                                      "--replay-endpoint", f"tcp://127.0.0.1:{e.replay}",
                                      "--engine-metrics-url", f"{e.url}/metrics",
                                      "--server", f"127.0.0.1:{g}",
                                      "--http-bind-address", f"127.0.0.1:{sc_http}"],
                                     work / f"subscribe{tag}-{i}.log"))
                ctx.setdefault("hints", {})[hname] = HintClient(
                    f"127.0.0.1:{g}", engines, tok, work, deadline=a.hint_deadline_ms / 1000,
                    caller_load=not (a.no_caller_load or core.startswith("plain-")),
                    ordered=not hname.startswith("unordered-"))
            warm = workload(tok, a.systems, a.requests, a.system_tokens, a.seed + 1000)
            for conc, pass_, slot, name in run_order(a.concurrency, a.policies, a.repeat):
                if slot == 0 and pass_ == 0:
                    warm_up(engines, warm, conc, a.warmup)
                for e in engines:
                    e.reset()
                time.sleep(0.5)  # let the clear reach the index before the first lookup
                ev0 = eviction_buckets(ctx.get("sidecars", {}).get(name, []))
                rpc0 = eviction_buckets(ctx.get("sidecars", {}).get(name, []), RPC_SERIES)
                ack0 = eviction_buckets(ctx.get("sidecars", {}).get(name, []), ACK_SERIES)
                sl0 = serve_lookups(ctx.get("serve_http", {}).get(name))
                es0 = [engine_sums(e.url) for e in engines]
                rows = run_policy(name, engines, reqs, conc, ctx)
                es1 = [engine_sums(e.url) for e in engines]
                ev1 = eviction_buckets(ctx.get("sidecars", {}).get(name, []))
                rpc1 = eviction_buckets(ctx.get("sidecars", {}).get(name, []), RPC_SERIES)
                ack1 = eviction_buckets(ctx.get("sidecars", {}).get(name, []), ACK_SERIES)
                time.sleep(0.3)  # the last request's KV events reach the taps
                for r in rows:
                    try:
                        r["served_by"] = served_by(tok.encode(reqs[r["i"]][1]), r, taps)
                    except Exception as ex:  # a diagnosis, never the run
                        print(f"served_by failed: {ex!r}", file=sys.stderr)
                # The Python gateway records the URL, the gateway its id (host:port).
                by_url = {k: t for e, t in zip(engines, taps)
                          for k in (e.url, e.url.removeprefix("http://"))}
                for r in rows:
                    tap = by_url.get(r.get("engine"))
                    if r.get("hinted") and tap and hints_policy(name):
                        try:
                            r["announced"] = announced(r, tok.encode(reqs[r["i"]][1]), tap)
                        except Exception as ex:  # a diagnosis, never the run
                            print(f"announced failed: {ex!r}", file=sys.stderr)
                    if tap and hints_policy(name):
                        ids = tok.encode(reqs[r["i"]][1])
                        r["chain"] = [tap.name(h) for h in tap.chain(ids, len(ids) // BLOCK)]
                    if r.get("hinted") and r["hinted"] > r["cached"] and tap:
                        try:
                            ids = tok.encode(reqs[r["i"]][1])
                            r["over"] = classify(r, ids, tap)
                        except Exception as ex:  # a diagnosis, never the run
                            r["over"] = ("unseen", None)
                            print(f"classify failed: {ex!r}", file=sys.stderr)
                s = summarize(name, rows, a.system_tokens)
                s.update(cache=cache, concurrency=conc, engines=per_engine(rows, es0, es1),
                         pass_=pass_, slot=slot)
                if ctx.get("gateway_phases"):
                    s["gateway_phases_mean_ms"] = ctx.pop("gateway_phases")
                s["engine_cpu_ms"] = [round(c * 1000) for c in ctx.pop("engine_cpu_s", [])]
                if ctx.get("idle_cpu_pct"):
                    s["idle_cpu_pct"] = ctx.pop("idle_cpu_pct")
                s["engine_busy_wait_s"] = a.engine_busy_wait
                if ctx.get("router_cpu_s") is not None:
                    s["router_cpu_ms"] = round(ctx.pop("router_cpu_s") * 1000)
                if ctx.get("router_settle_s") is not None:
                    s["router_settle_s"] = ctx.pop("router_settle_s")
                if hints_policy(name):
                    n, p50 = bucket_quantile(ev0, ev1, 0.5)
                    _, p99 = bucket_quantile(ev0, ev1, 0.99)
                    _, rpc_p99 = bucket_quantile(rpc0, rpc1, 0.99)
                    acks, ack_p99 = bucket_quantile(ack0, ack1, 0.99)
                    s.update(evictions=n, eviction_visible_p50_le_s=p50,
                             eviction_visible_p99_le_s=p99, eviction_rpc_p99_le_s=rpc_p99,
                             stream_acks=acks, stream_ack_p99_le_s=ack_p99)
                    s.update(serve_lookup_delta(sl0, serve_lookups(ctx["serve_http"][name])))
                run = {"summary": s, "rows": rows}
                if rows and hints_policy(name):
                    t0 = min(r["t_lookup"] for r in rows) - 0.2
                    t1 = max(r["t_done"] for r in rows) + 0.3
                    run["events"] = {e.url: t.events(t0, t1) for e, t in zip(engines, taps)}
                report["runs"].append(run)
                print(json.dumps(s), flush=True)
        finally:
            for t in taps:
                t.close()
            for p in side:
                p.stop()
            for e in engines:
                e.proc.stop()
    if a.repeat > 1:
        report["pooled"] = pooled(report["runs"], a.system_tokens)
        print_order_effect(report["runs"])
    print("\n| cache | clients | policy | TTFT mean ms | p50 | p90 | hit rate | full misses | hints exact / over |"
          " lookups failed open | lookup ms p50 / p99 / max (client) | server µs max (handler) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in report["runs"] + [{"summary": x} for x in report.get("pooled", [])]:
        s = r["summary"]
        h = f"{s['hints_exact']}/{s['hints']} exact, {s['hints_over']} over" if "hints" in s else ""
        if s.get("hints_over"):
            h += (f" (stale {s.get('over_stale', 0)}, after the hint {s.get('over_after', 0)},"
                  f" unseen {s.get('over_unseen', 0)})")
        print(f"| {s['cache']} | {s['concurrency']} | {s['policy']}{pass_label(s)} | {s['ttft_mean']:.0f} | "
              f"{s['ttft_p50']:.0f} | {s['ttft_p90']:.0f} | {s['hit_rate']:.1%} | {s['full_misses']} | {h} | "
              + (f"{s['lookups_failed_open']} ({s['lookups_past_50ms']} past 50 ms) | {s['lookup_ms_p50']:.1f} / {s['lookup_ms_p99']:.1f} / "
                 f"{s['lookup_ms_max']:.1f} | {s.get('server_lookup_us_max', '')} |"
                 if "lookups_failed_open" in s else "| | |"))
    # Evictions reach lookups (the sidecars' eviction_visible_seconds: engine
    # batch at the sidecar -> the server's ack), per run with sidecars.
    for r in report["runs"]:
        s = r["summary"]
        if s.get("evictions"):
            print(f"eviction to lookup, {s['cache']} cache, {s['concurrency']} client(s): "
                  f"{s['evictions']} evictions, p50 <= {s['eviction_visible_p50_le_s']} s, "
                  f"p99 <= {s['eviction_visible_p99_le_s']} s")
    print("\n| cache | clients | policy | router CPU ms | router settled after s | engines' CPU ms | idle: engines', router's CPU % | engine 0: requests, client TTFT ms, engine TTFT ms | engine 1: same |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in report["runs"]:
        s = r["summary"]
        per = [f"{e['n']}, {e['client_ttft_ms']}, {e['engine_time_to_first_token_ms']}"
               for e in s.get("engines", [])]
        idle = s.get("idle_cpu_pct")
        idle = f"{idle['engines']}, {idle['router']}" if idle else ""
        print(f"| {s['cache']} | {s['concurrency']} | {s['policy']}{pass_label(s)} | {s.get('router_cpu_ms', '')} | "
              f"{s.get('router_settle_s', '')} | "
              f"{s.get('engine_cpu_ms', '')} | {idle} | " + " | ".join(per) + " |")
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))
    if a.keep_logs:
        keep = Path(a.keep_logs)
        keep.mkdir(parents=True, exist_ok=True)
        for f in work.glob("*.log"):
            shutil.copy(f, keep / f.name)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
