"""The watched config directory: debounced, atomic change sets; bad ones rejected whole."""
import asyncio
import os
import pytest

from mcp26.mesh.parse import load_dir
from mcp26.demo.stack.ports import free_port
from mcp26.demo.stack.control_plane import write_config
from mcp26.xds.server import XdsServer
from mcp26.xds.watch import DirectorySource, fingerprint

DOC = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: {name}
spec:
  hosts: [{name}.example]
"""


def test_fingerprint_sees_add_write_and_remove(tmp_path):
    d = str(tmp_path)
    empty = fingerprint(d)
    write_config(d, "a.yaml", DOC.format(name="a"))
    one = fingerprint(d)
    assert one != empty
    write_config(d, "a.yaml", DOC.format(name="a2"))
    assert fingerprint(d) != one
    (tmp_path / "notes.txt").write_text("ignored")
    (tmp_path / ".hidden.yaml").write_text("ignored")
    os.remove(tmp_path / "a.yaml")
    assert fingerprint(d) == empty


def test_a_burst_of_writes_is_one_change_set(tmp_path):
    seen = []

    async def body():
        src = DirectorySource(str(tmp_path), lambda: _record(seen, tmp_path), poll=0.01, debounce=0.1)
        src.start()
        for i in range(5):          # five files, 20 ms apart: inside one debounce window
            write_config(str(tmp_path), f"f{i}.yaml", DOC.format(name=f"s{i}"))
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.4)
        await src.stop()

    asyncio.run(body())
    assert seen == [5]              # one apply, seeing all five files


async def _record(seen, path):
    seen.append(len(load_dir(str(path))))


def _count_translate(config, node):
    return {}


def test_bad_change_set_is_rejected_whole_and_last_good_kept(tmp_path):
    d = str(tmp_path)
    write_config(d, "a.yaml", DOC.format(name="a"))

    async def body():
        server = XdsServer(d, port=free_port(), admin_port=free_port(), load=load_dir,
                           translate=_count_translate, poll=0.01, debounce=0.05)
        await server.start()
        try:
            good = server.cache.config
            assert [r.name for r in good] == ["a"] and server.status["generation"] == "g1"
            # One good new file and one broken one arrive together: neither is taken.
            write_config(d, "b.yaml", DOC.format(name="b"))
            write_config(d, "c.yaml", "apiVersion: v1\nkind: [unclosed\n")
            for _ in range(100):
                await asyncio.sleep(0.02)
                if server.status["rejected"]:
                    break
            rejected = server.status["rejected"]
            assert rejected, "the broken change set was not reported"
            err = rejected["errors"][0]
            assert err["file"].endswith("c.yaml") and err["line"] == 3 and "malformed YAML" in err["message"]
            assert server.cache.config is good and server.status["generation"] == "g1"
            # The fix is taken, with b.
            os.remove(os.path.join(d, "c.yaml"))
            for _ in range(100):
                await asyncio.sleep(0.02)
                if server.status["generation"] != "g1":
                    break
            assert sorted(r.name for r in server.cache.config) == ["a", "b"]
            assert server.status["rejected"] is None
        finally:
            await server.stop(0)

    asyncio.run(body())


def test_translation_failure_rejects_change_set(tmp_path):
    d = str(tmp_path)
    write_config(d, "a.yaml", DOC.format(name="a"))
    calls = []

    def translate(config, node):
        calls.append(1)
        if any(r.name == "boom" for r in config):
            raise RuntimeError("translator bug")
        return {}

    async def body():
        from mcp26.xds.model.node import ProxyNode
        server = XdsServer(d, port=free_port(), admin_port=free_port(), load=load_dir, translate=translate)
        server.hub.nodes = lambda: [ProxyNode(id="n")]   # as if one proxy were connected
        await server.start()
        try:
            good = server.cache.config
            write_config(d, "b.yaml", DOC.format(name="boom"))
            assert not await server.apply()
            assert server.cache.config is good
            assert "translator bug" in server.status["rejected"]["errors"][0]["message"]
        finally:
            await server.stop(0)

    asyncio.run(body())


def test_incremental_loader_reparses_only_changed_files_and_equals_load_config(tmp_path):
    from mcp26.mesh.change_set import load_config
    from mcp26.xds.incremental_load import IncrementalLoader
    d = str(tmp_path)
    for name in "abc":
        write_config(d, f"{name}.yaml", DOC.format(name=name))
    load = IncrementalLoader()
    first = load(d)
    assert load.parsed == 3
    write_config(d, "b.yaml", DOC.format(name="b2"))
    os.remove(os.path.join(d, "c.yaml"))
    second = load(d)
    assert load.parsed == 1
    assert [(r.name, r.file, r.line) for r in second] == [(r.name, r.file, r.line) for r in load_config(d)]
    assert second.resources[0] is first.resources[0]           # a.yaml's resource, not re-parsed
    write_config(d, "b.yaml", "kind: [\n")
    try:
        load(d)
        raise AssertionError("a broken file must fail the whole load")
    except Exception as e:
        assert "b.yaml" in str(e)
    write_config(d, "b.yaml", DOC.format(name="b3"))
    assert sorted(r.name for r in load(d)) == ["a", "b3"]


def test_inotify_wakes_on_write_rename_and_new_subdirectory(tmp_path):
    from mcp26.xds.inotify import Inotify
    w = Inotify(str(tmp_path))
    try:
        assert not w.drain()
        write_config(str(tmp_path), "a.yaml", DOC.format(name="a"))     # temp file + rename
        assert w.drain()
        sub = tmp_path / "team"
        sub.mkdir()
        assert w.drain()                                                # and now watched
        (sub / "b.yaml").write_text(DOC.format(name="b"))
        assert w.drain()
        assert not w.drain()
    finally:
        w.close()


def test_polling_fallback_still_sees_changes(tmp_path):
    seen = []

    async def body():
        src = DirectorySource(str(tmp_path), lambda: _record(seen, tmp_path), poll=0.01, debounce=0.05,
                              use_inotify=False)
        src.start()
        write_config(str(tmp_path), "a.yaml", DOC.format(name="a"))
        await asyncio.sleep(0.3)
        await src.stop()

    asyncio.run(body())
    assert seen == [1]


@pytest.mark.parametrize("use_inotify", [True, False])
def test_a_directory_that_never_stops_changing_is_still_applied(tmp_path, use_inotify):
    seen = []

    async def body():
        src = DirectorySource(str(tmp_path), lambda: _record(seen, tmp_path), poll=0.01, debounce=0.1,
                              max_debounce=0.3, use_inotify=use_inotify)
        src.start()
        for i in range(40):          # a write every 20 ms for 0.8 s: never still for 100 ms
            write_config(str(tmp_path), f"f{i % 3}.yaml", DOC.format(name=f"s{i}"))
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        await src.stop()

    asyncio.run(body())
    assert len(seen) >= 2            # applied during the storm, not only after it
