"""`mcpctl model pack|inspect`: write and read `.mcp26bin` files (model_format.py).

  mcpctl model pack resnet50.onnx -o resnet50.mcp26bin [--optimize]
  mcpctl model pack resnet50-ft.onnx -o resnet50-ft.mcp26bin --base resnet50.mcp26bin
  mcpctl model inspect resnet50-ft.mcp26bin [--verify] [--output json]
"""
from __future__ import annotations

import json
import sys

from mcp26.inference import model_format


def register(subparsers) -> None:
    p = subparsers.add_parser("model", help="pack ONNX models into .mcp26bin files and inspect them",
                              description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    pk = sub.add_parser("pack", help="write MODEL.onnx (or builtin:NAME) as a .mcp26bin file")
    pk.add_argument("model", help="PATH.onnx or builtin:NAME (mlp, resnet50, ...)")
    pk.add_argument("-o", "--output", required=True, help="the .mcp26bin file to write")
    pk.add_argument("--base", help="a previous .mcp26bin of the model: chunks equal to its own are referenced, "
                                   "not written (it must stay beside the output, at the same relative path)")
    pk.add_argument("--optimize", action="store_true",
                    help="pack the graph after ONNX Runtime's extended optimisations (fusions; CPU provider only) "
                         "instead of the basic, provider-independent ones")
    pk.set_defaults(func=pack)
    ins = sub.add_parser("inspect", help="print a .mcp26bin file's table of contents")
    ins.add_argument("file", help="the .mcp26bin file")
    ins.add_argument("--verify", action="store_true", help="hash every chunk (exit 1 on a mismatch)")
    ins.add_argument("--output", choices=("table", "json"), default="table", help="table (default) or json")
    ins.set_defaults(func=inspect)


def _source(spec: str) -> str:
    if spec.startswith("builtin:"):
        from mcp26.inference.builtin_models import builtin_path
        return builtin_path(spec[len("builtin:"):])
    return spec


def pack(args) -> int:
    try:
        toc = model_format.pack(_source(args.model), args.output, base=args.base,
                                level="extended" if args.optimize else "basic")
        info = model_format.describe(model_format.open_container(args.output))
    except (model_format.FormatError, ValueError, OSError) as e:
        print(f"mcpctl model pack: {e}", file=sys.stderr)
        return 2
    print(f"{args.output}: {info['size']} bytes, {len(toc['chunks'])} chunks "
          f"({info['chunk_bytes_here']} bytes here, {info['chunks_from_base']} from the base), "
          f"optimisation {toc['optimization']['level']}")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def inspect(args) -> int:
    try:
        container = model_format.open_container(args.file)
    except model_format.FormatError as e:
        print(f"mcpctl model inspect: {e}", file=sys.stderr)
        return 2
    info = model_format.describe(container)
    problems = model_format.verify(container) if args.verify else []
    if args.output == "json":
        print(json.dumps({**info, "verified": (not problems) if args.verify else None, "problems": problems},
                         indent=2))
    else:
        opt = info["optimization"]
        print(f"{info['file']}  format {info['version']}  {_size(info['size'])}  identity {info['identity'][:16]}")
        print(f"source {info['source']['name']}  sha256 {info['source']['sha256']}")
        print(f"optimisation {opt['level']} (onnxruntime {opt['onnxruntime']}"
              f"{', for ' + opt['provider'] if opt['provider'] else ''})  graph {_size(info['graph_bytes'])}")
        src, now = opt.get("source_op_counts", {}), opt.get("op_counts", {})
        changed = {op: (src.get(op, 0), now.get(op, 0)) for op in sorted({*src, *now})
                   if src.get(op, 0) != now.get(op, 0)}
        if changed:
            print("optimised graph: " + ", ".join(f"{op} {a} -> {b}" for op, (a, b) in changed.items()))
        for b in info["bases"]:
            print(f"base {b['path']}  identity {b['identity'][:16]}")
        print(f"{info['chunks']} chunks: {_size(info['chunk_bytes_here'])} in this file, "
              f"{info['chunks_from_base']} ({_size(info['chunk_bytes_from_base'])}) from a base")
        rows = [("chunk", "dtype", "shape", "size", "sha256", "from")] + [
            (c["name"], c["dtype"], "x".join(map(str, c["shape"])) or "scalar", _size(c["bytes"]),
             c["sha256"][:16], c["from"]) for c in info["table"]]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
        if args.verify:
            print("verify: " + ("every chunk's sha256 matches" if not problems else f"{len(problems)} problem(s)"))
    for p in problems:
        print(f"mcpctl model inspect: {p}", file=sys.stderr)
    return 1 if problems else 0
