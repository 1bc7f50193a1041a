"""Our model server at another commit beside the working tree's, same flags, same client, taking turns:
req/s, p99 and the server's CPU per request.

    python -m benchmarks.serve_ab 4b51e2d [--model builtin:relu] [--flags "--qos-policy balanced --workers 2"]
        [--concurrency 1,64] [--seconds 3] [--rounds 3] [--grpc]

Is a figure that moved against a peer ours, or the machine? Peers ratios swing with this VM's
speed, so the question is answered by the two servers side by side. The other commit is checked
out as a git worktree under .cache/serve-ab/ with a venv of its own that imports every
dependency from this venv (a .pth line), so only our code differs; both are driven by this
tree's mcp-bench, alternately, and the table shows each median and new / old. The worktree is
removed afterwards.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import sysconfig
import urllib.request

from benchmarks.bench_peers import ROOT
from mcp26.demo.stack.ports import free_port
from mcp26.inference.bench.serve_process import ServeProcess
from mcp26.serving.executables import executable

CACHE = os.path.join(ROOT, ".cache", "serve-ab")


def checkout(rev: str) -> tuple[str, str]:
    """(worktree, its mcpctl) for `rev`, installed editable over this venv's packages."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, capture_output=True,
                         text=True)
    if sha.returncode != 0:
        raise SystemExit(f"serve_ab: no commit {rev!r} in {ROOT}")
    tree = os.path.join(CACHE, sha.stdout.strip()[:12])
    subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT, capture_output=True)
    subprocess.run(["git", "worktree", "add", "--detach", "-f", tree, sha.stdout.strip()], cwd=ROOT, check=True,
                   capture_output=True)
    venv = os.path.join(tree, ".venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    py = os.path.join(venv, "bin", "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "serve-ab-deps.pth"), "w") as f:     # this venv's packages, not its code
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", tree],
                   check=True, capture_output=True)
    return tree, os.path.join(venv, "bin", "mcpctl")


def tree_cpu_s(pid: int) -> float:
    """user + system CPU seconds of a process and its children (a server's workers) so far."""
    total = 0.0
    for p in [pid] + [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def run_load(url: str, c: int, seconds: float, width: int, grpc: bool, pid: int) -> tuple[float, float, float]:
    """(req/s, p99 ms, the server's CPU µs per request) of one mcp-bench run."""
    argv = [executable("mcp-bench"), "-u", url, "-c", str(c), "--duration", str(seconds),
            "--warmup", str(max(20, 2 * c)), "--input", f"INPUT0:FP32:1,{width}", "--timeout", "10",
            "--output-format", "json"]
    if grpc:
        argv += ["--grpc", "--connections", "1" if c == 1 else "4"]
    cpu0 = tree_cpu_s(pid)
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    cpu = tree_cpu_s(pid) - cpu0
    doc = json.loads(out)
    row = doc["rows"][0]
    if row["errors"] or not row["throughput_rps"]:
        raise SystemExit(f"serve_ab: {url} c={c}: {row['errors']} errors {row.get('error_classes')}")
    # the warm-up's requests are served too (and counted in the CPU): mcp-bench's own count of both
    requests = row.get("requests") or row["throughput_rps"] * seconds
    warmup = max(20, 2 * c)
    return row["throughput_rps"], row["latency_ms"]["p99"], 1e6 * cpu / (requests + warmup)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve_ab", description=__doc__.split("\n")[0])
    p.add_argument("rev", help="the other commit (a sha, tag or branch)")
    p.add_argument("--model", default="builtin:relu", help="a built-in model (builtin:NAME)")
    p.add_argument("--flags", default="--qos-policy balanced --workers 2", help="mcpctl serve flags for both")
    p.add_argument("--concurrency", default="1,64")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--grpc", action="store_true", help="gRPC instead of REST")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    if not args.model.startswith("builtin:"):
        p.error("--model: a built-in model, builtin:NAME (relu, mlp)")
    tree, old_mcpctl = checkout(args.rev)
    servers = {}
    try:
        for label, exe in (("old", old_mcpctl), ("new", executable("mcpctl"))):
            s = ServeProcess(args.model, free_port(), free_port(), *shlex.split(args.flags))
            s.args[0] = exe
            try:
                servers[label] = s.start()
            except RuntimeError as e:      # a flag one of the two trees refuses, say
                raise SystemExit(f"serve_ab: the {label} server did not start: {e}") from None
        with urllib.request.urlopen(servers["new"].rest_url, timeout=10) as r:
            width = json.load(r)["inputs"][0]["shape"][-1]
        got: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for rnd in range(args.rounds):
            order = ["old", "new"] if rnd % 2 == 0 else ["new", "old"]
            for c in levels:
                for label in order:
                    url = servers[label].grpc_url if args.grpc else servers[label].rest_url
                    got.setdefault((c, label), []).append(run_load(url, c, args.seconds, width, args.grpc,
                                                                   servers[label].proc.pid))
        print(f"\n{args.model} {'gRPC' if args.grpc else 'REST'}, `{args.flags}`, median of {args.rounds} "
              f"{args.seconds:g} s runs, load average {os.getloadavg()[0]:.2f}")
        print(f"{'c':>4} {'old ' + args.rev[:12]:>18} {'new (this tree)':>16} {'new / old':>10} "
              f"{'p99 old / new ms':>17} {'CPU µs/req old / new':>21} {'new / old':>9}  runs old | new")
        result = []
        for c in levels:
            med = {label: tuple(statistics.median(run[i] for run in got[(c, label)]) for i in range(3))
                   for label in ("old", "new")}
            (old, p_old, cpu_old), (new, p_new, cpu_new) = med["old"], med["new"]
            runs = " | ".join(" ".join(f"{r:.0f}" for r, _, _ in got[(c, label)]) for label in ("old", "new"))
            print(f"{c:>4} {old:>16.0f}/s {new:>14.0f}/s {new / old:>9.2f}x {p_old:>8.1f} / {p_new:<6.1f} "
                  f"{cpu_old:>10.0f} / {cpu_new:<8.0f} {cpu_new / cpu_old:>8.3f}x  {runs}")
            result.append({"c": c, "old": med["old"], "new": med["new"], "runs": {k[1]: v for k, v in got.items()
                                                                              if k[0] == c}})
        os.makedirs(os.path.join(ROOT, "artifacts", "bench"), exist_ok=True)
        with open(os.path.join(ROOT, "artifacts", "bench", "serve_ab.json"), "w") as f:
            json.dump({"rev": args.rev, "model": args.model, "flags": args.flags, "grpc": args.grpc,
                       "load_average": os.getloadavg(), "levels": result}, f, indent=1)
    finally:
        for s in servers.values():
            s.stop()
        subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
