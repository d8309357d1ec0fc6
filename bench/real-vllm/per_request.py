#!/usr/bin/env python3
"""Where each policy's TTFT goes, per request, from a `run.py --out` report.

For every request: the engine that served it (the engines' own KV events),
hit or full miss, what that engine had in flight when the request was sent
(requests before their first token: a prefill it waits behind; after it:
decoding), whether the other engine was idle then, the time to response
headers (router + the engine's API server) and the rest of the TTFT (the
engine's queue and prefill). Then, per policy, the TTFT sum split by those
classes: which requests make a policy's mean and p90.

  python3 bench/real-vllm/per_request.py REPORT.json [--policy gateway] [--rows]
"""
import argparse
import json
import statistics


def classify(rows, sys_tokens):
    out = []
    for r in rows:
        t0 = r["t_lookup"]
        eng = r.get("served_by")
        ahead_prefill = ahead_decode = 0
        other_busy = 0
        for o in rows:
            if o is r:
                continue
            o0, o1 = o["t_lookup"], o["t_done"]
            if not (o0 <= t0 < o1):
                continue
            first = o0 + o["ttft"]
            if o.get("served_by") == eng:
                if t0 < first:
                    ahead_prefill += 1
                else:
                    ahead_decode += 1
            else:
                other_busy += 1
        miss = r["cached"] < sys_tokens // 2
        hdr = r.get("t_headers")
        out.append({
            "i": r["i"], "sys": r["sys"], "engine": eng, "miss": miss,
            "ttft_ms": r["ttft"] * 1000,
            "headers_ms": hdr * 1000 if hdr is not None else None,
            "ahead_prefill": ahead_prefill, "ahead_decode": ahead_decode,
            "other_busy": other_busy, "load": r.get("load"),
            "timing": r.get("server_timing"), "t": t0,
            "route": r.get("route") or r.get("reason"), "hinted": r.get("hinted"),
            "cached": r["cached"], "announced": r.get("announced"),
            "sent": r.get("t_sent"), "over": r.get("over"), "admit_wait": r.get("admit_wait"),
        })
    return out


def kind(c):
    what = "miss" if c["miss"] else "hit"
    if c["ahead_prefill"]:
        where = "behind a prefill" + (", other engine idle" if not c["other_busy"] else "")
    elif c["ahead_decode"]:
        where = "beside a decode"
    else:
        where = "engine idle"
    return f"{what}, {where}"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report")
    ap.add_argument("--policy", default=None, help="only policies starting with this")
    ap.add_argument("--rows", action="store_true", help="print every request")
    ap.add_argument("--system-tokens", type=int, default=1536)
    ap.add_argument("--opening", type=int, default=10,
                    help="the first N requests by send time (the cold opening) against the rest")
    a = ap.parse_args()
    rep = json.load(open(a.report))
    for run in rep["runs"]:
        s = run["summary"]
        if a.policy and not s["policy"].startswith(a.policy):
            continue
        cs = classify(run["rows"], a.system_tokens)
        total = sum(c["ttft_ms"] for c in cs)
        ttfts = sorted(c["ttft_ms"] for c in cs)
        p90 = statistics.quantiles(ttfts, n=10)[8]
        hdr = [c["headers_ms"] for c in cs if c["headers_ms"] is not None]
        where = f" (pass {s['pass_']}, slot {s['slot']})" if "pass_" in s else ""
        first = [c["ttft_ms"] for c in sorted(cs, key=lambda c: c["t"])[:a.opening]]
        rest = [c["ttft_ms"] for c in sorted(cs, key=lambda c: c["t"])[a.opening:]]
        print(f"\n## {s['policy']}{where}, {s['concurrency']} client(s): first {a.opening} requests"
              f" mean {statistics.mean(first):.0f} ms, the rest {statistics.mean(rest):.0f} ms")
        print(f"{s['policy']}: mean {statistics.mean(ttfts):.0f}"
              f" p90 {p90:.0f} ms; headers mean {statistics.mean(hdr) if hdr else float('nan'):.1f} ms;"
              f" per engine {[sum(1 for c in cs if c['engine'] == e) for e in (0, 1)]}")
        groups = {}
        for c in cs:
            groups.setdefault(kind(c), []).append(c)
        print("| class | n | TTFT mean | median | max | share of the TTFT sum | at or over p90 |")
        print("|---|---|---|---|---|---|---|")
        for k, g in sorted(groups.items(), key=lambda kv: -sum(c["ttft_ms"] for c in kv[1])):
            t = [c["ttft_ms"] for c in g]
            print(f"| {k} | {len(g)} | {statistics.mean(t):.0f} | {statistics.median(t):.0f} |"
                  f" {max(t):.0f} | {sum(t) / total:.0%} | {sum(1 for x in t if x >= p90)} |")
        for e in (0, 1):
            hits = [c["ttft_ms"] for c in cs if c["engine"] == e and not c["miss"]
                    and not c["ahead_prefill"] and not c["ahead_decode"]]
            miss = [c["ttft_ms"] for c in cs if c["engine"] == e and c["miss"]
                    and not c["ahead_prefill"] and not c["ahead_decode"]]
            if hits or miss:
                print(f"engine {e} alone: hit median"
                      f" {statistics.median(hits) if hits else float('nan'):.0f} ms ({len(hits)}),"
                      f" miss median {statistics.median(miss) if miss else float('nan'):.0f} ms"
                      f" ({len(miss)})")
        claims = [c for c in cs if c["announced"] is not None and c["route"] == "PREFIX_MATCH"]
        if claims:
            # Claims past what the engine had announced stored at the lookup
            # rest on the server's tentative holdings (hints still being
            # prefilled): what declining those would turn into under-claims.
            ahead = [c for c in claims if c["hinted"] > c["announced"]]
            sent = [c for c in cs if c["sent"]]
            swapped = sum(1 for x in sent for y in sent
                          if x["t"] < y["t"] and x["sent"] > y["sent"])
            print(f"PREFIX_MATCH claims: {len(claims)}; past the announced blocks: {len(ahead)}"
                  f" ({sum(1 for c in ahead if c['hinted'] == c['cached'])} exact,"
                  f" {sum(1 for c in ahead if c['hinted'] > c['cached'])} over,"
                  f" {sum(1 for c in ahead if c['hinted'] < c['cached'])} under);"
                  f" request pairs sent in the other order than looked up: {swapped}")
        if a.rows:
            t0 = min(c["t"] for c in cs)
            for c in sorted(cs, key=lambda c: c["t"]):
                print(f"  t={1000 * (c['t'] - t0):7.0f} i={c['i']:2} sys={c['sys']} e{c['engine']}"
                      f" {'MISS' if c['miss'] else 'hit '} ttft={c['ttft_ms']:6.1f}"
                      f" hdr={c['headers_ms'] or 0:6.1f} ahead=p{c['ahead_prefill']}/d{c['ahead_decode']}"
                      f" other={c['other_busy']} cached={c['cached']}"
                      + (f" {c['route']} claim={c['hinted']}" if c['route'] else "")
                      + (f" (announced {c['announced']})" if c['announced'] is not None else "")
                      + (f" sent=+{1000 * (c['sent'] - c['t']):.0f}"
                         f" first@{1000 * (c['sent'] - t0 + c['ttft_ms'] / 1000):.0f}"
                         if c['sent'] else "")
                      + (f" admit-wait={1000 * c['admit_wait']:.0f}" if c['admit_wait'] else "")
                      + (f" OVER {c['over']}" if c['over'] else "")
                      + f" {c['load'] or ''} {c['timing'] or ''}")


if __name__ == "__main__":
    main()
