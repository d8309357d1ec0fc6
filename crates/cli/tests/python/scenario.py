"""A gateway's-eye scenario against the real binary, with a grpcio client
generated from the project's .proto:

1. a stream subscriber is listening for index events;
2. a producer reports a chain for replica r1 (ReportCacheState);
3. LookupRoute with that chain answers PREFIX_MATCH for r1;
4. a /policy push (requireChain) changes behaviour: an exact-key lookup now
   gets POLICY_REQUIRES_CHAIN;
5. the subscriber saw the PREFIX_ADDED events of step 2.

usage: scenario.py PROTO_ROOT GRPC_ADDR CONTROL_ADDR HTTP_ADDR
"""
import json
import queue
import sys
import tempfile
import threading
import time
import urllib.request

import grpc

from every_rpc import generate


def main() -> int:
    proto_root, grpc_addr, control_addr = sys.argv[1:4]
    pb, rpc = generate(proto_root, tempfile.mkdtemp(prefix="ic-py-"))
    channel = grpc.insecure_channel(grpc_addr)
    stub = rpc.InferenceCacheStub(channel)
    results = []

    def check(name, ok, detail=""):
        results.append(ok)
        print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))

    events = queue.Queue()
    stream = stub.StreamCacheEvents(pb.StreamEventsRequest(
        model_id="m", tenant_id="t", types=[pb.CacheEvent.PREFIX_ADDED]), timeout=20)

    def listen():
        try:
            for e in stream:
                events.put(e)
        except grpc.RpcError:
            pass

    threading.Thread(target=listen, daemon=True).start()
    # Wait until the server has registered the subscriber (its gauge).
    http_addr = sys.argv[4]
    for _ in range(100):
        metrics = urllib.request.urlopen(f"http://{http_addr}/metrics").read().decode()
        if 'inferencecache_stream_subscribers{type="events"} 1' in metrics:
            break
        time.sleep(0.05)

    chain = [bytes([i]) * 8 for i in range(1, 5)]
    ack = stub.ReportCacheState(iter([pb.CacheStateUpdate(
        replica_id="r1", model_id="m", tenant_id="t", hash_scheme="vllm",
        prefixes=[pb.PrefixEntry(block_hashes=chain, block_token_counts=[64] * 4)])]), timeout=5)
    check("report acknowledged", ack.accepted)

    r = stub.LookupRoute(pb.LookupRouteRequest(
        model_id="m", tenant_id="t", hash_scheme="vllm",
        block_hashes=chain, block_token_counts=[64] * 4), timeout=5)
    check("lookup is PREFIX_MATCH", r.reason_code == "PREFIX_MATCH", r.reason_code)
    check("r1 matched 256 tokens",
          len(r.replica_scores) == 1 and r.replica_scores[0].replica_id == "r1"
          and r.replica_scores[0].matched_tokens == 256, str(r.replica_scores))

    body = json.dumps({"version": 7, "policies": [
        {"namespace": "t", "strategy": {"requireChain": True}}]}).encode()
    req = urllib.request.Request(f"http://{control_addr}/policy", data=body, method="POST")
    status = urllib.request.urlopen(req).status
    check("policy push 204", status == 204, str(status))
    r = stub.LookupRoute(pb.LookupRouteRequest(
        model_id="m", tenant_id="t", hash_scheme="vllm", prefix_hash=chain[0],
        prefix_token_count=64), timeout=5)
    check("policy changes behaviour", r.reason_code == "POLICY_REQUIRES_CHAIN", r.reason_code)

    seen = []
    try:
        while len(seen) < 4:
            seen.append(events.get(timeout=5))
    except queue.Empty:
        pass
    check("subscriber saw 4 PREFIX_ADDED events",
          len(seen) == 4 and all(e.type == pb.CacheEvent.PREFIX_ADDED and e.replica_id == "r1" for e in seen),
          str(seen))
    stream.cancel()

    passed = sum(results)
    failed = len(results) - passed
    print(f"scenario: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
