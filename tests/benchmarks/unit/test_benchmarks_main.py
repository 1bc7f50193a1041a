"""`python -m benchmarks NAME [flags]`: the flags reach that one benchmark; flags
without exactly one name are refused before anything runs."""
import os
import signal
import subprocess
import sys

from harness.paths import ROOT


def _run(*argv):
    # In a session of its own: if a broken refusal lets every benchmark start, the timeout
    # stops them all, not just the dispatcher.
    p = subprocess.Popen([sys.executable, "-m", "benchmarks", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_flags_reach_the_named_benchmark():
    r = _run("peers", "--help")
    assert r.returncode == 0, r.stderr
    assert "=== bench_peers ===" in r.stdout
    assert "--concurrency" in r.stdout          # bench_peers' own argparse answered


def test_flags_without_exactly_one_name_are_refused():
    for argv in (("--rounds", "2"), ("xds", "peers", "--rounds", "2")):
        r = _run(*argv)
        assert r.returncode == 2
        assert "name exactly one" in r.stderr
        assert "===" not in r.stdout            # nothing ran


def test_unknown_name_is_named():
    r = _run("nosuch")
    assert r.returncode == 2 and "no benchmark named nosuch" in r.stderr


def test_help_alone_lists_the_benchmarks():
    r = _run("--help")
    assert r.returncode == 0
    assert "benchmarks:" in r.stdout and "peers" in r.stdout.split("benchmarks:")[-1]
    assert "===" not in r.stdout
