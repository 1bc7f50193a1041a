"""Translation is a function of its arguments (issue #39): the config, the node, the
TranslateOptions a Translator is made with, and the Overlay it is given. Two Translators
with other options, or one Translator given other overlays in turn, never see each
other's; translation reads no file (the Wasm bytes come in the overlay) and no clock;
and two control planes in one process hold their own remaps and endpoint weights."""
import argparse
import asyncio
import hashlib
import json
import os
import time

import aiohttp
import pytest
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import wrappers_pb2

from mcp26.mesh import qos as Q
from mcp26.mesh.diagnostics import ConfigError
from mcp26.mesh.header_contract import ClassRemap
from mcp26.mesh.parse import parse_documents
from mcp26.mesh.resources import MeshConfig
from mcp26.demo.stack.control_plane import write_config
from mcp26.demo.stack.ports import free_port
from mcp26.xds.cli import STREAM_IDLE_ENV, translate_options
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.model.type_urls import ENDPOINT, EXTENSION_CONFIG, LISTENER
from mcp26.xds.server import XdsServer
from mcp26.xds.telemetry import Telemetry
from mcp26.xds.translate import NO_OVERLAY, Overlay, TranslateOptions, Translator, translate
from mcp26.xds.wasm_modules import WasmModuleStore

MODULE = b"\0asm\x01\0\0\0"          # translation embeds the bytes; it does not run them
KEY = "a2V5LWtleS1rZXkta2V5LWtleS1rZXkta2V5LWtleS0="     # 32 bytes, base64


def mesh(module_path: str) -> str:
    return f"""
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: gw, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers: [{{port: {{number: 8080, name: http, protocol: HTTP}}, hosts: ["*"]}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: svc, namespace: default}}
spec:
  hosts: [svc.mesh.local]
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 127.0.0.2, ports: {{http: 9001}}}}, {{address: 127.0.0.3, ports: {{http: 9001}}}}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: app, namespace: default}}
spec:
  workloadSelector: {{labels: {{app: a}}}}
  ingress: [{{port: {{number: 15081, protocol: HTTP, name: http}}, defaultEndpoint: "127.0.0.1:8080"}}]
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {{name: contract, namespace: default}}
spec:
  selector: {{matchLabels: {{istio: ingressgateway}}}}
  url: file://{module_path}
  sha256: "{hashlib.sha256(MODULE).hexdigest()}"
  pluginName: mcp-header-contract
  pluginConfig: {{sessionKey: {KEY}}}
"""


CLUSTER = "outbound|80||svc.mesh.local"
GATEWAY = ProxyNode("router~10.0.0.1~gw-1.default~default.svc.cluster.local", labels={"istio": "ingressgateway"})
SIDECAR = ProxyNode("sidecar~127.0.0.1~a-1.default~default.svc.cluster.local", kind="sidecar", labels={"app": "a"})


@pytest.fixture
def module(tmp_path) -> str:
    path = tmp_path / "contract.wasm"
    path.write_bytes(MODULE)
    return str(path)


def config(module_path: str) -> MeshConfig:
    return MeshConfig(parse_documents(mesh(module_path), "mesh.yaml"))


def idle_timeouts(snapshot) -> set[float]:
    out = set()
    for lis in snapshot[LISTENER].values():
        for chain in lis.filter_chains:
            for f in chain.filters:
                if f.typed_config.Is(hcm_pb2.HttpConnectionManager.DESCRIPTOR):
                    hcm = hcm_pb2.HttpConnectionManager()
                    f.typed_config.Unpack(hcm)
                    out.add(hcm.stream_idle_timeout.ToMilliseconds() / 1000)
    return out


def filter_json(snapshot) -> dict:
    wasm = http_wasm.Wasm()
    snapshot[EXTENSION_CONFIG]["default.contract"].typed_config.Unpack(wasm)
    text = wrappers_pb2.StringValue()
    wasm.config.configuration.Unpack(text)
    return json.loads(text.value)


def remapped(snapshot) -> list:
    return [(r["from"], r["to"]) for r in filter_json(snapshot)["qos"].get("remap", [])]


def weights(snapshot) -> dict:
    return {lb.endpoint.address.socket_address.address: lb.load_balancing_weight.value
            for loc in snapshot[ENDPOINT][CLUSTER].endpoints for lb in loc.lb_endpoints}


def test_the_idle_timeout_is_the_translators_own(module):
    cfg = config(module)
    overlay = Overlay(wasm_modules=WasmModuleStore().load(cfg))
    short, default = Translator(TranslateOptions(stream_idle_timeout_s=2.5)), Translator()
    for node in (GATEWAY, SIDECAR):            # bound gateway listeners and sidecar inbound ones
        assert idle_timeouts(short.translate(cfg, node, overlay)) == {2.5}
        assert idle_timeouts(default.translate(cfg, node, overlay)) == {300.0}
        assert idle_timeouts(short.translate(cfg, node, overlay)) == {2.5}       # and stays so
    assert idle_timeouts(translate(cfg, SIDECAR, TranslateOptions(stream_idle_timeout_s=0))) == {0.0}


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), "300", True])
def test_options_refuse_a_bad_idle_timeout(value):
    with pytest.raises(ValueError, match="stream_idle_timeout_s"):
        TranslateOptions(stream_idle_timeout_s=value)


@pytest.mark.parametrize("flag, env, expect", [
    (None, None, 300.0), (None, "7", 7.0), (4.0, "7", 4.0), (0.0, None, 0.0),
    (None, "soon", None), (-1.0, None, None), (None, "nan", None), (None, "inf", None)])
def test_the_cli_builds_the_options_from_flag_then_environment(flag, env, expect):
    options = translate_options(argparse.Namespace(stream_idle_timeout=flag),
                                {STREAM_IDLE_ENV: env} if env is not None else {})
    assert (options.stream_idle_timeout_s if options else None) == expect


def test_one_translator_given_other_overlays_in_turn_keeps_them_apart(module):
    cfg = config(module)
    modules = WasmModuleStore().load(cfg)
    now = 2e9
    a = Overlay(class_remaps=(ClassRemap(Q.QosClass.parse("standard"), Q.QosClass.parse("batch"), now),),
                wasm_modules=modules)
    b = Overlay(endpoint_weights={CLUSTER: {"127.0.0.3:9001": 9}}, wasm_modules=modules)
    tr = Translator()
    for _ in range(2):                         # the per-config cache carries nothing across
        sa, sb = tr.translate(cfg, GATEWAY, a), tr.translate(cfg, GATEWAY, b)
        assert remapped(sa) == [("standard", "batch")] and remapped(sb) == []
        assert weights(sa) == {"127.0.0.2": 0, "127.0.0.3": 0}
        assert weights(sb) == {"127.0.0.2": 0, "127.0.0.3": 9}


def test_translation_reads_no_file_the_bytes_come_in_the_overlay(module):
    cfg = config(module)
    overlay = Overlay(wasm_modules=WasmModuleStore().load(cfg))
    os.remove(module)                          # gone after the load: translation does not notice
    wasm = http_wasm.Wasm()
    Translator().translate(cfg, GATEWAY, overlay)[EXTENSION_CONFIG]["default.contract"].typed_config.Unpack(wasm)
    assert wasm.config.vm_config.code.local.inline_bytes == MODULE
    assert wasm.config.vm_config.vm_id == f"default.contract@{hashlib.sha256(MODULE).hexdigest()[:12]}"


def test_translation_opens_no_file_and_reads_no_environment(module, monkeypatch):
    cfg = config(module)
    overlay = Overlay(wasm_modules=WasmModuleStore().load(cfg))

    reads, listeners = [], []

    def refuse(*args, **kwargs):
        reads.append(args[:1])
        raise PermissionError("translation may not read this")

    grpc = ProxyNode("grpc-client", kind="grpc")
    with monkeypatch.context() as m:        # undone before pytest itself reads a file
        for name in ("open", "stat", "listdir", "scandir", "getenv"):
            m.setattr(os, name, refuse)
        m.setattr("builtins.open", refuse)
        m.setattr(os, "environ", {})
        try:
            listeners = [bool(Translator().translate(cfg, node, overlay)[LISTENER]) for node in (GATEWAY, SIDECAR, grpc)]
        except PermissionError:
            pass
    assert (reads, listeners) == ([], [True, True, True])


def test_a_plugin_whose_module_was_not_loaded_is_a_config_error_naming_it(module):
    with pytest.raises(ConfigError) as e:
        Translator().translate(config(module), GATEWAY, NO_OVERLAY)
    [d] = e.value.diagnostics
    assert (d.file, d.field, d.resource) == ("mesh.yaml", "spec.url", "WasmPlugin/default/contract") and d.line


# -- two control planes in one process -------------------------------------------------
def _served(server: XdsServer) -> dict:
    """The gateway's served snapshot as {type URL: {name: message}}."""
    prepared = server.cache.snapshot_for(GATEWAY)
    return {t: {n: r.message for n, r in by_name.items()} for t, by_name in prepared.resources.items()}


async def _post(session, server: XdsServer, path: str, body: dict) -> None:
    async with session.post(f"http://127.0.0.1:{server.admin_port}{path}", json=body) as r:
        assert r.status == 200, await r.text()


def test_two_servers_in_one_process_hold_independent_remaps_and_weights(tmp_path, module):
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    write_config(str(config_dir), "mesh.yaml", mesh(module))

    async def body():
        a, b = (XdsServer(str(config_dir), port=free_port(), admin_port=free_port(), telemetry=Telemetry())
                for _ in range(2))
        await a.start()
        await b.start()
        try:
            before = [(remapped(_served(x)), weights(_served(x))) for x in (a, b)]
            exp = time.time() + 60
            async with aiohttp.ClientSession() as s:
                await _post(s, a, "/scheduler/class-remap", {"from": "standard", "to": "batch", "expires_at": exp})
                await _post(s, b, "/scheduler/endpoint-weight",
                            {"cluster": CLUSTER, "weights": {"127.0.0.3:9001": 9}, "expires_at": exp})
                states = []
                for x in (a, b):
                    async with s.get(f"http://127.0.0.1:{x.admin_port}/scheduler") as r:
                        states.append(await r.json())
            return before, [(remapped(_served(x)), weights(_served(x))) for x in (a, b)], states
        finally:
            await a.stop()
            await b.stop()

    before, (on_a, on_b), (state_a, state_b) = asyncio.run(body())
    assert before == [([], {"127.0.0.2": 0, "127.0.0.3": 0})] * 2
    assert on_a == ([("standard", "batch")], {"127.0.0.2": 0, "127.0.0.3": 0})
    assert on_b == ([], {"127.0.0.2": 0, "127.0.0.3": 9})
    assert [r["from"] for r in state_a["class_remaps"]] == ["standard"] and state_a["endpoint_weights"] == []
    assert state_b["class_remaps"] == [] and [w["weight"] for w in state_b["endpoint_weights"]] == [9]
