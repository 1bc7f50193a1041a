"""The demo's parts without running it (tests/xds/e2e/test_xds_cli.py runs `mcpctl demo`):
its steps are found and ordered, each depends only on the framework, the demo's local stack and
mesh, and its manifests are the installed package data, valid as the control plane
checks them, and carry this run's ports once rendered."""
import ast
import pkgutil
from argparse import Namespace

import pytest
import yaml

from mcp26.demo import steps as demo_steps
from mcp26.demo.framework import MANIFESTS, Demo
from mcp26.demo.steps import discover
from mcp26.mesh.change_set import load_texts

STEPS_DIR = demo_steps.__path__[0]


def test_steps_are_found_and_run_in_their_order():
    steps = discover()
    assert [s.order for s in steps] == sorted({s.order for s in steps})   # ascending, no two alike
    names = [s.name for s in steps]
    assert names[:3] == ["sample upstreams v1 v2 v3", "control plane", "gateway Envoy over ADS"]
    assert names[-1] == "proxy-status"
    assert {"header routing", "80/20 split", "fault delay", "header contract: JWT session headers",
            "gRPC-Web to the inference backend, console",
            "inference pool: two replicas through the gateway"} <= set(names)
    assert len(steps) == len(list(pkgutil.iter_modules(demo_steps.__path__)))   # one step per module


# What a step may import of the project: the framework, the demo's local stack and mesh, and the
# package roots that locate shipped files (mcp26.manifests.EXAMPLES, mcp26.wasm.HEADER_CONTRACT_WASM).
# Never another step, another product part's modules (it drives them as processes and over the
# wire), nor harness or benchmarks: the demo ships in the wheel, they do not.
STEP_MAY_IMPORT = ("mcp26.demo.framework", "mcp26.demo.stack", "mcp26.mesh")
SHIPPED_DATA = {"mcp26.manifests", "mcp26.wasm"}


def project_imports(tree: ast.AST) -> set[str]:
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module:
            names.add(n.module)
            if n.module in ("mcp26", "mcp26.demo", "mcp26.demo.steps"):     # from mcp26.demo import steps
                names |= {f"{n.module}.{a.name}" for a in n.names}
    return {m for m in names if m.split(".")[0] in ("mcp26", "harness", "benchmarks")}


@pytest.mark.parametrize("module", [m.name for m in pkgutil.iter_modules(demo_steps.__path__)])
def test_a_step_imports_only_the_framework_the_stack_and_mesh(module):
    imported = project_imports(ast.parse(open(f"{STEPS_DIR}/{module}.py").read()))
    allowed = lambda m: m in SHIPPED_DATA or any(m == a or m.startswith(a + ".") for a in STEP_MAY_IMPORT)  # noqa: E731
    assert {m for m in imported if not allowed(m)} == set(), imported
    assert "mcp26.demo.framework" in imported      # a step is a Step of the framework


def test_manifests_are_the_installed_package_data():
    assert MANIFESTS.parent.name == "demo" and (MANIFESTS.parent / "framework.py").exists()
    assert sorted(p.name for p in (MANIFESTS / "config").glob("*.yaml")) == \
        ["gateway.yaml", "services.yaml", "virtualservice.yaml"]


def _config_texts() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((MANIFESTS / "config").glob("*.yaml"))}


@pytest.mark.parametrize("routing", [None, "steps/2-split-80-20.yaml", "steps/3-fault-delay.yaml"])
def test_each_routing_stage_passes_the_control_planes_checks(routing):
    texts = _config_texts()
    if routing:     # a stage replaces config/virtualservice.yaml, as the demo writes it
        texts["virtualservice.yaml"] = (MANIFESTS / routing).read_text()
    config = load_texts(texts)       # raises ConfigError on any error
    assert [str(w) for w in config.warnings if w.severity == "warning"] == []
    assert {r.kind for r in config} >= {"Gateway", "ServiceEntry", "DestinationRule", "VirtualService"}


@pytest.fixture
def a_demo():
    d = Demo(Namespace(xds_port=18000, admin_port=18001, gateway_port=18080, envoy_admin_port=15000,
                       upstream_port=18081, manifests=str(MANIFESTS), keep=False, delta=False))
    yield d
    d.stop_all()
    assert not d.workdir.exists()


def test_rendered_manifests_carry_this_runs_ports(a_demo):
    ports = [a_demo.xds_port, a_demo.admin_port, a_demo.gateway_port, a_demo.envoy_admin_port,
             *a_demo.upstream_ports.values()]
    assert len(set(ports)) == len(ports)
    (gateway,) = yaml.safe_load_all(a_demo.manifest("config/gateway.yaml"))
    assert [s["port"]["number"] for s in gateway["spec"]["servers"]] == [a_demo.gateway_port]
    entry, _ = yaml.safe_load_all(a_demo.manifest("config/services.yaml"))
    assert {e["labels"]["version"]: e["ports"]["http"] for e in entry["spec"]["endpoints"]} == a_demo.upstream_ports


def test_ports_a_step_asks_for_never_repeat_the_runs(a_demo):
    picked = {a_demo.port() for _ in range(20)} | {a_demo.port(a_demo.gateway_port)}
    assert a_demo.gateway_port not in picked and len(picked) == 21
    base = a_demo.port_block(8)
    assert not set(range(base, base + 8)) & (picked | {a_demo.gateway_port})


def test_serve_prints_commands_mcpctl_accepts_and_writes_the_context(a_demo, tmp_path, monkeypatch, capsys):
    import shlex
    import threading
    import time

    from mcp26.demo import cli as demo_cli
    from mcp26.mesh.cli import build_parser
    monkeypatch.setenv("MCPCTL_CONTEXT", str(tmp_path / "context.yaml"))
    stop = threading.Event()
    a_demo.urls["endpoint picker stats"] = "http://127.0.0.1:19999/stats"     # as the inference-gateway step sets it
    serving = threading.Thread(target=demo_cli._serve, args=(a_demo, stop))
    serving.start()
    deadline = time.monotonic() + 10
    while not (tmp_path / "context.yaml").exists():
        assert time.monotonic() < deadline, "no context file written"
        time.sleep(0.01)
    context = yaml.safe_load((tmp_path / "context.yaml").read_text())
    stop.set()
    serving.join(10)
    assert not (tmp_path / "context.yaml").exists()        # removed as the demo stops: it names nothing now
    out = capsys.readouterr().out
    parser = build_parser()
    commands = [c for c in demo_cli.inspect_commands(a_demo) if c.startswith("mcpctl ")]
    assert "mcpctl console --port 15101 --picker http://127.0.0.1:19999" in commands
    for command in commands:
        assert command in out
        args = parser.parse_args(shlex.split(command)[1:])          # SystemExit on a command mcpctl refuses
        assert args.func
    assert context["controlPlane"] == f"http://127.0.0.1:{a_demo.admin_port}"
