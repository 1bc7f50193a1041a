"""Free TCP ports on 127.0.0.1, for the servers tests, benchmarks and the demo start."""
import collections
import socket
import time

# Ports free_port handed out lately in this process: the kernel may offer a port again as soon
# as the probe socket closes, and a test that asks for its http, grpc and admin ports in a row
# then gets two equal ones (CI: a server's admin bind failed on its own gRPC port).
_ISSUED: collections.deque = collections.deque(maxlen=4096)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on `host` (the caller binds it soon after), never one this
    process was given in its last 4,096 calls."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _ISSUED:
            _ISSUED.append(port)
            return port
    raise RuntimeError(f"no free port on {host} that was not handed out already")


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def port_free_on_all(hosts, candidate=None) -> int:
    """One port free on every address of `hosts` (replicas sharing one port, as Pods behind an
    InferencePool's single target port); `candidate()` proposes ports (default: free on hosts[0])."""
    for _ in range(50):
        port = candidate() if candidate else free_port(hosts[0])
        if all(port_is_free(port, h) for h in hosts):
            return port
    raise RuntimeError(f"no port free on every one of {', '.join(hosts)}")


def preferred_port(preferred: int | None, taken: set[int], host: str = "127.0.0.1") -> int:
    """`preferred` if it is free and not in `taken`, else any free port not in `taken`;
    the port is added to `taken`. For documented defaults (the demo's 18080) that must
    still work next to whatever already holds them."""
    if preferred and preferred not in taken and port_is_free(preferred, host):
        taken.add(preferred)
        return preferred
    while (port := free_port(host)) in taken:
        pass
    taken.add(port)
    return port


def free_port_block(n: int, host: str = "127.0.0.1") -> int:
    """A base port with n consecutive ports free right now from it (for `--replicas`,
    whose replica i takes every base port + i * stride)."""
    for _ in range(50):
        base = free_port(host)
        if base + n >= 65535:
            continue
        if all(port_is_free(p, host) for p in range(base, base + n)):
            return base
    raise RuntimeError(f"no block of {n} free ports")


def wait_port(port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")
            time.sleep(0.05)
