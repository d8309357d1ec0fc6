"""An engine-side KV-event publisher built like vLLM's and SGLang's own
ZmqEventPublisher: pyzmq PUB + replay ROUTER, msgspec-encoded batches whose
structs mirror the engines' definitions (engine-wire-formats.md):

- vLLM >= 0.26 ("map"): EventBatch positional [ts, events, data_parallel_rank],
  events tagged maps {"type": "BlockStored", ...} with omit_defaults;
- vLLM < 0.26 ("tuple"): events array_like tagged tuples
  ["BlockStored", block_hashes, parent, token_ids, block_size, lora_id, medium, ...];
- SGLang ("sglang"): array_like tagged tuples up to medium, batch
  [ts, events, attn_dp_rank].

Frames: live [topic, seq (8-byte BE), payload]; replay: a DEALER sends
[b"", start (8-byte BE)], replies are [b"", topic, seq, payload] per buffered
batch, then [b"", b"", -1 (signed 8-byte BE), b""].

Driven by JSON lines on stdin, one reply line on stdout each:
  {"op": "store", "form": "map"|"tuple"|"sglang", "hashes": [...],
   "parent": int|null, "tokens": [start, end], "block_size": 16,
   "medium": "GPU", "lora_id": null, "lora_name": null}
  {"op": "remove", "form": ..., "hashes": [...], "medium": "GPU"}
  {"op": "clear", "form": ...}
  {"op": "raw", "hex": "c1ff"}          a payload that is not msgpack
  {"op": "drop", "count": n}            the next n batches are buffered for
                                        replay but never sent live
  {"op": "restart"}                     a new engine process: seq back to 0,
                                        replay buffer empty, sockets rebound
  {"op": "quit"}
Startup prints {"pub": "tcp://...", "replay": "tcp://..."}.

usage: engine_publisher.py [TOPIC]
"""
import json
import struct
import sys
import time
from typing import Any, Optional, Union

import msgspec
import zmq


# --- vLLM >= 0.26 (vllm/distributed/kv_events.py): tagged maps -------------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


ExternalBlockHash = Union[int, bytes]


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: Optional[ExternalBlockHash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: Optional[str]
    group_idx: Optional[int] = None


class AllBlocksCleared(KVCacheEvent):
    pass


# --- vLLM < 0.26: the same events as positional tagged tuples --------------
class TupleEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class TupleBlockStored(TupleEvent, tag="BlockStored"):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: Optional[ExternalBlockHash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str] = None


class TupleBlockRemoved(TupleEvent, tag="BlockRemoved"):
    block_hashes: list[ExternalBlockHash]
    medium: Optional[str]


class TupleAllBlocksCleared(TupleEvent, tag="AllBlocksCleared"):
    pass


# --- SGLang (python/sglang/srt/disaggregation/kv_events.py) ----------------
class SglangEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    attn_dp_rank: Optional[int] = None


class SglangBlockStored(TupleEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None


class SglangBlockRemoved(TupleEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Optional[str] = None


ENCODER = msgspec.msgpack.Encoder()


def event(cmd: dict):
    form = cmd.get("form", "map")
    op = cmd["op"]
    if op == "store":
        start, end = cmd["tokens"]
        args = dict(
            block_hashes=cmd["hashes"],
            parent_block_hash=cmd.get("parent"),
            token_ids=list(range(start, end)),
            block_size=cmd.get("block_size", 16),
            lora_id=cmd.get("lora_id"),
            medium=cmd.get("medium", "GPU"),
        )
        if form == "map":
            return BlockStored(**args, lora_name=cmd.get("lora_name"))
        if form == "tuple":
            return TupleBlockStored(**args, lora_name=cmd.get("lora_name"))
        return SglangBlockStored(**args)
    if op == "remove":
        args = dict(block_hashes=cmd["hashes"], medium=cmd.get("medium", "GPU"))
        if form == "map":
            return BlockRemoved(**args)
        if form == "tuple":
            return TupleBlockRemoved(**args)
        return SglangBlockRemoved(**args)
    if form == "map":
        return AllBlocksCleared()
    return TupleAllBlocksCleared()


def batch(cmd: dict) -> bytes:
    ev = event(cmd)
    if cmd.get("form") == "sglang":
        return ENCODER.encode(SglangEventBatch(ts=time.time(), events=[ev], attn_dp_rank=0))
    return ENCODER.encode(EventBatch(ts=time.time(), events=[ev], data_parallel_rank=0))


class Engine:
    def __init__(self, topic: bytes):
        self.ctx = zmq.Context()
        self.topic = topic
        self.pub_port = None
        self.replay_port = None
        self.bind()

    def bind(self):
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 100_000)
        self.router = self.ctx.socket(zmq.ROUTER)
        if self.pub_port is None:
            self.pub_port = self.pub.bind_to_random_port("tcp://127.0.0.1")
            self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        else:
            self.pub.bind(f"tcp://127.0.0.1:{self.pub_port}")
            self.router.bind(f"tcp://127.0.0.1:{self.replay_port}")
        self.seq = 0
        self.buffer = []  # (seq, payload); vLLM keeps buffer_steps of these
        self.drop = 0

    def restart(self):
        self.pub.close(linger=0)
        self.router.close(linger=0)
        time.sleep(0.2)
        self.bind()

    def publish(self, payload: bytes) -> int:
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if self.drop > 0:
            self.drop -= 1
        else:
            self.pub.send_multipart([self.topic, struct.pack(">Q", seq), payload])
        return seq

    def answer_replay(self):
        frames = self.router.recv_multipart()
        if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
            return  # like vLLM: a malformed request gets no reply at all
        identity, start = frames[0], struct.unpack(">Q", frames[2])[0]
        for seq, payload in self.buffer:
            if seq >= start:
                self.router.send_multipart(
                    [identity, b"", self.topic, struct.pack(">Q", seq), payload])
        self.router.send_multipart([identity, b"", b"", struct.pack(">q", -1), b""])


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    topic = (sys.argv[1] if len(sys.argv) > 1 else "kv-events").encode()
    engine = Engine(topic)
    reply({"pub": f"tcp://127.0.0.1:{engine.pub_port}",
           "replay": f"tcp://127.0.0.1:{engine.replay_port}"})
    stdin = sys.stdin.fileno()
    while True:
        poller = zmq.Poller()
        poller.register(engine.router, zmq.POLLIN)
        poller.register(stdin, zmq.POLLIN)
        ready = dict(poller.poll(1000))
        if engine.router in ready:
            engine.answer_replay()
        if stdin in ready:
            line = sys.stdin.readline()
            if not line:
                return 0
            cmd = json.loads(line)
            op = cmd["op"]
            if op == "quit":
                reply({"ok": True})
                return 0
            if op == "restart":
                engine.restart()
                reply({"ok": True})
            elif op == "drop":
                engine.drop = cmd["count"]
                reply({"ok": True})
            elif op == "raw":
                reply({"seq": engine.publish(bytes.fromhex(cmd["hex"]))})
            else:
                reply({"seq": engine.publish(batch(cmd))})


if __name__ == "__main__":
    sys.exit(main())
