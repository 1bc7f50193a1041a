"""`make bench` / `python -m benchmarks [NAME ...]`: run every benchmarks/bench_*.py
(or those named: `xds`, `inference`, ...) in turn, each in its own process.

Each benchmark prints its own table (ratios measured side by side in one run)
and writes JSON under artifacts/bench/. Run from the repo root; a single one is
also `python -m benchmarks NAME [its flags]` (= `python -m benchmarks.bench_NAME [its flags]`).
"""
from __future__ import annotations

import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    names = ", ".join(s.stem.removeprefix("bench_") for s in scripts)
    if argv in (["-h"], ["--help"]):
        print(f"{__doc__}\nbenchmarks: {names}")
        return 0
    # Names first, then (one benchmark only) the flags that benchmark takes.
    split = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    wanted = [a.removeprefix("bench_").removesuffix(".py") for a in argv[:split]]
    flags = argv[split:]
    if flags and len(wanted) != 1:
        print(f"flags ({' '.join(flags)}) go to one benchmark: name exactly one before them, "
              f"e.g. `python -m benchmarks peers --rounds 2`", file=sys.stderr)
        return 2
    if wanted:
        unknown = set(wanted) - {s.stem.removeprefix("bench_") for s in scripts}
        if unknown:
            print(f"no benchmark named {', '.join(sorted(unknown))}; there are: {names}", file=sys.stderr)
            return 2
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in wanted]
    failed = []
    for script in scripts:
        print(f"\n=== {script.stem} ===", flush=True)
        if subprocess.call([sys.executable, "-m", f"benchmarks.{script.stem}", *flags], cwd=HERE.parent) != 0:
            failed.append(script.stem)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
