"""Exact connection balance across `--workers` (Envoy's listener `exact_balance`).

With SO_REUSEPORT the kernel hashes each new connection's addresses to one
worker's socket, and the connection stays there for its life: 64 clients
landed 31/33 in one run and 37/27 in the next, 4 gRPC channels 3:1 or 4:0.
The worker with more then queues more than a batch while the other runs short
of work. Here the first worker binds each lane's port once and the others
inherit the socket, so there is one accept queue. A shared page holds every
worker's open and ever-accepted connections per lane, and a worker with more
open than another, or as many and more accepted, leaves a waiting connection
to that one: held connections end at most one apart, and short connections one
after another go round the workers. Every worker's epoll sees each new
connection, so one that declined looks again RETRY_S later; if the others have
taken nothing for SETTLE_S meanwhile (stopped, busy for longer, or gone), it
takes the connection itself.

Only the lanes we accept on ourselves can balance (rest_fast's and grpc_fast's);
aiohttp (`--rest-frontend aiohttp`) and grpc.aio (`--grpc-frontend grpcio`)
keep the kernel's SO_REUSEPORT spread. A REST connection handed to aiohttp
(a request other than infer) leaves the lane's count.
"""
from __future__ import annotations

import asyncio
import logging
import mmap
import os
import socket
import time

log = logging.getLogger(__name__)

LANES = ("http", "grpc")        # one row of counts each
SETTLE_S = 0.02                 # a declined connection is taken anyway after this long
RETRY_S = 0.001                 # how soon a worker that declined looks again
ACCEPT_ERROR_PAUSE_S = 0.1      # out of descriptors (EMFILE and kin): as asyncio, stop accepting this long
BACKLOG = 1024


class SharedCounts:
    """Per (lane, worker) two int32s in a memfd the workers map: the connections open
    now and those ever accepted. Each worker writes its own, reads the others'
    (aligned 4-byte stores are whole)."""

    def __init__(self, workers: int, fd: int | None = None):
        size = 4 * 2 * workers * len(LANES)
        if fd is None:
            fd = os.memfd_create("mcp-worker-connections")
            os.ftruncate(fd, size)
        self.fd = fd
        self.workers = workers
        self._map = mmap.mmap(fd, size)
        self.slots = memoryview(self._map).cast("i")

    def lane(self, name: str, index: int) -> "LaneCounts":
        return LaneCounts(self.slots, 2 * LANES.index(name) * self.workers, self.workers, index)


class LaneCounts:
    """This worker's pair in one lane's row, and whether another worker should take the
    next connection: one with fewer open, or as many open and fewer ever accepted (so
    short connections one after another go round the workers)."""

    def __init__(self, slots: memoryview, row: int, workers: int, index: int):
        self.slots, self.mine = slots, row + 2 * index
        self.others = [row + 2 * i for i in range(workers) if i != index]

    def publish(self, n: int) -> None:
        self.slots[self.mine] = n

    def accepted(self) -> None:
        self.slots[self.mine + 1] += 1

    def others_accepted(self) -> int:
        return sum(self.slots[i + 1] for i in self.others)

    def another_first(self, open_now: int) -> bool:
        s = self.slots
        mine = (open_now, s[self.mine + 1])
        return any((s[i], s[i + 1]) < mine for i in self.others)


class CountedSet(set):
    """A lane's open connections; every add and discard publishes the size (one
    call per connection opened or closed, none per request)."""

    def __init__(self, counts: LaneCounts):
        super().__init__()
        self.counts = counts
        self.opening = 0                # accepted, not yet the lane's (connect_accepted_socket running)

    def add(self, conn) -> None:
        super().add(conn)
        self.publish()

    def discard(self, conn) -> None:
        super().discard(conn)
        self.publish()

    def publish(self) -> None:
        self.counts.publish(len(self) + self.opening)


def bind(host: str, port: int, what: str) -> list[socket.socket]:
    """Listening sockets for host:port, as loop.create_server binds them (every address
    `host` resolves to, IPv6 only on v6 sockets); OSError naming `what` and the address."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise OSError(f"cannot bind {what} {host}:{port}: {e.strerror or e}") from None
    socks, seen = [], set()
    try:
        for family, kind, proto, _, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            s = socket.socket(family, kind, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:    # the other addresses take the port the first got
                addr = (addr[0], socks[0].getsockname()[1], *addr[2:])
            s.bind(addr)
            s.listen(BACKLOG)
            s.setblocking(False)
    except OSError as e:
        for s in socks:
            s.close()
        raise OSError(f"cannot bind {what} {host}:{port}: {e.strerror or e}") from None
    return socks


class BalancedListener:
    """Accepts from shared listening sockets for one lane, while this worker has no more
    open connections than the least loaded other worker. Stands where the lane keeps its
    asyncio server (`close()`, `sockets`)."""

    def __init__(self, socks: list[socket.socket], factory, connections: CountedSet):
        self.sockets = socks
        self.factory = factory          # the lane's protocol factory
        self.connections = connections
        self.loop: asyncio.AbstractEventLoop | None = None
        self.declined_at: float | None = None   # since when the others have taken nothing we left them
        self.others_accepted = -1               # ... and what they had accepted then
        self.timer: asyncio.TimerHandle | None = None
        self.tasks: set[asyncio.Task] = set()
        self.closed = False

    @property
    def port(self) -> int:
        return self.sockets[0].getsockname()[1]

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.connections.publish()
        self._arm()

    def _arm(self) -> None:
        self.timer = None
        if not self.closed:
            for s in self.sockets:
                self.loop.add_reader(s.fileno(), self._readable, s)

    def _disarm(self) -> None:
        for s in self.sockets:
            self.loop.remove_reader(s.fileno())

    def _readable(self, sock: socket.socket) -> None:
        conns = self.connections
        if conns.counts.another_first(len(conns) + conns.opening):
            now, taken = time.monotonic(), conns.counts.others_accepted()
            if taken != self.others_accepted:   # they are taking connections: wait for them afresh
                self.declined_at, self.others_accepted = now, taken
            if now - self.declined_at < SETTLE_S:
                self._pause(RETRY_S)
                return
        try:
            conn, _ = sock.accept()
        except (BlockingIOError, InterruptedError):
            return                      # another worker took it
        except OSError as e:            # EMFILE, ENFILE, ENOBUFS, ENOMEM: the queue keeps it
            log.error("accepting a connection on port %d: %s; pausing %.1fs", self.port, e, ACCEPT_ERROR_PAUSE_S)
            self._pause(ACCEPT_ERROR_PAUSE_S)
            return
        conn.setblocking(False)
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.opening += 1
        conns.publish()
        conns.counts.accepted()
        task = self.loop.create_task(self._connect(conn))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _pause(self, seconds: float) -> None:
        self._disarm()
        self.timer = self.loop.call_later(seconds, self._arm)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.factory, conn)
        except OSError as e:            # the peer went away before the transport was made
            log.debug("a connection closed as it was accepted: %s", e)
            conn.close()
        finally:
            self.connections.opening -= 1
            self.connections.publish()

    def close(self) -> None:
        """Stop accepting here (the sockets stay open in the other workers)."""
        if self.closed:
            return
        self.closed = True
        if self.timer:
            self.timer.cancel()
        if self.loop:
            self._disarm()
        for s in self.sockets:
            s.close()
