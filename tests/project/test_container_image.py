"""The Containerfile builds an image that runs `mcpctl version`, the control plane and a model
server under `podman run` on loopback.

No image registry is reachable here, so the base is a Debian 12 root filesystem made by
`debootstrap` (cached under .cache/debian-rootfs; a first run takes minutes) and imported, and
passed as the recipe's BASE_IMAGE. The build itself installs Debian packages and wheels from
their registries. It needs root, podman and debootstrap (Debian's packages; `make install` does
not install them: the build costs ~10 minutes and ~1 GB), and runs only with
MCP_CONTAINER_TESTS=1, saying so otherwise.
"""
import json
import os
import shutil
import subprocess
import time
import urllib.request

import pytest

from harness.paths import ROOT
from mcp26.demo.stack.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]   # a first build: debootstrap and image, minutes

BASE = "localhost/mcp-debian:bookworm"
IMAGE = "localhost/mcp-mesh:test"
ROOTFS = ROOT / ".cache" / "debian-rootfs"


def _why_not() -> str:
    if os.environ.get("MCP_CONTAINER_TESTS") != "1":
        return "set MCP_CONTAINER_TESTS=1 to build the image (minutes, ~1 GB: a debootstrap and a podman build)"
    if os.geteuid() != 0:
        return "needs root (debootstrap, podman)"
    for tool in ("podman", "debootstrap"):
        if not shutil.which(tool):
            return f"no {tool}: apt-get install podman buildah debootstrap"
    return ""


def sh(*argv, timeout=1800, check=True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


@pytest.fixture(scope="module")
def image():
    why = _why_not()
    if why:
        pytest.skip(why)
    if sh("podman", "image", "exists", BASE, check=False).returncode != 0:
        if not (ROOTFS / "usr" / "bin" / "apt-get").exists():
            shutil.rmtree(ROOTFS, ignore_errors=True)
            sh("debootstrap", "--variant=minbase", "--include=ca-certificates", "bookworm", str(ROOTFS),
               "http://deb.debian.org/debian")
        tar = subprocess.Popen(["tar", "-C", str(ROOTFS), "-c", "."], stdout=subprocess.PIPE)
        sh("podman", "import", "--change", "CMD=/bin/bash", "-", BASE, stdin=tar.stdout)
        tar.wait()
    # chroot isolation: the build's RUN steps need no OCI runtime (see Runner).
    # The host's CA bundle: registries may be reached through a TLS-inspecting proxy it trusts.
    sh("podman", "build", "--isolation", "chroot", "--network", "host", "--build-arg", f"BASE_IMAGE={BASE}",
       "-v", "/etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro", "--build-arg", "CA_BUNDLE=/run/host-ca.crt",
       "-t", IMAGE, "-f", str(ROOT / "Containerfile"), str(ROOT))
    return IMAGE


class Runner:
    """`podman run --network host`, or, where the OCI runtime cannot start a container (a VM
    whose cgroups are hybrid and whose root may not set RLIMIT_NPROC: crun and runc both
    refuse), the same image's entrypoint under `buildah run --isolation chroot`: the image's
    filesystem, user, environment and entrypoint, on the host's network."""

    def __init__(self, image: str):
        self.image = image
        probe = sh("podman", "run", "--rm", "--network", "host", image, check=False, timeout=120)
        self.podman = probe.returncode == 0
        self.why = "" if self.podman else probe.stderr.strip().splitlines()[-1]
        self.containers: list[str] = []
        self.procs: list[subprocess.Popen] = []

    def argv(self, args, volumes=()) -> list[str]:
        if self.podman:
            return ["podman", "run", "--rm", "--network", "host", *(x for v in volumes for x in ("-v", v)),
                    self.image, *args]
        c = sh("buildah", "from", self.image).stdout.strip().splitlines()[-1]
        self.containers.append(c)
        entry = json.loads(sh("podman", "image", "inspect", self.image).stdout)[0]["Config"]["Entrypoint"]
        return ["buildah", "run", "--isolation", "chroot", "--network", "host",
                *(x for v in volumes for x in ("-v", v)), c, "--", *entry, *args]

    def run(self, *args, volumes=()) -> subprocess.CompletedProcess:
        return sh(*self.argv(args, volumes), timeout=300)

    def start(self, *args, volumes=()) -> subprocess.Popen:
        p = subprocess.Popen(self.argv(args, volumes), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, 15)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)
                    p.wait()
        for c in self.containers:
            sh("buildah", "rm", c, check=False, timeout=60)


def wait_http(url: str, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                return r.status, r.read()
        except OSError:
            assert time.monotonic() < deadline, f"{url} did not answer"
            time.sleep(0.5)


def test_the_image_runs_version_the_control_plane_and_a_model_server(image, tmp_path):
    r = Runner(image)
    if not r.podman:
        print(f"podman run cannot start a container here ({r.why}); running the image under buildah's chroot")
    try:
        out = r.run("version")
        assert out.stdout.startswith("mcpctl ") and "python 3.11" in out.stdout, out.stdout
        # The examples, shipped in the wheel, name the module where the image put it.
        out = r.run("validate", "/opt/mcp-mesh/lib/python3.11/site-packages/mcp26/manifests/examples")
        assert "No validation issues found" in out.stdout, out.stdout + out.stderr
        config = tmp_path / "config"
        config.mkdir()
        config.chmod(0o755)
        tmp_path.chmod(0o755)
        (config / "se.yaml").write_text(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: m, namespace: default}\n"
            "spec: {hosts: [m.example.com], ports: [{number: 80, name: http, protocol: HTTP}], resolution: STATIC,\n"
            "       endpoints: [{address: 127.0.0.1}]}\n")
        (config / "se.yaml").chmod(0o644)
        ads, admin = free_port(), free_port()
        r.start("xds", "serve", "--config-dir=/config", f"--port={ads}", f"--admin-port={admin}",
                volumes=[f"{config}:/config:ro"])
        status, body = wait_http(f"http://127.0.0.1:{admin}/healthz")
        assert status == 200 and json.loads(body)["config_loaded"] is True
        http, grpc_port = free_port(), free_port()
        r.start("serve", "--model=builtin:mlp", f"--http-port={http}", f"--grpc-port={grpc_port}")
        assert wait_http(f"http://127.0.0.1:{http}/v2/health/ready", timeout=180)[0] == 200
        req = urllib.request.Request(f"http://127.0.0.1:{http}/v2/models/mlp/infer", method="POST", data=json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            out = json.loads(resp.read())
        assert out["outputs"][0]["shape"] == [1, 16]
    finally:
        r.close()
