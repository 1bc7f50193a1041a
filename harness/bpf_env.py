"""Helpers for the eBPF tests and benchmark: skip reasons, network namespaces joined by a
veth pair (created and removed by the test), and an AF_PACKET capture.
"""
from __future__ import annotations

import ctypes
import os
import socket
import struct
import subprocess
import time
import uuid
from contextlib import contextmanager

from harness.certs import self_signed

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def bpf_skip_reason() -> str | None:
    """Why eBPF tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "eBPF tests need root (CAP_BPF, CAP_NET_ADMIN)"
    try:
        import bcc  # noqa: F401
    except ImportError as e:
        return f"bcc not importable ({e}); `make install` links Debian python3-bpfcc into .venv"
    return None


def require_bpf() -> None:
    import pytest
    reason = bpf_skip_reason()
    if reason:
        pytest.skip(reason)


def load_datapath():
    """A compiled QosDatapath, or a skip naming why the kernel refused it."""
    import pytest
    require_bpf()
    from mcp26.bpf.program import BpfUnavailable, QosDatapath
    try:
        return QosDatapath()
    except BpfUnavailable as e:
        pytest.skip(str(e))


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


SIOCGSKNS = 0x894C      # a socket's network namespace, as an fd


def _thread_netns() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


@contextmanager
def in_netns(name: str):
    """Runs the block (this thread, and processes it starts) in netns `name`.

    Sockets created inside keep that namespace after the block ends. Entering
    and leaving are both checked: test traffic must never start from the
    host's own namespace (whose default route leads off the machine).
    """
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    back_ino = os.fstat(back).st_ino
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {name}")
        if _thread_netns() != os.fstat(target).st_ino:
            raise RuntimeError(f"setns into {name} did not take effect")
        yield
    finally:
        ok = _libc.setns(back, CLONE_NEWNET) == 0 and _thread_netns() == back_ino
        os.close(back)
        os.close(target)
        if not ok:
            raise RuntimeError(f"could not return from netns {name}")


def netns_socket(name: str, family: int = socket.AF_INET, type: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket living in netns `name` (verified with SIOCGSKNS before use)."""
    import fcntl
    with in_netns(name):
        sock = socket.socket(family, type)
    want = os.stat(f"/run/netns/{name}").st_ino
    nsfd = fcntl.ioctl(sock.fileno(), SIOCGSKNS)
    try:
        got = os.fstat(nsfd).st_ino
    finally:
        os.close(nsfd)
    if got != want:
        sock.close()
        raise RuntimeError(f"socket is not in netns {name}")
    return sock


class VethPair:
    """Two namespaces `<tag>-c` (client) and `<tag>-s` (server) joined by a veth pair.

    Addresses: IPv4 169.254.77.1/.2 (link-local, only inside the namespaces)
    and IPv6 fd00:77::1/::2. Interface names: `veth-c` and `veth-s`.
    """
    V4 = ("169.254.77.1", "169.254.77.2")
    V6 = ("fd00:77::1", "fd00:77::2")

    def __init__(self):
        # The creator's pid in the name: a later run removes only namespaces
        # whose creator is gone, never those of a run still going.
        self.tag = f"mcpbpf{os.getpid()}x{uuid.uuid4().hex[:4]}"
        self.client_ns, self.server_ns = self.tag + "-c", self.tag + "-s"
        self.client_if, self.server_if = "veth-c", "veth-s"

    def create(self) -> "VethPair":
        try:
            _ip("netns", "add", self.client_ns)
            _ip("netns", "add", self.server_ns)
            tmp_c, tmp_s = "mcp" + self.tag[-4:] + "c0", "mcp" + self.tag[-4:] + "s0"
            _ip("link", "add", tmp_c, "type", "veth", "peer", "name", tmp_s)
            _ip("link", "set", tmp_c, "netns", self.client_ns, "name", self.client_if)
            _ip("link", "set", tmp_s, "netns", self.server_ns, "name", self.server_if)
            for ns, ifname, v4, v6 in ((self.client_ns, self.client_if, self.V4[0], self.V6[0]),
                                       (self.server_ns, self.server_if, self.V4[1], self.V6[1])):
                _ip("-n", ns, "addr", "add", f"{v4}/30", "dev", ifname)
                _ip("-n", ns, "addr", "add", f"{v6}/64", "dev", ifname, "nodad")
                _ip("-n", ns, "link", "set", ifname, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except Exception:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        # Deleting a namespace deletes its veth end, its peer, and their qdiscs.
        for ns in (self.client_ns, self.server_ns):
            _ip("netns", "del", ns, check=False)

    def __enter__(self):
        return self.create()

    def __exit__(self, *exc):
        self.remove()


def remove_stale_namespaces() -> None:
    """Namespaces a killed earlier run of these tests left (its pid is gone)."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith("mcpbpf"):
            continue
        pid = name[len("mcpbpf"):].split("x")[0]
        if pid.isdigit() and os.path.exists(f"/proc/{pid}"):
            continue
        _ip("netns", "del", name, check=False)


SO_ATTACH_FILTER = 26
SNAPLEN = 256          # headers are all the tests read


def _port_filter(port: int) -> bytes:
    """A classic BPF socket filter: TCP segments from or to `port` (IPv4 or
    IPv6), first SNAPLEN bytes. Filtering in the kernel keeps a busy `lo`
    from overflowing the capture socket's buffer."""
    ld_h, ld_b, ldx_msh, ld_h_x = 0x28, 0x30, 0xB1, 0x48
    jeq, jset, ret = 0x15, 0x45, 0x06
    accept, drop = (ret, 0, 0, SNAPLEN), (ret, 0, 0, 0)
    prog = [
        (ld_h, 0, 0, 12),                  # 0 ethertype
        (jeq, 0, 9, 0x0800),               # 1 IPv4? else -> 11
        (ld_b, 0, 0, 23),                  # 2 protocol
        (jeq, 0, 16, 6),                   # 3 TCP? else drop (20)
        (ld_h, 0, 0, 20),                  # 4 fragment offset
        (jset, 14, 0, 0x1FFF),             # 5 later fragment -> drop
        (ldx_msh, 0, 0, 14),               # 6 x = IP header length
        (ld_h_x, 0, 0, 14),                # 7 source port
        (jeq, 10, 0, port),                # 8 -> accept (19)
        (ld_h_x, 0, 0, 16),                # 9 destination port
        (jeq, 8, 0, port),                 # 10 -> accept  (fallthrough checks v6 below)
        (ld_h, 0, 0, 12),                  # 11 ethertype again
        (jeq, 0, 7, 0x86DD),               # 12 IPv6? else drop
        (ld_b, 0, 0, 20),                  # 13 next header
        (jeq, 0, 5, 6),                    # 14 TCP? else drop
        (ld_h, 0, 0, 54),                  # 15 source port
        (jeq, 2, 0, port),                 # 16 -> accept
        (ld_h, 0, 0, 56),                  # 17 destination port
        (jeq, 0, 1, port),                 # 18 -> accept / drop
        accept,                            # 19
        drop,                              # 20
    ]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


class Capture:
    """An AF_PACKET socket on one interface (of the current namespace),
    optionally keeping only TCP from or to `port`."""

    def __init__(self, ifname: str, port: int | None = None):
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        if port is not None:
            code = _port_filter(port)
            buf = ctypes.create_string_buffer(code, len(code))
            fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(buf))
            self._filter = buf               # must outlive the setsockopt
            self.sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind((ifname, 0))
        self.sock.settimeout(0.1)

    def frames(self, quiet: float = 0.3) -> list[tuple[bytes, int]]:
        """(frame, pkttype) until nothing has arrived for `quiet` seconds."""
        out, deadline = [], time.monotonic() + quiet
        while time.monotonic() < deadline:
            try:
                data, addr = self.sock.recvfrom(65535)
            except socket.timeout:
                continue
            out.append((data, addr[2]))
            deadline = time.monotonic() + quiet
        return out

    def close(self) -> None:
        self.sock.close()


def tcp_segments(frames, dport: int | None = None, sport: int | None = None):
    """(tos, tcp flags, payload length, frame) of the TCP frames matching the ports."""
    out = []
    for frame, _ in frames:
        ethertype = struct.unpack_from("!H", frame, 12)[0]
        if ethertype == 0x0800 and frame[23] == 6:
            ihl = (frame[14] & 0xF) * 4
            l4 = 14 + ihl
            tos = frame[15]
            total = struct.unpack_from("!H", frame, 16)[0] + 14
        elif ethertype == 0x86DD and frame[20] == 6:
            l4 = 54
            tos = (struct.unpack_from("!I", frame, 14)[0] >> 20) & 0xFF
            total = struct.unpack_from("!H", frame, 18)[0] + 54
        else:
            continue
        sp, dp = struct.unpack_from("!HH", frame, l4)
        if (dport is not None and dp != dport) or (sport is not None and sp != sport):
            continue
        doff = (frame[l4 + 12] >> 4) * 4
        out.append((tos, frame[l4 + 13], total - l4 - doff, frame))
    return out


def self_signed_cert(directory: str) -> tuple[str, str]:
    """(cert path, key path) of a fresh self-signed P-256 certificate."""
    return self_signed(directory, ["backend.mesh.local"])

def read_then_answer(nbytes: int):
    """A TcpServer handler: read `nbytes` of request, then answer a tiny HTTP 200 and drain
    (the latency sampler times the first request byte in -> the first answer byte out)."""
    def handle(c: socket.socket) -> None:
        got = 0
        while got < nbytes:
            chunk = c.recv(65536)
            if not chunk:
                return
            got += len(chunk)
        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        while c.recv(4096):
            pass
    return handle


class TcpServer:
    """Accepts on `sock` in a thread and runs `handle(conn)` per connection.

    close() shuts the listening socket down (waking the blocked accept),
    joins the threads and only then closes the fds: a thread still inside
    accept() on a closed fd number would otherwise pick up whichever socket
    the next test opens under the same number.
    """

    def __init__(self, sock: socket.socket, handle):
        import threading
        self.sock, self.handle = sock, handle
        self.conns: list[socket.socket] = []
        self.threads: list = []
        self._threading = threading
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            t = self._threading.Thread(target=self._run, args=(conn,), daemon=True)
            self.threads.append(t)
            t.start()

    def _run(self, conn: socket.socket) -> None:
        try:
            self.handle(conn)
        except OSError:
            pass

    def close(self) -> None:
        for s in [self.sock, *self.conns]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in [self.thread, *self.threads]:
            t.join(5)
        for s in [self.sock, *self.conns]:
            s.close()
