"""The Wasm modules a config names, read when it is loaded (xds.wasm_modules): checked
against sha256, kept by content hash within a bound, and every bad one named by
file:line and spec.url -- a missing file, a mismatch, a FIFO, /dev/zero, an oversized
file, a url of the wrong type or scheme -- with nothing returned for any of them."""
import hashlib
import os

import pytest

from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.resources import MeshConfig
from mcp26.xds import wasm_modules
from mcp26.xds.wasm_modules import WasmModuleStore

pytestmark = pytest.mark.adversarial


def plugin(name: str, url, sha: str | None = None, kind: str = "") -> str:
    return (f"apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\n"
            f"metadata: {{name: {name}, namespace: default}}\n"
            f"spec:\n  selector: {{matchLabels: {{app: x}}}}\n  url: {url}\n"
            + (f'  sha256: "{sha}"\n' if sha else "") + (f"  type: {kind}\n" if kind else ""))


def config(*docs: str) -> MeshConfig:
    return MeshConfig(parse_documents("---\n".join(docs), file="plugins.yaml"))


def module(tmp_path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_modules_are_read_checked_and_keyed_by_url(tmp_path):
    a = module(tmp_path, "a.wasm", b"\0asm-a")
    b = module(tmp_path, "b.wasm", b"\0asm-b")
    found = WasmModuleStore().load(config(plugin("a", f"file://{a}", hashlib.sha256(b"\0asm-a").hexdigest()),
                                          plugin("b", b)))
    assert {url: (m.code, m.sha256) for url, m in found.items()} == {
        f"file://{a}": (b"\0asm-a", hashlib.sha256(b"\0asm-a").hexdigest()),
        b: (b"\0asm-b", hashlib.sha256(b"\0asm-b").hexdigest())}


def test_a_network_plugin_is_not_read():
    # Translation builds HTTP filters only; a NETWORK plugin's url is not the control plane's to read.
    assert WasmModuleStore().load(config(plugin("n", "/nowhere/n.wasm", kind="NETWORK"))) == {}


def test_every_bad_module_is_named_and_nothing_is_returned(tmp_path):
    good = module(tmp_path, "good.wasm", b"\0asm")
    os.mkfifo(tmp_path / "fifo.wasm")
    big = tmp_path / "big.wasm"
    with open(big, "wb") as f:
        f.truncate(wasm_modules.MAX_MODULE_BYTES + 1)          # sparse: no 32 MiB written
    cases = {
        "good": (good, None),
        "missing": (str(tmp_path / "missing.wasm"), None),
        "mismatch": (good, "0" * 64),
        "fifo": (str(tmp_path / "fifo.wasm"), None),
        "zero": ("/dev/zero", None),
        "big": (str(big), None),
        "http": ("https://example.com/x.wasm", None),
        "number": ("42", None),
    }
    with pytest.raises(ConfigError) as e:
        WasmModuleStore().load(config(*(plugin(n, u, s) for n, (u, s) in cases.items())))
    by_name = {d.resource.split("/")[-1]: d for d in e.value.diagnostics}
    assert sorted(by_name) == sorted(set(cases) - {"good"})
    assert all(d.file == "plugins.yaml" and d.line and d.field == "spec.url"
               and "cannot load the Wasm module" in d.message for d in by_name.values())
    assert "No such file" in by_name["missing"].message
    assert "does not match" in by_name["mismatch"].message
    assert "not a regular file" in by_name["fifo"].message and "not a regular file" in by_name["zero"].message
    assert "over the limit" in by_name["big"].message
    assert "'https' is not supported" in by_name["http"].message
    assert "not 42" in by_name["number"].message


def test_unchanged_files_are_not_read_again_and_a_changed_one_is(tmp_path):
    path = module(tmp_path, "m.wasm", b"\0asm-1")
    store = WasmModuleStore()
    cfg = config(plugin("m", path))
    first = store.load(cfg)[path]
    assert store.load(cfg)[path].code == b"\0asm-1" and store.reads == 1
    with open(path, "wb") as f:
        f.write(b"\0asm-two")
    second = store.load(cfg)[path]
    assert (second.code, store.reads) == (b"\0asm-two", 2)
    assert first.code == b"\0asm-1"                   # what was loaded before stays as it was


def test_one_copy_per_content_and_the_store_is_bounded(tmp_path):
    data = [bytes([i]) * 1000 for i in range(4)]
    paths = [module(tmp_path, f"m{i}.wasm", d) for i, d in enumerate(data)]
    twin = module(tmp_path, "twin.wasm", data[0])
    store = WasmModuleStore(max_bytes=2500)
    found = store.load(config(plugin("a", paths[0]), plugin("b", twin)))
    assert found[paths[0]].code is found[twin].code          # one copy of the same bytes
    assert store.cached_bytes == 1000
    loaded = [store.load(config(plugin("p", p)))[p] for p in paths]
    assert store.cached_bytes <= 2500                         # the least recently used went
    assert [m.code for m in loaded] == data                   # what a config holds, it keeps


def test_the_server_rejects_a_change_set_whose_module_it_cannot_read_and_keeps_the_last_good(tmp_path):
    """Validation only warns on an https url (Istio's agent would fetch it); the control plane
    reads modules itself, so at load -- with no proxy connected yet -- it rejects the set whole."""
    import asyncio
    from mcp26.demo.stack.control_plane import write_config
    from mcp26.demo.stack.ports import free_port
    from mcp26.xds.server import XdsServer
    from mcp26.xds.telemetry import Telemetry

    good = module(tmp_path, "m.wasm", b"\0asm\x01\0\0\0")
    d = tmp_path / "config"
    d.mkdir()
    write_config(str(d), "p.yaml", plugin("p", f"file://{good}"))

    async def body():
        server = XdsServer(str(d), port=free_port(), admin_port=free_port(), telemetry=Telemetry())
        await server.start()
        try:
            served = server.cache.config
            write_config(str(d), "p.yaml", plugin("p", "https://example.com/m.wasm"))
            return await server.apply(), server.cache.config is served, server.status, served
        finally:
            await server.stop()

    applied, kept, status, served = asyncio.run(body())
    assert served is not None and not applied and kept
    [err] = status["rejected"]["errors"]
    assert err["file"].endswith("p.yaml") and err["line"] == 6 and err["field"] == "spec.url", err
    assert "'https' is not supported" in err["message"]
