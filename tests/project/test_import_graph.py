"""The import graph of the project's own code: no cycles between modules nor
between packages, and the one-way rule between parts (ARCHITECTURE.md): `mesh`
and `serving` import no other part; the other product parts import those two and
not each other; only the demo, the harness and the benchmarks drive several
parts. Read from the source with `ast`, so an import inside a function counts as
much as one at the top of a module -- and each such import is one of the
allowed ones below (LAZY_IMPORTS), with its reason.

Why packages too: mcp26.xds.translate reached into the server's own modules
(scheduler_actions' remaps, endpoint_weights' table) from inside functions
while the server imports translate/: no module cycle, but translation read the
server's state (issue #39). A cycle between a package and its subpackage is
that, whichever modules carry it."""
from __future__ import annotations

import ast
import fnmatch
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


def _targets(module: str, is_package: bool, node: ast.AST) -> set[str]:
    """The project modules one import statement names: `from pkg import sub` is
    pkg.sub when that is a module, else pkg."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = _resolve(module, is_package, node.level, node.module)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    else:
        return set()
    found = set()
    for name in names:
        while name and name not in MODULES:      # `import a.b.c` of a package path
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def _edges(module: str, path: pathlib.Path) -> set[str]:
    """The project modules `module` imports, wherever in it."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    return {t for node in ast.walk(tree) for t in _targets(module, is_package, node)}


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


def package(module: str) -> str:
    """The package a module is in: a package's own __init__ is the package."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        for target in targets:
            if package(module) != package(target):
                out.setdefault(package(module), set()).add(package(target))
    return out


# Cycles between packages that were there when the package check came (issue #39),
# each a package whose modules and a subpackage's use each other. Their parts' owners
# break them (the usual way: the modules both use move to a package of their own, as
# mcp26.xds.model did for xds); the test fails on any other, and on one that is gone.
KNOWN_PACKAGE_CYCLES = {
    frozenset({"mcp26.mesh", "mcp26.mesh.validation"}):
        "mesh.change_set and mesh.cli_validate run validation/, which uses mesh.resources, "
        "mesh.diagnostics and mesh.hosts beside them",
    frozenset({"mcp26.scheduler", "mcp26.scheduler.loop", "mcp26.scheduler.plugins"}):
        "scheduler.cli and scheduler.server use loop/ and plugins/, which use scheduler.decisions "
        "and scheduler.pool_source beside them",
    frozenset({"mcp26.demo", "mcp26.demo.steps"}):
        "demo.cli runs steps/, which use demo.framework beside it",
}


# -- imports inside functions ---------------------------------------------------------
# A project import inside a function hides what a module needs from its reader (and
# reached around this graph before packages were checked). Each one is allowed for a
# reason, by (importing module, imported module) pattern (fnmatch); any other belongs
# at the top of its module.
CLI = ("a command line: each sub-command imports what it runs when it runs, so `mcpctl --help`, "
       "completion and the other sub-commands start without it (mcp26.xds.translate alone is 0.6 s)")
DRIVER = "a driver (benchmark, harness, demo): imports what the case it runs needs"
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    ("mcp26.*.cli", "*"): CLI,
    ("mcp26.scheduler.plugins.commands", "*"): CLI + " (`mcpctl policy`'s sub-commands)",
    ("mcp26.inference.model_cli", "*"): CLI + " (`mcpctl model`'s sub-commands)",
    ("benchmarks.*", "*"): DRIVER,
    ("harness.*", "*"): DRIVER,
    ("mcp26.demo.*", "*"): DRIVER,
    ("mcp26.xds.bootstrap", "mcp26.xds.model.node"):
        "with the Envoy protos (~0.3 s), only for a node token (`mcpctl envoy bootstrap --ca-dir`)",
    ("mcp26.xds.sds", "mcp26.xds.ca"): "cryptography (~9 MB resident) only where the control plane has a CA",
    ("mcp26.xds.watch", "mcp26.xds.inotify"): "Linux's inotify through ctypes: where it cannot load, the source polls",
    ("mcp26.scheduler.loop.policy", "mcp26.scheduler.plugins.host"):
        "wasmtime (the plugin sandbox) only when the policy is a plugin",
    ("mcp26.inference.bench.runner", "mcp26.inference.bench.grpc_slots"): "grpcio and numpy only for a gRPC run",
}


def _function_imports(module: str, is_package: bool, tree: ast.AST) -> list[tuple[str, str, int]]:
    """(function, imported project module, line) of each project import inside a function."""
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
            else:
                if function:
                    found.extend((function, t, child.lineno) for t in sorted(_targets(module, is_package, child)))
                visit(child, function)

    visit(tree, "")
    return found


def _allowed(module: str, target: str) -> str | None:
    return next((why for (m, t), why in LAZY_IMPORTS.items()
                 if fnmatch.fnmatchcase(module, m) and fnmatch.fnmatchcase(target, t)), None)


FUNCTION_IMPORTS = {m: _function_imports(m, p.name == "__init__.py", ast.parse(p.read_text(), str(p)))
                    for m, p in MODULES.items()}


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


def test_no_import_cycles_between_packages():
    found = {frozenset(c) for c in _cycles(_package_graph(GRAPH))}
    assert sorted(sorted(c) for c in found - KNOWN_PACKAGE_CYCLES.keys()) == []
    assert sorted(sorted(c) for c in KNOWN_PACKAGE_CYCLES.keys() - found) == [], "gone: take it off the list"


def test_a_package_cycle_no_module_cycle_shows_is_found():
    # Translation reading the server's remaps again, as it did (issue #39): no module cycle...
    graph = {**GRAPH, "mcp26.xds.translate.wasm_plugins":
             GRAPH["mcp26.xds.translate.wasm_plugins"] | {"mcp26.xds.scheduler_actions"}}
    assert _cycles(graph) == []
    # ...but mcp26.xds and mcp26.xds.translate use each other.
    assert ["mcp26.xds", "mcp26.xds.translate"] in _cycles(_package_graph(graph))


def test_translation_imports_nothing_of_the_server_it_serves():
    wrong = [f"{m} imports {t}" for m, ts in sorted(GRAPH.items()) if m.startswith("mcp26.xds.translate")
             for t in sorted(ts) if part(t) == "xds" and not t.startswith(("mcp26.xds.translate", "mcp26.xds.model"))]
    assert wrong == []


def test_imports_inside_functions_are_the_allowed_ones():
    wrong = [f"{MODULES[m].relative_to(ROOT)}:{line} {function}() imports {target}"
             for m, found in sorted(FUNCTION_IMPORTS.items()) for function, target, line in found
             if _allowed(m, target) is None]
    assert wrong == [], "move them to the top of the module, or allow them in LAZY_IMPORTS with a reason"


def test_every_allowed_lazy_import_still_exists():
    used = {pattern for pattern in LAZY_IMPORTS for m, found in FUNCTION_IMPORTS.items() for _, t, _ in found
            if fnmatch.fnmatchcase(m, pattern[0]) and fnmatch.fnmatchcase(t, pattern[1])}
    assert sorted(LAZY_IMPORTS.keys() - used) == [], "no longer imported inside a function: take it off the list"


def test_function_imports_are_found_in_nested_and_async_functions_only():
    tree = ast.parse("from mcp26.mesh import qos\n"
                     "def f():\n    from mcp26.xds.translate import overlay\n"
                     "    async def g():\n        import mcp26.mesh.resources\n"
                     "class C:\n    def m(self):\n        from . import cache\n")
    assert _function_imports("mcp26.xds.server", False, tree) == [
        ("f", "mcp26.xds.translate.overlay", 3), ("g", "mcp26.mesh.resources", 5), ("m", "mcp26.xds.cache", 8)]
    assert _allowed("mcp26.xds.server", "mcp26.xds.translate.overlay") is None
    assert _allowed("mcp26.xds.cli", "mcp26.xds.server") == CLI


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
