"""Redis for the tests and benchmarks of the response cache: Debian's `redis-server`, standalone or
a Redis Cluster of N shards, every node behind a `DelayProxy` on loopback.

Why a proxy for latency (and not DEBUG SLEEP or CLIENT PAUSE): the seed's test injects 500 ms of
latency into every Redis answer. DEBUG SLEEP blocks the server once, for everyone, for as long as
it sleeps; CLIENT PAUSE holds every client's commands until it ends - neither is "each answer
comes 500 ms late" while traffic flows, and neither can be set for one shard. A TCP proxy that
holds each answer chunk `delay` seconds before forwarding it is exactly that, per node, changed at
any moment. The cluster nodes announce the proxies' ports (`cluster-announce-port`), so a cluster
client that follows CLUSTER SLOTS and MOVED still only ever talks through the proxies; the
cluster bus between the nodes stays direct (`cluster-announce-bus-port`).

Needs `redis-server` and `redis-cli` (Makefile DEBS: redis-server); `skip_reason()` says why not.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time

from mcp26.demo.stack.ports import port_is_free


def skip_reason() -> str | None:
    for exe in ("redis-server", "redis-cli"):
        if shutil.which(exe) is None:
            return f"{exe} is not installed (Debian redis-server; `make install` installs it)"
    return None


def _ports(n: int, bus_offset: int = 10000) -> list[int]:
    """n ports free now whose bus port (+10000) is free too."""
    out: list[int] = []
    for p in range(20000 + (os.getpid() * 37) % 20000, 55000):
        if len(out) == n:
            break
        if port_is_free(p) and port_is_free(p + bus_offset):
            out.append(p)
    if len(out) < n:
        raise RuntimeError("no free ports for redis")
    return out


class DelayProxy:
    """Loopback TCP proxy listen_port -> target_port that holds every chunk coming back from the
    target for `delay` seconds (settable at any time); `cut()` drops every connection."""

    def __init__(self, target_port: int, listen_port: int = 0):
        self.target_port = target_port
        self.delay = 0.0
        self._loop = asyncio.new_event_loop()
        self._writers: set = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(listen_port,), daemon=True, name="delay-proxy")
        self._thread.start()
        self._ready.wait(5)

    def _run(self, listen_port: int) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", listen_port, reuse_address=True))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader, writer) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_w}

        async def pump(src, dst, delayed: bool):
            try:
                while data := await src.read(65536):
                    if delayed and self.delay:
                        await asyncio.sleep(self.delay)
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.close()
        try:
            await asyncio.gather(pump(reader, up_w, False), pump(up_r, writer, True))
        except asyncio.CancelledError:              # the proxy is closing
            pass
        self._writers -= {writer, up_w}

    def cut(self) -> None:
        def close_all():
            for w in list(self._writers):
                w.close()
        self._loop.call_soon_threadsafe(close_all)

    def close(self) -> None:
        async def stop():
            self._server.close()
            for w in list(self._writers):
                w.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()
        asyncio.run_coroutine_threadsafe(stop(), self._loop)
        self._thread.join(5)


class RedisCluster:
    """`shards` redis-server processes (cluster mode when shards > 1, else standalone), each behind
    a DelayProxy; `host`/`port` is where a client starts (node 0's proxy)."""

    def __init__(self, shards: int = 3):
        self.shards = shards
        self.dir = tempfile.mkdtemp(prefix="mcp-redis-")
        self.ports = _ports(shards)
        self.procs: list[subprocess.Popen] = []
        self.proxies: list[DelayProxy] = []
        self.host = "127.0.0.1"

    @property
    def port(self) -> int:
        return self.proxies[0].port

    @property
    def cluster(self) -> bool:
        return self.shards > 1

    def start(self) -> "RedisCluster":
        try:
            for p in self.ports:
                proxy = DelayProxy(p)
                self.proxies.append(proxy)
                args = ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                        "--dir", self.dir, "--protected-mode", "no", "--loglevel", "warning",
                        "--logfile", os.path.join(self.dir, f"redis-{p}.log")]
                if self.cluster:
                    args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{p}.conf",
                             "--cluster-node-timeout", "2000", "--cluster-announce-ip", "127.0.0.1",
                             "--cluster-announce-port", str(proxy.port), "--cluster-announce-bus-port", str(p + 10000)]
                self.procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for p in self.ports:
                self._wait(lambda p=p: self._cli(p, "PING").strip() == "PONG", f"redis on {p}")
            if self.cluster:
                r = subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                                    "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, text=True,
                                   timeout=60)
                if r.returncode != 0:
                    raise RuntimeError(f"redis-cli --cluster create: {r.stdout[-500:]} {r.stderr[-500:]}")
                for p in self.ports:
                    self._wait(lambda p=p: "cluster_state:ok" in self._cli(p, "CLUSTER", "INFO"), "cluster_state:ok")
        except BaseException:
            self.stop()
            raise
        return self

    def _cli(self, port: int, *args: str) -> str:
        r = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=10)
        return r.stdout

    @staticmethod
    def _wait(check, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"waiting for {what}")
            time.sleep(0.05)

    def client(self, timeout_s: float = 5.0):
        """A redis-py client (RedisCluster in cluster mode) through the proxies."""
        import redis
        if self.cluster:
            from redis.cluster import RedisCluster as Client
            return Client(host=self.host, port=self.port, socket_timeout=timeout_s)
        return redis.Redis(host=self.host, port=self.port, socket_timeout=timeout_s)

    def cache_config(self, **extra) -> str:
        """The model server's `--cache-config redis,...` for this Redis."""
        items = {"host": self.host, "port": self.port, **({"cluster": "true"} if self.cluster else {}), **extra}
        return "redis," + ",".join(f"{k}={v}" for k, v in items.items())

    def set_delay(self, seconds: float) -> None:
        for proxy in self.proxies:
            proxy.delay = seconds

    def kill(self) -> None:
        """SIGKILL every node: what a crash looks like to the clients."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait(10)

    def stop(self) -> None:
        self.kill()
        for proxy in self.proxies:
            proxy.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


