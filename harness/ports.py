import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on `host` (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port_block(n: int, host: str = "127.0.0.1") -> int:
    """A base port with n consecutive ports free right now from it (for `--replicas`,
    whose replica i takes every base port + i * stride)."""
    for _ in range(50):
        base = free_port(host)
        if base + n >= 65535:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind((host, p))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no block of {n} free ports")


def wait_port(port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
    import time
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")
            time.sleep(0.05)
