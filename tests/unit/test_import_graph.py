"""The import graph of the project's own code: no cycles, and the one-way rule
between parts (ARCHITECTURE.md): `mesh` imports no other part; the product
parts import `mesh` and not each other; only the demo, the harness and the
benchmarks drive several parts. Read from the source with `ast`, so an import
inside a function counts as much as one at the top of a module."""
from __future__ import annotations

import ast
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGES = {name: ROOT / folder for name, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items()}
PACKAGES["benchmarks"] = ROOT / "benchmarks"          # run from the repo root, not installed

PRODUCT = {"mesh", "xds_server", "wasm_filters", "inference_backend", "bpf", "scheduler"}
# What each part may import besides itself (`mesh` is every product part's base).
ALLOWED = {"mesh": set()} | {p: {"mesh"} for p in PRODUCT - {"mesh"}}
DRIVERS = {"demo", "harness", "benchmarks"}              # may import any part


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
    assert {"mesh.resources", "xds_server.ads", "harness.xds", "benchmarks.bench_xds"} <= set(MODULES)
    assert "mesh.diagnostics" in GRAPH["mesh.resources"]


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_parts_import_only_what_the_one_way_rule_allows():
    wrong = []
    for module, targets in sorted(GRAPH.items()):
        part = module.split(".")[0]
        if part in DRIVERS:
            continue
        for target in sorted(targets):
            other = target.split(".")[0]
            if other != part and other not in ALLOWED.get(part, set()):
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_product_parts_do_not_import_drivers():
    wrong = [f"{m} imports {t}" for m, ts in sorted(GRAPH.items()) if m.split(".")[0] in PRODUCT
             for t in sorted(ts) if t.split(".")[0] in DRIVERS]
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
