#!/usr/bin/env python3
"""Drives a real headless Chromium over the DevTools protocol for the status
page test (crates/cli/tests/ui_page.rs), Python standard library only.

The protocol runs over --remote-debugging-pipe (Chromium reads commands on fd
3 and writes replies on fd 4, NUL-terminated JSON), so no WebSocket client or
debugging port is needed.

    chromium_driver.py CHROMIUM URL

prints {"ready": true} once the page is navigated, then reads one JSON
command per stdin line and answers one JSON line:

  {"op": "eval", "expr": "..."}     -> {"value": <result, by value>}
  {"op": "screenshot", "path": p}   -> {"ok": true}  (PNG of the viewport)
  {"op": "quit"}                    -> {"ok": true}, then exits
"""

import base64
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile

# The flags the test plan fixes: no sandbox (containers), no GPU, nothing
# that reaches the network by itself, and a fresh profile every run.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1400,1000",
    "--remote-debugging-pipe",
]


class Browser:
    def __init__(self, chromium: str):
        self.profile = tempfile.mkdtemp(prefix="inferencecache-chromium-")
        to_r, self.to_w = os.pipe()
        self.from_r, from_w = os.pipe()
        # Park the child's ends above 3/4 so the dup2s below cannot clobber them.
        child_in = fcntl.fcntl(to_r, fcntl.F_DUPFD, 10)
        child_out = fcntl.fcntl(from_w, fcntl.F_DUPFD, 10)

        def wire():
            os.dup2(child_in, 3)
            os.dup2(child_out, 4)

        self.log = open(os.path.join(self.profile, "chromium.log"), "wb")
        self.proc = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            pass_fds=(3, 4),
            preexec_fn=wire,
        )
        for fd in (to_r, from_w, child_in, child_out):
            os.close(fd)
        self.next_id = 0
        self.buf = b""
        self.session = None

    def send(self, method: str, params=None, session=True):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.to_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self.read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def read(self) -> dict:
        while b"\0" not in self.buf:
            chunk = os.read(self.from_r, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def open(self, url: str):
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send(
            "Target.attachToTarget", {"targetId": target, "flatten": True}
        )["sessionId"]
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Page.navigate", {"url": url})

    def eval(self, expr: str):
        r = self.send(
            "Runtime.evaluate",
            {"expression": expr, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in r:
            raise RuntimeError(json.dumps(r["exceptionDetails"]))
        return r.get("result", {}).get("value")

    def screenshot(self, path: str):
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.send("Browser.close", session=False)
        except RuntimeError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    chromium, url = sys.argv[1], sys.argv[2]
    b = Browser(chromium)
    try:
        b.open(url)
        reply({"ready": True})
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd["op"]
            try:
                if op == "eval":
                    reply({"value": b.eval(cmd["expr"])})
                elif op == "screenshot":
                    b.screenshot(cmd["path"])
                    reply({"ok": True})
                elif op == "quit":
                    reply({"ok": True})
                    break
                else:
                    reply({"error": f"unknown op {op}"})
            except RuntimeError as e:
                reply({"error": str(e)})
    finally:
        b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
