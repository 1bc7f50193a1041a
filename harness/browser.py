"""A real headless Chromium for tests, driven by playwright-core through node.

    with Browser() as b:
        b.goto(url); b.fill("#model", "x"); b.click("#go"); b.wait_text("#out", "done")

The node script (browser.mjs) takes one JSON command per line; every call
here has a deadline, and the browser's whole process group is killed on
exit, so a test that fails never leaves Chromium running.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time

from harness.paths import CONSOLE

WEB = str(CONSOLE / "web")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "browser.mjs")
CHROMIUM = "/usr/bin/chromium"


def missing() -> str | None:
    """Why a browser test cannot run here, or None."""
    if not shutil.which("node"):
        return "node is not installed"
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is missing (Debian package chromium; make install)"
    if not os.path.isdir(os.path.join(WEB, "node_modules", "playwright-core")):
        return f"playwright-core is not installed in {WEB} (make web)"
    return None


class BrowserError(RuntimeError):
    pass


class Browser:
    def __init__(self, timeout_ms: int = 10000):
        self.timeout_ms = timeout_ms
        self.proc: subprocess.Popen | None = None
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        self._ids = 0

    def start(self) -> "Browser":
        env = dict(os.environ, PLAYWRIGHT_FROM=os.path.join(WEB, "package.json"), CHROMIUM=CHROMIUM,
                   BROWSER_TIMEOUT_MS=str(self.timeout_ms), HOME=self.profile,
                   # A fresh, empty profile each run (playwright passes its own --user-data-dir under TMPDIR).
                   TMPDIR=self.profile)
        self.proc = subprocess.Popen(["node", SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, start_new_session=True, text=True)
        hello = self._read(30.0)
        if not hello.get("ready"):
            raise BrowserError(f"browser did not start: {hello}")
        self.version = hello.get("version")
        return self

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"browser gave no answer in {timeout}s")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    err = self.proc.stderr.read() if self.proc.poll() is not None else ""
                    raise BrowserError(f"browser driver exited: {err[-2000:]}")
                return json.loads(line)

    def call(self, op: str, **args):
        self._ids += 1
        self.proc.stdin.write(json.dumps({"id": self._ids, "op": op, **args}) + "\n")
        self.proc.stdin.flush()
        answer = self._read(self.timeout_ms / 1000 + 10)
        if not answer.get("ok"):
            raise BrowserError(f"{op} {args}: {answer.get('error')}")
        return answer["value"]

    def __getattr__(self, op):  # b.goto(url=...), b.fill(selector=..., value=...)
        if op.startswith("_"):
            raise AttributeError(op)
        return lambda *a, **kw: self.call(op, **dict(zip(_POSITIONAL.get(op, ()), a)), **kw)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "close"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # Chromium and its helpers, whatever is left
            except ProcessLookupError:
                pass
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


_POSITIONAL = {"goto": ("url",), "fill": ("selector", "value"), "select": ("selector", "value"),
               "click": ("selector",), "text": ("selector",), "attr": ("selector", "name"),
               "wait_text": ("selector", "text"), "wait_attr": ("selector", "name", "value"),
               "eval": ("expression",), "screenshot": ("path",)}
