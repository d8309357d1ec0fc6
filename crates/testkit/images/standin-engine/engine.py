"""A stand-in engine for Kubernetes end-to-end tests, where no GPU engine
runs: it publishes KV events exactly as vLLM >= 0.26 does (ZMQ PUB on
tcp://*:5557, topic "kv-events", frames [topic, seq (8-byte BE),
msgpack(EventBatch)], events as tagged maps) and serves /health and an
empty /metrics on the engine port, so the injected kvevent-subscriber
sidecar sees an engine.

It stores one chain of blocks, derived from STANDIN_TOKENS (default: tokens
0..63 in blocks of STANDIN_BLOCK_SIZE=16), and re-sends it every
STANDIN_PERIOD seconds so a late subscriber (ZMQ slow joiner) still gets
it; re-storing a block is idempotent in the index.

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
TOKENS = [int(t) for t in os.environ.get("STANDIN_TOKENS", ",".join(map(str, range(64)))).split(",")]
PERIOD = float(os.environ.get("STANDIN_PERIOD", "2"))


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"" if self.path == "/metrics" else b"ok\n"
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
    while True:
        pub.send_multipart([b"kv-events", struct.pack(">q", seq), batch()])
        seq += 1
        time.sleep(PERIOD)


if __name__ == "__main__":
    sys.exit(main())
