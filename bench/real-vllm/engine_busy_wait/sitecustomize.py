"""A bench setting, never a product one: how long vLLM's shared-memory
broadcast readers busy-wait after each read.

vLLM 0.32's `SpinCondition` (vllm/distributed/device_communicators/
shm_broadcast.py) keeps a reader spinning on `sched_yield` for
`busy_loop_s` = 1 s after every read, so an engine that served a request a
moment ago holds a whole core for the next second even when idle. On a
machine with a core per engine and spare cores that costs nothing; on this
2-core bench host, two engines alternating sequential requests keep both
cores spinning, and the API servers, the client and the router then share
their cores with the spinners. `bench/real-vllm/run.py --engine-busy-wait S`
(and `bench/gateway/latency.py`) put this directory on the engines'
PYTHONPATH with IC_BENCH_ENGINE_BUSY_WAIT_S=S; every policy gets the same
engines. A reader that has gone idle waits on its zmq notification instead
(what vLLM does after the busy window anyway).

That notification can be missed (the writer's PUB socket keeps one message
and drops the rest, the reader's SUB keeps the last; measured here: with
no busy-wait, about one request in a hundred stalled), and an idle reader
rechecks the buffer only every SHM_READER_RECHECK_INTERVAL_MS (5,000 ms):
a missed wake-up is a 5 s stall. vLLM's 1 s busy window hides it except
after a second of idleness; with a shorter one it shows. So the same
setting lowers the recheck to IC_BENCH_ENGINE_RECHECK_MS (default 10 ms:
an idle reader wakes 100 times a second, a missed notification costs at
most 10 ms).

Python imports `sitecustomize` at start-up in every interpreter, the engine
core's spawned workers included; the patch is applied when vLLM's module is
first imported, so nothing of vLLM is imported early.
"""
import importlib.abc
import importlib.util
import os
import sys

_MODULE = "vllm.distributed.device_communicators.shm_broadcast"
_VALUE = os.environ.get("IC_BENCH_ENGINE_BUSY_WAIT_S")
_RECHECK_MS = int(os.environ.get("IC_BENCH_ENGINE_RECHECK_MS", "10"))


def _patch(module):
    busy = float(_VALUE)
    cls = module.SpinCondition
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self.is_reader:
            self.busy_loop_s = busy

    cls.__init__ = __init__
    # Read as a module global at each wait (ReadTimeoutWithWarnings).
    module.SHM_READER_RECHECK_INTERVAL_MS = _RECHECK_MS
    print(f"[engine_busy_wait] SpinCondition readers busy-wait {busy} s, recheck every"
          f" {_RECHECK_MS} ms (pid {os.getpid()})", file=sys.stderr, flush=True)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader)
        return spec


if _VALUE is not None:
    sys.meta_path.insert(0, _Finder())
