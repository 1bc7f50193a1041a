"""demo.stack.ports.free_port never hands out a port twice in a row, even when the kernel
offers the same one again (which it may as soon as the probe socket closes)."""
import socket

from mcp26.demo.stack import ports


class _Probe:
    """A socket whose bind(0) is given the ports in `offers`, in order."""
    offers: list[int] = []

    def __init__(self, *_):
        self.port = None

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False

    def bind(self, address):
        self.port = _Probe.offers.pop(0)

    def getsockname(self):
        return ("127.0.0.1", self.port)


def test_a_port_offered_again_is_skipped(monkeypatch):
    monkeypatch.setattr(ports, "_ISSUED", ports.collections.deque(maxlen=8))
    monkeypatch.setattr(ports.socket, "socket", _Probe)
    _Probe.offers = [40001, 40001, 40001, 40002, 40001, 40003]
    assert [ports.free_port() for _ in range(3)] == [40001, 40002, 40003]


def test_real_ports_are_distinct():
    got = [ports.free_port() for _ in range(200)]
    assert len(set(got)) == len(got)
    with socket.socket() as s:
        s.bind(("127.0.0.1", got[-1]))       # still free: the caller can bind it
