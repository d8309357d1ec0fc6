#!/usr/bin/env python3
"""Writes gRPC request bodies for h2load: a 5-byte frame header (flag 0,
big-endian u32 length) followed by a hand-encoded protobuf message, so the
load generator needs no protobuf library and this script none either.

  frames.py OUTDIR [--blocks 32] [--replicas 4]

writes OUTDIR/lookup.bin (a LookupRouteRequest over a BLOCKS-block chain),
OUTDIR/health.bin (an empty HealthCheckRequest) and OUTDIR/report-N.bin (a
CacheStateUpdate in which replica N holds the first BLOCKS*(N+1)/REPLICAS
blocks of that chain, so the lookup ranks every replica)."""

import argparse
import os
import struct


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, wire, payload):
    return varint((num << 3) | wire) + payload


def ln(num, data):
    return field(num, 2, varint(len(data)) + data)


def packed(num, values):
    return ln(num, b"".join(varint(v) for v in values))


def frame(msg):
    return b"\x00" + struct.pack(">I", len(msg)) + msg


def block(i):
    return struct.pack(">Q", 0xB10C_0000 + i)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("outdir")
    p.add_argument("--blocks", type=int, default=32)
    p.add_argument("--replicas", type=int, default=4)
    a = p.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    chain = [block(i) for i in range(a.blocks)]
    lookup = (
        ln(1, b"m")
        + ln(2, b"t")
        + ln(5, b"vllm")
        + b"".join(ln(7, h) for h in chain)
        + packed(8, [16] * a.blocks)
    )
    with open(os.path.join(a.outdir, "lookup.bin"), "wb") as f:
        f.write(frame(lookup))
    with open(os.path.join(a.outdir, "health.bin"), "wb") as f:
        f.write(frame(b""))
    for r in range(a.replicas):
        n = max(1, a.blocks * (r + 1) // a.replicas)
        entry = b"".join(ln(3, h) for h in chain[:n]) + packed(4, [16] * n)
        update = (
            ln(1, f"replica-{r}".encode())
            + ln(2, b"m")
            + ln(3, b"t")
            + ln(4, b"vllm")
            + ln(6, entry)
        )
        with open(os.path.join(a.outdir, f"report-{r}.bin"), "wb") as f:
            f.write(frame(update))


if __name__ == "__main__":
    main()
