"""The import graph of the project's own code: no cycles, and the one-way rule
between parts (ARCHITECTURE.md): `mesh` and `serving` import no other part; the
other product parts import those two and not each other; only the demo, the
harness and the benchmarks drive several parts. Read from the source with `ast`,
so an import inside a function counts as much as one at the top of a module."""
from __future__ import annotations

import ast
import pathlib
import tomllib

from harness.paths import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGES = {name: ROOT / folder for name, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items()}
PACKAGES["harness"] = ROOT / "harness"                # the checkout's tools: run from the repo root,
PACKAGES["benchmarks"] = ROOT / "benchmarks"          # not installed

BASE = {"mesh", "serving"}                            # every product part's base
PRODUCT = BASE | {"xds", "wasm", "inference", "bpf", "scheduler", "manifests"}
# What each part may import besides itself.
ALLOWED = {"mesh": set(), "serving": set()} | {p: BASE for p in PRODUCT - BASE}
DRIVERS = {"demo", "harness", "benchmarks"}              # may import any part


def part(module: str) -> str:
    """`mcp26.xds.ads` -> `xds`; the checkout's tools are parts by their own name."""
    head, _, rest = module.partition(".")
    return rest.partition(".")[0] if head == "mcp26" else head


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for name, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [name, *rel.parts]
            if parts[-1] == "__init__":
                parts.pop()
            if any(p.startswith(".") or p in ("node_modules",) for p in rel.parts):
                continue
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _edges(module: str, path: pathlib.Path) -> set[str]:
    """The project modules `module` imports: `from pkg import sub` is an edge to
    pkg.sub when that is a module, else to pkg."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:      # `import a.b.c` of a package path
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


GRAPH = {m: _edges(m, p) for m, p in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_the_project():
    # Guards the test itself: a broken package map would make every check vacuous.
    assert {"mcp26.mesh.resources", "mcp26.xds.ads", "mcp26.serving.grpc.server", "mcp26.demo.stack.control_plane",
            "harness.bpf_env", "benchmarks.bench_xds"} <= set(MODULES)
    assert "mcp26.mesh.diagnostics" in GRAPH["mcp26.mesh.resources"]
    assert {part(m) for m in MODULES} == PRODUCT | DRIVERS


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_parts_import_only_what_the_one_way_rule_allows():
    wrong = []
    for module, targets in sorted(GRAPH.items()):
        mine = part(module)
        if mine in DRIVERS:
            continue
        for target in sorted(targets):
            other = part(target)
            if other != mine and other not in ALLOWED.get(mine, set()):
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_product_parts_do_not_import_drivers():
    wrong = [f"{m} imports {t}" for m, ts in sorted(GRAPH.items()) if part(m) in PRODUCT
             for t in sorted(ts) if part(t) in DRIVERS]
    assert wrong == []


def test_no_sys_path_edits_outside_tests():
    edits = []
    for module, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "path" and isinstance(node.value.value, ast.Name) \
                    and node.value.value.id == "sys" and node.attr in ("insert", "append", "extend"):
                edits.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert edits == []
