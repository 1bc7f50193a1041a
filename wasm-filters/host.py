"""A Proxy-Wasm (ABI 0.2.1) host in Python on wasmtime, for fast filter tests.

It loads the same .wasm file Envoy loads and plays Envoy's part: header maps
per stream, properties (jwt_authn's dynamic metadata, request.protocol, ...),
the plugin configuration buffer, local responses and logs, plus the few WASI
calls wasi-libc may import. The host fills only what a test sets; anything
else answers NotFound, as Envoy does for an absent attribute.

    host = ProxyWasmHost(WASM)
    assert host.configure(contract.filter_json())
    r = host.request([(":path", "/"), ("end-user", "admin")],
                     properties={("request", "protocol"): b"HTTP/2"},
                     metadata={"sub": "jane"})
    r.headers, r.local_response, r.action
"""
from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass, field

import wasmtime

from mcp26.mesh.header_contract import PAYLOAD_PROPERTY
from mcp26.wasm import HEADER_CONTRACT_WASM

OK, NOT_FOUND, BAD_ARGUMENT = 0, 1, 2
REQUEST_HEADERS, REQUEST_TRAILERS, RESPONSE_HEADERS, RESPONSE_TRAILERS = range(4)
PLUGIN_CONFIGURATION, VM_CONFIGURATION = 7, 6
CONTINUE, PAUSE = 0, 1

I32 = wasmtime.ValType.i32()
I64 = wasmtime.ValType.i64()



class HostError(RuntimeError):
    """The module broke the ABI (bad pointer, unknown map, ...)."""


def serialize_pairs(pairs) -> bytes:
    """The ABI's header-map encoding: count, (key len, value len)*, then NUL-terminated bytes.

    Envoy serialises a map-valued property (jwt_authn's payload) the same way."""
    enc = [(k if isinstance(k, bytes) else k.encode("latin-1"), v if isinstance(v, bytes) else v.encode("latin-1"))
           for k, v in pairs]
    head = struct.pack("<I", len(enc)) + b"".join(struct.pack("<II", len(k), len(v)) for k, v in enc)
    return head + b"".join(k + b"\0" + v + b"\0" for k, v in enc)


@dataclass
class LocalResponse:
    status: int
    details: str
    body: bytes
    headers: list[tuple[str, str]]
    grpc_status: int


@dataclass
class StreamResult:
    action: int
    headers: list[tuple[str, str]]
    local_response: LocalResponse | None = None
    logs: list[tuple[int, str]] = field(default_factory=list)

    def get(self, name: str) -> str | None:
        vals = [v for k, v in self.headers if k == name]
        return vals[0] if vals else None

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]


_ENGINE = wasmtime.Engine()
_compiled: dict[tuple, wasmtime.Module] = {}


def _module(wasm: str | os.PathLike | bytes) -> wasmtime.Module:
    """Compiled once per file version (or bytes): each host gets a fresh instance."""
    if isinstance(wasm, (bytes, bytearray)):
        return wasmtime.Module(_ENGINE, bytes(wasm))
    st = os.stat(wasm)
    key = (os.path.abspath(wasm), st.st_size, st.st_mtime_ns)
    if key not in _compiled:
        _compiled[key] = wasmtime.Module.from_file(_ENGINE, os.fspath(wasm))
    return _compiled[key]


class ProxyWasmHost:
    def __init__(self, wasm: str | os.PathLike | bytes = HEADER_CONTRACT_WASM, environ: dict[str, str] | None = None):
        self.engine = _ENGINE
        self.environ = dict(environ or {})   # the VM's WASI environment (Envoy: host_env_keys / key_values)
        self.module = _module(wasm)
        self.store = wasmtime.Store(self.engine)
        self.logs: list[tuple[int, str]] = []
        self.maps: dict[int, list[tuple[str, str]]] = {}
        self.properties: dict[tuple[str, ...], bytes] = {}
        self.plugin_config = b""
        self.local_response: LocalResponse | None = None
        self.host_calls = 0
        self.now_ns: int | None = None      # the host clock the filter reads (None: the real one)
        linker = wasmtime.Linker(self.engine)
        imported = {(i.module, i.name) for i in self.module.imports}
        for (mod, name), (params, results, fn) in self._functions().items():
            if (mod, name) in imported:
                linker.define_func(mod, name, wasmtime.FuncType(params, results), fn)
        missing = imported - set(self._functions())
        if missing:
            raise HostError(f"module imports host functions this emulator lacks: {sorted(missing)}")
        self.instance = linker.instantiate(self.store, self.module)
        ex = self.instance.exports(self.store)
        self.memory: wasmtime.Memory = ex["memory"]
        self._ex = ex
        if "_initialize" in ex:
            ex["_initialize"](self.store)
        if "proxy_abi_version_0_2_1" not in ex:
            raise HostError("module does not export proxy_abi_version_0_2_1")
        self.root_id = 1
        self._next_ctx = 2
        self._call("proxy_on_context_create", self.root_id, 0)
        if not self._call("proxy_on_vm_start", self.root_id, 0):
            raise HostError("proxy_on_vm_start returned false")

    # ------------------------------------------------------------ memory
    def _read(self, ptr: int, size: int) -> bytes:
        if ptr < 0 or size < 0 or ptr + size > self.memory.data_len(self.store):
            raise HostError(f"out-of-bounds read {ptr}+{size}")
        return bytes(self.memory.read(self.store, ptr, ptr + size))

    def _write(self, ptr: int, data: bytes) -> None:
        if ptr <= 0 or ptr + len(data) > self.memory.data_len(self.store):
            raise HostError(f"out-of-bounds write {ptr}+{len(data)}")
        self.memory.write(self.store, data, ptr)

    def _return_bytes(self, data: bytes, ret_ptr: int, ret_size: int) -> int:
        """Hands `data` to the module in memory it allocated (and must free)."""
        buf = self._call("proxy_on_memory_allocate", max(len(data), 1))
        if not buf:
            raise HostError("proxy_on_memory_allocate returned 0")
        self._write(buf, data)
        self._write(ret_ptr, struct.pack("<I", buf))
        self._write(ret_size, struct.pack("<I", len(data)))
        return OK

    def _str(self, ptr: int, size: int) -> str:
        return self._read(ptr, size).decode("latin-1")

    def _call(self, name: str, *args):
        return self._ex[name](self.store, *args)

    # ----------------------------------------------------- host functions
    def _functions(self):
        h = self

        def counted(fn):
            def wrapper(*a):
                h.host_calls += 1
                return fn(*a)
            return wrapper

        def log(level, ptr, size):
            h.logs.append((level, h._str(ptr, size)))
            return OK

        def get_buffer_bytes(kind, start, max_size, ret_ptr, ret_size):
            if kind != PLUGIN_CONFIGURATION:
                return NOT_FOUND
            data = h.plugin_config[start:start + max_size]
            return h._return_bytes(data, ret_ptr, ret_size)

        def map_of(kind):
            if kind not in h.maps:
                raise HostError(f"header map {kind} not available now")
            return h.maps[kind]

        def get_pairs(kind, ret_ptr, ret_size):
            return h._return_bytes(serialize_pairs(map_of(kind)), ret_ptr, ret_size)

        def get_value(kind, kp, ks, ret_ptr, ret_size):
            key = h._str(kp, ks).lower()
            for k, v in map_of(kind):
                if k == key:
                    return h._return_bytes(v.encode("latin-1"), ret_ptr, ret_size)
            return NOT_FOUND

        def add_value(kind, kp, ks, vp, vs):
            map_of(kind).append((h._str(kp, ks).lower(), h._str(vp, vs)))
            return OK

        def replace_value(kind, kp, ks, vp, vs):
            key, val = h._str(kp, ks).lower(), h._str(vp, vs)
            m = map_of(kind)
            idx = [i for i, (k, _) in enumerate(m) if k == key]
            if idx:   # Envoy's setCopy: the first keeps its place, the rest go
                m[idx[0]] = (key, val)
                for i in reversed(idx[1:]):
                    del m[i]
            else:
                m.append((key, val))
            return OK

        def remove_value(kind, kp, ks):
            key = h._str(kp, ks).lower()
            m = map_of(kind)
            m[:] = [(k, v) for k, v in m if k != key]
            return OK

        def set_pairs(kind, ptr, size):
            raw = h._read(ptr, size)
            (n,) = struct.unpack_from("<I", raw)
            if 4 + 8 * n > size:
                raise HostError("proxy_set_header_map_pairs: truncated")
            sizes = [struct.unpack_from("<II", raw, 4 + 8 * i) for i in range(n)]
            off, pairs = 4 + 8 * n, []
            for kl, vl in sizes:
                if off + kl + vl + 2 > size:
                    raise HostError("proxy_set_header_map_pairs: truncated")
                pairs.append((raw[off:off + kl].decode("latin-1").lower(), raw[off + kl + 1:off + kl + 1 + vl].decode("latin-1")))
                off += kl + vl + 2
            m = map_of(kind)
            m[:] = pairs
            return OK

        def get_property(pp, ps, ret_ptr, ret_size):
            path = tuple(s.decode("latin-1") for s in h._read(pp, ps).split(b"\0"))
            if path not in h.properties:
                return NOT_FOUND
            return h._return_bytes(h.properties[path], ret_ptr, ret_size)

        def current_time(ret):
            h._write(ret, struct.pack("<Q", time.time_ns() if h.now_ns is None else h.now_ns))
            return 0

        def send_local_response(status, dp, ds, bp, bs, hp, hs, grpc):
            hdrs = []
            if hs:
                raw = h._read(hp, hs)
                (n,) = struct.unpack_from("<I", raw)
                sizes = [struct.unpack_from("<II", raw, 4 + 8 * i) for i in range(n)]
                off = 4 + 8 * n
                for kl, vl in sizes:
                    k = raw[off:off + kl].decode("latin-1"); off += kl + 1
                    v = raw[off:off + vl].decode("latin-1"); off += vl + 1
                    hdrs.append((k, v))
            h.local_response = LocalResponse(status, h._str(dp, ds), h._read(bp, bs), hdrs, grpc)
            return OK

        # WASI (wasi_snapshot_preview1): what wasi-libc may import.
        def fd_write(fd, iovs, n_iovs, nwritten):
            total = 0
            for i in range(n_iovs):
                ptr, ln = struct.unpack("<II", h._read(iovs + 8 * i, 8))
                h.logs.append((4 if fd == 2 else 2, h._str(ptr, ln)))
                total += ln
            h._write(nwritten, struct.pack("<I", total))
            return 0

        def proc_exit(code):
            raise HostError(f"module called proc_exit({code})")

        def clock_time_get(clock_id, precision, ret):
            h._write(ret, struct.pack("<Q", time.time_ns()))
            return 0

        def random_get(ptr, n):
            h._write(ptr, os.urandom(n))
            return 0

        def _environ() -> list[bytes]:
            return [f"{k}={v}".encode() + b"\0" for k, v in h.environ.items()]

        def environ_sizes_get(count_ptr, size_ptr):
            env = _environ()
            h._write(count_ptr, struct.pack("<I", len(env)))
            h._write(size_ptr, struct.pack("<I", sum(map(len, env))))
            return 0

        def environ_get(ptrs, buf):
            for i, e in enumerate(_environ()):
                h._write(ptrs + 4 * i, struct.pack("<I", buf))
                h._write(buf, e)
                buf += len(e)
            return 0

        def fd_close(fd):
            return 8  # EBADF

        def fd_seek(fd, off, whence, ret):
            return 8

        def fd_fdstat_get(fd, ret):
            return 8

        env = "env"
        wasi = "wasi_snapshot_preview1"
        return {
            (env, "proxy_log"): ([I32] * 3, [I32], counted(log)),
            (env, "proxy_get_buffer_bytes"): ([I32] * 5, [I32], counted(get_buffer_bytes)),
            (env, "proxy_get_header_map_pairs"): ([I32] * 3, [I32], counted(get_pairs)),
            (env, "proxy_get_header_map_value"): ([I32] * 5, [I32], counted(get_value)),
            (env, "proxy_add_header_map_value"): ([I32] * 5, [I32], counted(add_value)),
            (env, "proxy_replace_header_map_value"): ([I32] * 5, [I32], counted(replace_value)),
            (env, "proxy_set_header_map_pairs"): ([I32] * 3, [I32], counted(set_pairs)),
            (env, "proxy_remove_header_map_value"): ([I32] * 3, [I32], counted(remove_value)),
            (env, "proxy_get_property"): ([I32] * 4, [I32], counted(get_property)),
            (env, "proxy_get_current_time_nanoseconds"): ([I32], [I32], counted(current_time)),
            (env, "proxy_send_local_response"): ([I32] * 8, [I32], counted(send_local_response)),
            (wasi, "fd_write"): ([I32] * 4, [I32], fd_write),
            (wasi, "proc_exit"): ([I32], [], proc_exit),
            (wasi, "clock_time_get"): ([I32, I64, I32], [I32], clock_time_get),
            (wasi, "random_get"): ([I32] * 2, [I32], random_get),
            (wasi, "environ_sizes_get"): ([I32] * 2, [I32], environ_sizes_get),
            (wasi, "environ_get"): ([I32] * 2, [I32], environ_get),
            (wasi, "fd_close"): ([I32], [I32], fd_close),
            (wasi, "fd_seek"): ([I32, I64, I32, I32], [I32], fd_seek),
            (wasi, "fd_fdstat_get"): ([I32] * 2, [I32], fd_fdstat_get),
        }

    # ------------------------------------------------------------ driving
    def configure(self, config: str | bytes) -> bool:
        self.plugin_config = config.encode() if isinstance(config, str) else bytes(config)
        return bool(self._call("proxy_on_configure", self.root_id, len(self.plugin_config)))

    def memory_size(self) -> int:
        return self.memory.data_len(self.store)

    def request(self, headers: list[tuple[str, str]], properties: dict | None = None,
                metadata: dict[str, str | bytes] | None = None,
                response: list[tuple[str, str]] | None = None,
                trailers: list[tuple[str, str]] | None = None,
                end_of_stream: bool = True) -> StreamResult:
        """One stream: request headers, and (if given) response headers/trailers.

        `metadata` are jwt_authn payload claims (as the filter reads them).
        Returns the request headers as the module left them; for a response
        `.response` / `.trailers` hold what it left there.
        """
        ctx = self._next_ctx
        self._next_ctx += 1
        self.properties = dict(properties or {})
        if metadata is not None:   # jwt_authn's payload struct, as Envoy serialises a map
            self.properties[PAYLOAD_PROPERTY] = serialize_pairs(
                [(k, v.encode("latin-1") if isinstance(v, str) else v) for k, v in metadata.items()])
        self.maps = {REQUEST_HEADERS: [(k.lower(), v) for k, v in headers]}
        self.local_response = None
        start_logs = len(self.logs)
        self._call("proxy_on_context_create", ctx, self.root_id)
        try:
            action = self._call("proxy_on_request_headers", ctx, len(headers), int(end_of_stream))
            result = StreamResult(action, list(self.maps[REQUEST_HEADERS]), self.local_response)
            if response is not None and self.local_response is None:
                self.maps[RESPONSE_HEADERS] = [(k.lower(), v) for k, v in response]
                self._call("proxy_on_response_headers", ctx, len(response), int(trailers is None))
                result.response = list(self.maps[RESPONSE_HEADERS])
                if trailers is not None:
                    self.maps[RESPONSE_TRAILERS] = [(k.lower(), v) for k, v in trailers]
                    self._call("proxy_on_response_trailers", ctx, len(trailers))
                    result.trailers = list(self.maps[RESPONSE_TRAILERS])
            result.logs = self.logs[start_logs:]
            return result
        finally:
            self._call("proxy_on_done", ctx)
            self._call("proxy_on_delete", ctx)
            self.maps = {}
