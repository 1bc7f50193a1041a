"""`mcpctl wasm ...`: build, inspect and try the header-contract filter.

    mcpctl wasm build                   # make -C wasm-filters
    mcpctl wasm inspect [MODULE] [-o json|yaml]   # size, sha256, ABI, imports/exports
    mcpctl wasm config FILE.yaml        # the JSON the control plane pushes for each WasmPlugin
    mcpctl wasm run FILE.yaml -H end-user:admin -c sub=jane   # one request through the module (host emulator)
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

from mcp26.mesh.cli_output import add_output_flag, render
from mcp26.wasm import HEADER_CONTRACT_WASM

HERE = os.path.dirname(os.path.abspath(__file__))


def _build(args) -> int:
    return subprocess.call(["make", "-C", HERE])


def _inspect(args) -> int:
    import wasmtime
    path = args.module
    try:
        data = open(path, "rb").read()
    except OSError as e:
        print(f"mcpctl wasm inspect: {path}: {e.strerror}", file=sys.stderr)
        return 1
    try:
        mod = wasmtime.Module(wasmtime.Engine(), data)
    except Exception as e:  # wasmtime raises its own error types for a bad module
        print(f"mcpctl wasm inspect: {path}: not a valid Wasm module: {e}", file=sys.stderr)
        return 1
    exports = sorted(e.name for e in mod.exports)
    abi = [e for e in exports if e.startswith("proxy_abi_version_")]
    if args.output != "text":
        sys.stdout.write(render({"module": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                 "abi": abi, "imports": [f"{i.module}.{i.name}" for i in mod.imports],
                                 "exports": exports}, args.output))
        return 0 if abi else 1
    print(f"module   {path}\nsize     {len(data)} bytes\nsha256   {hashlib.sha256(data).hexdigest()}")
    print(f"abi      {', '.join(abi) or 'none (not a Proxy-Wasm module)'}")
    print("imports  " + ", ".join(f"{i.module}.{i.name}" for i in mod.imports))
    print("exports  " + ", ".join(exports))
    return 0 if abi else 1


def _plugins(path: str):
    from mcp26.mesh.parse import load_files
    from mcp26.mesh.diagnostics import ConfigError
    try:
        config = load_files([path])
    except ConfigError as e:
        print(e, file=sys.stderr)
        return None, []
    return config, [r for r in config.of_kind("WasmPlugin")]


def _plugin_json(res, config) -> str:
    from mcp26.mesh.header_contract import PLUGIN_NAME, parse_plugin_config
    if res.spec.get("pluginName") == PLUGIN_NAME:
        return parse_plugin_config(res.spec.get("pluginConfig")).filter_json()
    return json.dumps(res.spec.get("pluginConfig") or {}, sort_keys=True)


def _config(args) -> int:
    from mcp26.mesh.header_contract import ContractError
    config, plugins = _plugins(args.file)
    if config is None:
        return 1
    for res in plugins:
        try:
            text = _plugin_json(res, config)
        except ContractError as e:
            for f, m in e.problems:
                print(f"{res.file}:{res.line_of(f)}: error: {res.ref}: {f}: {m}", file=sys.stderr)
            return 1
        print(f"# {res.ref}")
        print(json.dumps(json.loads(text), indent=2, sort_keys=True))
    return 0


def _run(args) -> int:
    from mcp26.mesh.header_contract import ContractError
    from mcp26.wasm.host import ProxyWasmHost
    config, plugins = _plugins(args.file)
    if not plugins:
        print("mcpctl wasm run: no WasmPlugin in that file", file=sys.stderr)
        return 1
    try:
        text = _plugin_json(plugins[0], config)
    except ContractError as e:
        print(e, file=sys.stderr)
        return 1
    host = ProxyWasmHost(args.module)
    if not host.configure(text):
        print("module rejected its configuration:", *[m for _, m in host.logs], sep="\n  ", file=sys.stderr)
        return 1
    headers = [(":method", "GET"), (":path", args.path), (":authority", "mesh")]
    headers += [tuple(h.split(":", 1)) for h in args.header]
    claims = dict(c.split("=", 1) for c in args.claim)
    r = host.request(headers, properties={("request", "protocol"): args.protocol.encode()}, metadata=claims)
    if r.local_response:
        print(f"local response {r.local_response.status} ({r.local_response.details})")
        return 0
    for k, v in r.headers:
        print(f"{k}: {v}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("wasm", help="build, inspect and try the header-contract Wasm filter")
    sub = p.add_subparsers(dest="wasm_command", metavar="ACTION")
    b = sub.add_parser("build", help="compile the filter (make -C wasm-filters)")
    b.set_defaults(func=_build)
    i = sub.add_parser("inspect", help="size, sha256, ABI version, imports and exports of a module")
    i.add_argument("module", nargs="?", default=HEADER_CONTRACT_WASM, help="the .wasm module (default: the built header-contract filter)")
    add_output_flag(i, ("text",), what="the module's size, sha256, ABI, imports and exports")
    i.set_defaults(func=_inspect)
    c = sub.add_parser("config", help="the filter JSON generated for each WasmPlugin of a YAML file")
    c.add_argument("file", help="a WasmPlugin YAML or the filter's JSON configuration")
    c.set_defaults(func=_config)
    r = sub.add_parser("run", help="run one request through the module in the Python host emulator")
    r.add_argument("file", help="YAML with the WasmPlugin")
    r.add_argument("-H", "--header", action="append", default=[], help="request header name:value")
    r.add_argument("-c", "--claim", action="append", default=[], help="verified JWT claim name=value")
    r.add_argument("--path", default="/", help="the request :path to run through the filter (default /)")
    r.add_argument("--protocol", default="HTTP/1.1", help="request.protocol (HTTP/1.1, HTTP/2)")
    r.add_argument("--module", default=HEADER_CONTRACT_WASM, help="the .wasm module (default: the built header-contract filter)")
    r.set_defaults(func=_run)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
