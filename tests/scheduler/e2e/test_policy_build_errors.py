"""`mcpctl policy build` on a file that is not a plugin: told before componentize-py runs,
naming the file (and line), with what a plugin must define."""
from __future__ import annotations

import time

import pytest

from mcp26.scheduler.plugins.build import BuildError, build, check_source

pytestmark = pytest.mark.e2e

PLUGIN = """import wit_world

class WitWorld(wit_world.WitWorld):
    def decide(self, signals):
        return []
"""


@pytest.mark.parametrize("text, reason", [
    ("def decide(signals):\n    return []\n", "defines no WitWorld at module level"),
    ("class WitWorld(:\n    pass\n", ":1:16: invalid syntax"),
    ("class WitWorld:\n    pass\n\x00", "notaplugin.py: source code string cannot contain null bytes"),
    ("x = " + "-" * 100_000 + "1\n", "too deeply nested"),      # the parser's own limits, not a traceback
])
def test_not_a_plugin_is_refused_before_componentize_py(tmp_path, text, reason):
    src = tmp_path / "notaplugin.py"
    src.write_text(text)
    t0 = time.monotonic()
    with pytest.raises(BuildError) as e:
        build(src, tmp_path / "out.wasm")
    assert str(src) in str(e.value) and reason in str(e.value), e.value
    assert time.monotonic() - t0 < 2, "componentize-py was run"      # it takes seconds to fail
    assert not (tmp_path / "out.wasm").exists()


@pytest.mark.parametrize("text", [
    PLUGIN,
    "from wit_world import *\n",                                        # cannot be told statically
    "try:\n    from fast import WitWorld\nexcept ImportError:\n    from slow import WitWorld\n",
])
def test_what_may_be_a_plugin_is_left_to_componentize_py(tmp_path, text):
    src = tmp_path / "maybe.py"
    src.write_text(text)
    check_source(src)


def test_a_plugin_failing_at_import_shows_its_own_traceback(mcpctl, tmp_path):
    """componentize-py imports the plugin at build time: the author sees their file and line,
    not the generated wrapper, componentize-py's frames or its Rust backtrace."""
    src = tmp_path / "boom.py"
    src.write_text(PLUGIN.replace("import wit_world\n", "import wit_world\nLIMIT = 1 / 0\n"))
    p = mcpctl("policy", "build", str(src), "-o", str(tmp_path / "boom.wasm"))
    assert p.returncode == 1, p.stdout + p.stderr
    assert f'File "{src}", line 2, in <module>' in p.stderr, p.stderr
    assert "ZeroDivisionError: division by zero" in p.stderr, p.stderr
    for noise in ("Stack backtrace", "anyhow", "mcp_policy_entry", "componentize-py\", line"):
        assert noise not in p.stderr, p.stderr
    assert not (tmp_path / "boom.wasm").exists()


def test_a_wasm_file_that_is_not_wasm_is_refused_as_such(mcpctl, tmp_path):
    """Not read as WAT text (wasmtime's "expected `(`"): told it is no Wasm binary."""
    bad = tmp_path / "policy.wasm"
    bad.write_bytes(b"garbage, not a component")
    p = mcpctl("policy", "run", str(bad), "--signals", "{}", "--cache-dir", str(tmp_path / "cache"))
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"{bad}: instantiate: not a Wasm binary" in p.stderr, p.stderr
