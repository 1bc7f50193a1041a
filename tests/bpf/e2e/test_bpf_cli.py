"""`mcpctl bpf attach|status|detach` as separate processes, on a veth end in a
namespace this test creates (entered with nsenter, which keeps the mount
namespace and so the shared bpffs pins); and the loader's clean-up guarantees.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from mcp26.bpf import attach, tc
from mcp26.bpf.attach import AttachError
from mcp26.bpf.policy import build_policy
from harness.bpf_env import TcpServer, VethPair, in_netns, netns_socket, remove_stale_namespaces, require_bpf

pytestmark = pytest.mark.e2e


def mcpctl(*args: str, netns: str | None = None, user: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mcp26.mesh.cli", "bpf", *args]
    if netns:
        cmd = ["nsenter", f"--net=/run/netns/{netns}", *cmd]
    if user:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=os.getcwd())


@pytest.fixture
def pair():
    require_bpf()
    remove_stale_namespaces()
    p = VethPair().create()
    yield p
    with in_netns(p.client_ns):
        attach.detach(p.client_if)
    p.remove()


def leftovers(pair: VethPair) -> list[str]:
    with in_netns(pair.client_ns):
        found = []
        if os.path.exists(attach.pin_dir(pair.client_if)) or os.path.exists(attach.staging_dir(pair.client_if)):
            found.append("pins")
        if tc.interface_exists(pair.client_if):
            if tc.has_clsact(pair.client_if):
                found.append("clsact qdisc")
            if tc.filters(pair.client_if, "egress") or tc.filters(pair.client_if, "ingress"):
                found.append("filters")
    return found


def test_attach_status_replace_detach_across_processes(pair):
    ns, ifname = pair.client_ns, pair.client_if
    r = mcpctl("attach", "--interface", ifname, "--dscp-port", "9100=interactive", "--alpn", "--sample",
               "--json", netns=ns)
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)
    r = mcpctl("status", "--json", netns=ns)
    assert r.returncode == 0, r.stderr
    (st,) = json.loads(r.stdout)
    assert st["interface"] == ifname and st["ports"] == {"9100": 34} and st["alpn"] and st["sample"]
    assert st["filters"]["egress"] and st["filters"]["ingress"]
    assert st["filters"]["egress"][0]["prog_id"] == first["filters"]["egress"][0]["prog_id"]

    # attach replaces: new program, new maps, no sampler, the ingress filter gone
    r = mcpctl("attach", "--interface", ifname, "--dscp-port", "8000=46", "--json", netns=ns)
    assert r.returncode == 0, r.stderr
    (st,) = json.loads(mcpctl("status", "--json", netns=ns).stdout)
    assert st["ports"] == {"8000": 46} and not st["alpn"] and not st["sample"]
    assert st["filters"]["egress"][0]["prog_id"] != first["filters"]["egress"][0]["prog_id"]
    assert st["filters"]["ingress"] == []
    assert st["created_qdisc"]

    r = mcpctl("detach", "--interface", ifname, netns=ns)
    assert r.returncode == 0 and "detached" in r.stdout
    assert leftovers(pair) == []
    assert json.loads(mcpctl("status", "--json", netns=ns).stdout) == []
    r = mcpctl("detach", "--interface", ifname, netns=ns)
    assert r.returncode == 0 and "nothing attached" in r.stdout


def test_bad_arguments_exit_2_and_attach_nothing(pair):
    r = mcpctl("attach", "--interface", pair.client_if, "--dscp-port", "9100=ultra", "--dscp-cidr",
               "10.0.0.1/8=46", netns=pair.client_ns)
    assert r.returncode == 2
    assert "'9100=ultra'" in r.stderr and "10.0.0.1/8" in r.stderr
    r2 = mcpctl("attach", "--interface", "nosuch0", netns=pair.client_ns)
    assert r2.returncode == 1 and "no interface 'nosuch0'" in r2.stderr
    assert leftovers(pair) == []


def test_without_privilege_a_clear_message():
    # As root, drop to nobody; as anyone else, just run it.
    r = mcpctl("attach", "--interface", "lo", user="65534" if os.geteuid() == 0 else None)
    assert r.returncode == 1
    assert "needs root" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_failed_attach_leaves_nothing(pair, monkeypatch):
    real = tc.replace_filter

    def fail_on_ingress(ifname, hook, pinned):
        if hook == "ingress":
            raise tc.TcError("injected failure")
        real(ifname, hook, pinned)

    monkeypatch.setattr(tc, "replace_filter", fail_on_ingress)
    with in_netns(pair.client_ns), pytest.raises(AttachError, match="injected failure"):
        attach.attach(pair.client_if, build_policy(ports=["1=1"], sample=True))
    assert leftovers(pair) == []


def test_a_failed_replace_keeps_the_previous_attach(pair, monkeypatch):
    with in_netns(pair.client_ns):
        before = attach.attach(pair.client_if, build_policy(ports=["9100=34"], sample=True))
    real = tc.replace_filter

    def fail_on_ingress(ifname, hook, pinned):
        if hook == "ingress":
            raise tc.TcError("injected failure")
        real(ifname, hook, pinned)

    monkeypatch.setattr(tc, "replace_filter", fail_on_ingress)
    with in_netns(pair.client_ns):
        with pytest.raises(AttachError):
            attach.attach(pair.client_if, build_policy(ports=["8000=46"], sample=True))
        monkeypatch.setattr(tc, "replace_filter", real)
        (after,) = attach.status(pair.client_if)
    assert after["ports"] == {9100: 34}
    assert after["filters"]["egress"][0]["prog_id"] == before["filters"]["egress"][0]["prog_id"]
    assert after["filters"]["ingress"][0]["prog_id"] == before["filters"]["ingress"][0]["prog_id"]


def test_detach_after_the_interface_is_gone_removes_the_pins(pair):
    with in_netns(pair.client_ns):
        attach.attach(pair.client_if, build_policy(alpn=True))
        subprocess.run(["ip", "link", "del", pair.client_if], check=True)
        (st,) = attach.status()
        assert st["interface_present"] is False
        assert attach.detach(pair.client_if) is True
        assert not os.path.exists(attach.pin_dir(pair.client_if))


def scrape(netns: str, port: int) -> str:
    """GET /metrics on 127.0.0.1:port inside `netns`; "" while nothing answers."""
    try:
        s = netns_socket(netns)
        s.settimeout(2)
        with s:
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /metrics HTTP/1.0\r\nhost: localhost\r\n\r\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def test_latency_command_reads_the_pinned_sampler(pair):
    ns = pair.server_ns
    sock = netns_socket(ns)
    sock.bind((pair.V4[1], 8090))
    sock.listen(4)

    def echo_ok(conn):
        while conn.recv(4096):
            conn.sendall(b"ok")
    srv = TcpServer(sock, echo_ok)
    try:
        r = mcpctl("attach", "-i", pair.server_if, "--sample-port", "8090", netns=ns)
        assert r.returncode == 0, r.stderr
        c = netns_socket(pair.client_ns)
        c.settimeout(5)
        c.connect((pair.V4[1], 8090))
        with c:
            for _ in range(10):
                c.sendall(b"req")
                assert c.recv(16) == b"ok"
        # The ring buffer holds the samples until a reader drains them.
        r = mcpctl("latency", "-i", pair.server_if, "--seconds", "0.5", "--json", netns=ns)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["8090"]["samples"] == 10
        assert 0 < out["8090"]["p50_us"] <= out["8090"]["p99_us"]

        # Again, served for Prometheus (on 127.0.0.1 of the server's namespace).
        with netns_socket(pair.client_ns) as c2:
            c2.settimeout(5)
            c2.connect((pair.V4[1], 8090))
            for _ in range(3):
                c2.sendall(b"req")
                assert c2.recv(16) == b"ok"
        proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", sys.executable, "-m", "mcp26.mesh.cli", "bpf",
                                 "latency", "-i", pair.server_if, "--seconds", "8", "--prometheus-port", "9464"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            scraped, deadline = "", time.monotonic() + 8
            while 'service_port="8090"' not in scraped and time.monotonic() < deadline:
                time.sleep(0.3)
                scraped = scrape(ns, 9464)
        finally:
            proc.kill()
            proc.wait()
        lines = [ln for ln in scraped.splitlines() if ln.startswith("mcp_bpf_first_byte_latency_samples{")]
        assert any('service_port="8090"' in ln and ln.endswith(" 3.0") for ln in lines), scraped[-2000:]
    finally:
        mcpctl("detach", "-i", pair.server_if, netns=ns)
        srv.close()
    r = mcpctl("latency", "-i", pair.server_if, "--seconds", "0.1", netns=ns)
    assert r.returncode == 1 and "no latency sampler attached" in r.stderr


def test_two_namespaces_lo_get_their_own_pin_dirs_when_pid_1s_namespace_is_unreadable(monkeypatch):
    """/proc/1/ns/net raising PermissionError (hidepid, a PID namespace) once put every
    namespace's `lo` in one pin directory: attaching in one replaced the other's."""
    require_bpf()
    remove_stale_namespaces()
    real_stat = os.stat

    def hidden(path, *a, **kw):
        if str(path) == "/proc/1/ns/net":
            raise PermissionError(13, "Permission denied", path)
        return real_stat(path, *a, **kw)
    monkeypatch.setattr(attach.os, "stat", hidden)
    a, b = VethPair().create(), VethPair().create()
    try:
        dirs = []
        for p in (a, b):
            with in_netns(p.client_ns):
                attach.attach("lo", build_policy(ports=["9100=34"]))
                dirs.append(attach.pin_dir("lo"))
                assert os.path.isdir(dirs[-1])
        assert dirs[0] != dirs[1]
        for p, d in zip((a, b), dirs):          # each namespace still finds its own attachment
            with in_netns(p.client_ns):
                assert attach.pin_dir("lo") == d and attach.status("lo")[0]["ports"] == {9100: 34}
                assert attach.detach("lo")
                assert not os.path.exists(d)
    finally:
        for p in (a, b):
            with in_netns(p.client_ns):
                attach.detach("lo")
            p.remove()
