"""A stand-in engine for Kubernetes end-to-end tests, where no GPU engine
runs: it publishes KV events exactly as vLLM >= 0.26 does (ZMQ PUB on
tcp://*:5557, topic "kv-events", frames [topic, seq (8-byte BE),
msgpack(EventBatch)], events as tagged maps) and serves /health and an
empty /metrics on the engine port, so the injected kvevent-subscriber
sidecar sees an engine.

It stores one chain of blocks, derived from STANDIN_TOKENS (default: tokens
0..127 in blocks of STANDIN_BLOCK_SIZE=16), and re-sends it every
STANDIN_PERIOD seconds for the first STANDIN_REPUBLISH_FOR seconds, so a
late subscriber (ZMQ slow joiner) still gets it; re-storing a block is
idempotent in the index. After that it goes quiet (but keeps serving):
what the index holds from then on is what the sidecar holds, which is
what a server restart must get back by resync.

Only Debian's python3, python3-zmq and python3-msgpack are needed.
"""
import http.server
import os
import struct
import sys
import threading
import time

import msgpack
import zmq

PORT = int(os.environ.get("STANDIN_PORT", "8000"))
BLOCK = int(os.environ.get("STANDIN_BLOCK_SIZE", "16"))
TOKENS = [int(t) for t in os.environ.get("STANDIN_TOKENS", ",".join(map(str, range(128)))).split(",")]
PERIOD = float(os.environ.get("STANDIN_PERIOD", "2"))
REPUBLISH_FOR = float(os.environ.get("STANDIN_REPUBLISH_FOR", "1e9"))
# What the sidecar's stats path scrapes from vLLM (gauges and counters).
METRICS = b"""# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.05
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 128
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 64
"""


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = METRICS if self.path == "/metrics" else b"ok\n"
        self.send_response(200 if self.path in ("/health", "/metrics") else 404)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def batch():
    events = []
    parent = None
    # Engine block hashes are opaque; the sidecar re-fingerprints from token_ids.
    for i in range(len(TOKENS) // BLOCK):
        h = 1_000_003 * (i + 1)
        events.append({
            "type": "BlockStored",
            "block_hashes": [h],
            "parent_block_hash": parent,
            "token_ids": TOKENS[i * BLOCK:(i + 1) * BLOCK],
            "block_size": BLOCK,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
        })
        parent = h
    return msgpack.packb([time.time(), events, None])


def main():
    threading.Thread(
        target=http.server.ThreadingHTTPServer(("0.0.0.0", PORT), Health).serve_forever,
        daemon=True,
    ).start()
    pub = zmq.Context().socket(zmq.PUB)
    pub.bind("tcp://*:5557")
    print(f"stand-in engine: /health on :{PORT}, KV events on tcp://*:5557", flush=True)
    seq = 0
    start = time.monotonic()
    while time.monotonic() - start < REPUBLISH_FOR:
        pub.send_multipart([b"kv-events", struct.pack(">q", seq), batch()])
        seq += 1
        time.sleep(PERIOD)
    print(f"stand-in engine: sent {seq} batches; quiet from now on", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
