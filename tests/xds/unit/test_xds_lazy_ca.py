"""A control plane without a mesh CA does not load cryptography (~9 MB resident, idle RSS).

Run in a fresh interpreter: the test process itself may have imported it already.
"""
import json
import subprocess
import sys

PROBE = r"""
import json, sys
from mcp26.mesh.cli import build_parser
from mcp26.xds.cli import _identity
from mcp26.xds.server import XdsServer
args = build_parser().parse_args(["xds", "serve", "--config-dir", sys.argv[1], *sys.argv[2:]])
identity = _identity(args)
server = XdsServer(sys.argv[1], identity=identity)
certs = identity.debug_certs()
print(json.dumps({"loaded": "cryptography" in sys.modules, "root": len(certs["root"]),
                  "ttl": certs["workload_cert_ttl_s"]}))
"""


def probe(tmp_path, *flags) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path), *flags],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_no_ca_no_cryptography(tmp_path):
    got = probe(tmp_path)
    assert got == {"loaded": False, "root": 0, "ttl": None}


def test_with_a_ca_it_is_loaded_and_describes_the_root(tmp_path):
    got = probe(tmp_path, "--ca-dir", str(tmp_path / "ca"), "--workload-cert-ttl", "1h")
    assert got == {"loaded": True, "root": 1, "ttl": 3600.0}
