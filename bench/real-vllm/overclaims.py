#!/usr/bin/env python3
"""Each over-claimed hint of a `run.py --out` report, against its engine's
own events: which claimed block went, when, what the engine stored in the
same step (the request whose allocation evicted it), and every request on
that engine around it with its start (first store), first token and end.
vLLM frees a request's blocks when it *ends* (tail first), so the order
requests end in is the order their blocks are evicted in; the server's
foresight orders them by start (issue 33, session 48).

  python3 bench/real-vllm/overclaims.py REPORT.json [--window 4]
"""
import argparse
import json


def first_event(events, h, kind, after):
    for t, k, hs in events:
        if k == kind and t >= after and h in hs:
            return t
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--window", type=float, default=4.0,
                    help="seconds before the lookup to list requests from")
    a = ap.parse_args()
    rep = json.load(open(a.report))
    for run in rep["runs"]:
        s = run["summary"]
        evs = run.get("events")
        if not evs:
            continue
        rows = run["rows"]
        t0 = min(r["t_lookup"] for r in rows)
        over = [r for r in rows if r.get("hinted") and r["hinted"] > r["cached"]]
        print(f"== {s['policy']} pass {s.get('pass_')} c={s['concurrency']}: "
              f"{s.get('hints_exact')}/{s.get('hints')} exact, {len(over)} over")
        for r in over:
            ev = evs.get(r["engine"], [])
            first = r["cached"] // 32
            chain = r.get("chain") or []
            h = chain[first] if first < len(chain) else None
            gone = first_event(ev, h, "R", r["t_lookup"] - 5) if h else None
            print(f"-- request {r['i']} sys {r['sys']} on {r['engine']}: hinted {r['hinted']}"
                  f" reused {r['cached']} (announced {r.get('announced')}), over {r.get('over')}")
            print(f"   lookup {r['t_lookup'] - t0:.3f} sent {(r.get('t_sent') or 0) - t0:.3f}"
                  f" first {(r.get('t_first') or 0) - t0:.3f} done {r['t_done'] - t0:.3f};"
                  f" block {first} ({h}) removed at {gone - t0 if gone else None}")
            if gone:
                # The step that evicted it: removals and stores within 5 ms.
                step = [(t - t0, k, len(hs), hs[:3]) for t, k, hs in ev if abs(t - gone) < 0.005]
                print(f"   step: {step}")
            lo = r["t_lookup"] - a.window
            for o in sorted(rows, key=lambda o: o["t_lookup"]):
                if o["engine"] != r["engine"] or o["t_done"] < lo or o["t_lookup"] > r["t_done"]:
                    continue
                oc = o.get("chain") or []
                stored = [t for t, k, hs in ev if k == "S" and t >= o["t_lookup"]
                          and any(x in hs for x in oc[o["cached"] // 32:])]
                uses = h in oc[:max(o["cached"] // 32, 0)] or h in oc[o["cached"] // 32:]
                print(f"   {'*' if o is r else ' '} req {o['i']:3d} sys {o['sys']} blocks {len(oc):3d}"
                      f" hinted {o.get('hinted')} reused {o['cached']:5d} lookup {o['t_lookup'] - t0:7.3f}"
                      f" stored {min(stored) - t0 if stored else float('nan'):7.3f}"
                      f" first {(o.get('t_first') or t0) - t0:7.3f} done {o['t_done'] - t0:7.3f}"
                      f" {'uses the block' if uses else ''}")


if __name__ == "__main__":
    main()
