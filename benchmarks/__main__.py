"""`make bench` / `python -m benchmarks [NAME ...]`: run every benchmarks/bench_*.py
(or those named: `xds`, `inference`, ...) in turn, each in its own process.

Each benchmark prints its own table (ratios measured side by side in one run)
and writes JSON under artifacts/bench/. Run from the repo root; a single one is
also `python -m benchmarks.bench_NAME [its flags]`.
"""
from __future__ import annotations

import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    wanted = [a.removeprefix("bench_").removesuffix(".py") for a in argv]
    scripts = sorted(HERE.glob("bench_*.py"))
    if wanted:
        unknown = set(wanted) - {s.stem.removeprefix("bench_") for s in scripts}
        if unknown:
            names = ", ".join(s.stem.removeprefix("bench_") for s in scripts)
            print(f"no benchmark named {', '.join(sorted(unknown))}; there are: {names}", file=sys.stderr)
            return 2
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in wanted]
    failed = []
    for script in scripts:
        print(f"\n=== {script.stem} ===", flush=True)
        if subprocess.call([sys.executable, "-m", f"benchmarks.{script.stem}"], cwd=HERE.parent) != 0:
            failed.append(script.stem)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
