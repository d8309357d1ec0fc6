#!/usr/bin/env python3
"""The controlled run behind `run.py --engine-busy-wait`: does vLLM's shm
busy-wait slow two engines that alternate on a 2-core host?

Two engines as run.py starts them (1 GiB caches: nothing is evicted), one
1,536-token system prompt warmed on both, then sequential requests that
all reuse it (hits only: the same prefill work under every policy), round
robin (`rr`) against everything on engine 0 (`e0`), interleaved `--rounds`
times; then the same with the engines' readers not busy-waiting
(`--engine-busy-wait 0`). Per cell: client TTFT median / mean, and each
engine's CPU (its whole process session) over the cell.

  V=/var/cache/inferencecache/vllm-venv
  flock /work/helpers/engines.lock $V/bin/python bench/real-vllm/busy_wait.py
"""
import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import run  # bench/real-vllm/run.py: the same engines, client and workload

SYSTEM_TOKENS = 1536


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=24, help="per cell")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--settings", nargs="+", default=["default", "0.1", "0"],
                    help="engine busy-wait settings: default (vLLM's 1 s) or seconds")
    a = ap.parse_args()
    from transformers import AutoTokenizer

    model = run.make_model()
    tok = AutoTokenizer.from_pretrained(str(model))
    n = len(a.settings) * (2 * a.rounds * a.requests + 2)
    reqs = run.workload(tok, 1, n, SYSTEM_TOKENS, 11)
    work = Path(tempfile.mkdtemp(prefix="ic-busy-wait-"))
    out = []
    k = 0
    try:
        for setting in a.settings:
            busy = None if setting == "default" else float(setting)
            engines = [run.Engine(model, cpu, None, work, busy_wait=busy) for cpu in (0, 1)]
            try:
                for e in engines:
                    run.wait_http(f"{e.url}/health", 900, e.proc.p, e.proc.log)
                for e in engines:  # the system prompt, cached on both
                    run.send(e.url, reqs[k][1])
                    k += 1
                for rnd in range(a.rounds):
                    for policy in ("rr", "e0"):
                        time.sleep(1.5)  # the last busy-wait ends
                        c0 = [run.group_cpu_seconds(e.proc.p.pid) for e in engines]
                        t0 = time.time()
                        ttfts, cached = [], []
                        for i in range(a.requests):
                            e = engines[i % 2] if policy == "rr" else engines[0]
                            ttft, pt, ct = run.send(e.url, reqs[k][1])
                            k += 1
                            ttfts.append(ttft * 1000)
                            cached.append(ct / pt if pt else 0)
                        wall = time.time() - t0
                        c1 = [run.group_cpu_seconds(e.proc.p.pid) for e in engines]
                        row = {"busy_wait": setting, "round": rnd, "policy": policy,
                               "ttft_median_ms": round(statistics.median(ttfts), 1),
                               "ttft_mean_ms": round(statistics.mean(ttfts), 1),
                               "ttft_p90_ms": round(statistics.quantiles(ttfts, n=10)[8], 1),
                               "hit_rate": round(sum(cached) / len(cached), 3),
                               "engine_cpu_pct": [round((b - x) / wall * 100) for x, b in zip(c0, c1)],
                               "wall_s": round(wall, 1)}
                        out.append(row)
                        print(json.dumps(row), flush=True)
            finally:
                for e in engines:
                    e.proc.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| engine busy-wait | round | policy | TTFT median ms | mean | p90 | hit rate | engines' CPU % |")
    print("|---|---|---|---|---|---|---|---|")
    for r in out:
        print(f"| {r['busy_wait']} | {r['round']} | {r['policy']} | {r['ttft_median_ms']} | "
              f"{r['ttft_mean_ms']} | {r['ttft_p90_ms']} | {r['hit_rate']:.1%} | {r['engine_cpu_pct']} |")


if __name__ == "__main__":
    main()
