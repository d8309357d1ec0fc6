#!/usr/bin/env python3
"""Alternate bench-peers builds on a noisy machine and print medians.

These 2-vCPU machines swing by 20-40 % from one minute to the next, so a
before/after comparison is only fair when the builds take turns: round 1
runs A then B, round 2 runs A then B again, and so on. Each line of the
output is one build and mode, with the median and the range over the
rounds of events/s, lookup p50 and lookup p99.

    bench/peers/ab.py --rounds 8 /path/to/bench-peers-before /path/to/bench-peers-after \\
        -- --scale 16 --no-threaded

Arguments after `--` go to every bench-peers run (`--repeat 1` and
`--only 'ours ('` are added unless given). Copy each build out of the target
directory first: a rebuild overwrites the binary in place.
"""

import argparse
import re
import statistics
import subprocess
import sys

ROW = re.compile(
    r"^ours \(inferencecache-index\) (1 thread|threaded): (?:writer )?([\d.]+) ([Mk]) events/s, "
    r"(?:reader )?p50 (\d+) p99 (\d+)"
)


def run(binary, args):
    out = subprocess.run([binary, *args], capture_output=True, text=True, check=True)
    for line in (out.stdout + out.stderr).splitlines():
        m = ROW.match(line)
        if m:
            # bench-peers prints "874 k" below a million: both count.
            scale = 1.0 if m.group(3) == "M" else 1e-3
            yield m.group(1), round(float(m.group(2)) * scale, 3), int(m.group(4)), int(m.group(5))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6, help="rounds of every build (default 6)")
    p.add_argument("builds", nargs="+", help="bench-peers binaries, run in this order each round")
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    a = p.parse_args(argv)
    if "--repeat" not in extra:
        extra += ["--repeat", "1"]
    if "--only" not in extra:
        extra += ["--only", "ours ("]
    seen = {}
    for r in range(a.rounds):
        for b in a.builds:
            for mode, ev, p50, p99 in run(b, extra):
                seen.setdefault((b, mode), []).append((ev, p50, p99))
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    for (b, mode), v in seen.items():
        col = lambda k: [x[k] for x in v]
        med = lambda k: statistics.median(col(k))
        print(
            f"{b} [{mode}] n={len(v)}: events/s {med(0):.2f} M ({min(col(0))}-{max(col(0))}), "
            f"p50 {med(1):.0f} ns ({min(col(1))}-{max(col(1))}), "
            f"p99 {med(2):.0f} ns ({min(col(2))}-{max(col(2))})"
        )


if __name__ == "__main__":
    main()
