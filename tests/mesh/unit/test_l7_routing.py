"""The seed's L7SchedulingPolicy routing fields (mesh/l7_routing.py): the priority -> class table,
and `mcpctl validate` on the seed's example and on hostile objects (each refusal names the file,
line, resource and field; the admission policy's agreement is test_mesh_manifests.py)."""
import pytest

from mcp26.manifests import EXAMPLES
from mcp26.mesh.l7_routing import PRIORITY_BANDS, class_for_priority
from mcp26.mesh.qos import LLM_PRIORITY_CLASSES, QosClass

HEAD = """apiVersion: scheduling.mcp-mesh.io/v1alpha1
kind: L7SchedulingPolicy
metadata: {name: p, namespace: inference}
spec:
"""


def test_priority_bands_cover_0_to_100_and_name_the_seeds_classes():
    got = {p: class_for_priority(p) for p in range(101)}
    assert got[100] is got[75] is QosClass.LATENCY_CRITICAL is LLM_PRIORITY_CLASSES["critical"]
    assert got[74] is got[50] is LLM_PRIORITY_CLASSES["high"]
    assert got[49] is got[25] is LLM_PRIORITY_CLASSES["medium"]
    assert got[24] is got[0] is LLM_PRIORITY_CLASSES["low"]
    assert [c for _, c in PRIORITY_BANDS] == sorted(QosClass, key=lambda c: c.priority_level)
    for bad in (-1, 101, True, 50.0, "50", None):
        with pytest.raises(ValueError, match=r"\[0, 100\]"):
            class_for_priority(bad)


def test_the_seeds_example_validates(mcpctl):
    r = mcpctl("validate", str(EXAMPLES / "l7-routing.yaml"))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.adversarial
@pytest.mark.parametrize("spec, field, says", [
    ("  priority: 101\n  matchHeaders: {x-a: '1'}\n  backendService: llm\n", "spec.priority", "[0, 100]"),
    ("  priority: [1, 2]\n  matchHeaders: {x-a: '1'}\n  backendService: llm\n", "spec.priority", "[0, 100]"),
    ("  priority: 50\n  matchHeaders: {'x a': '1'}\n  backendService: llm\n", "spec.matchHeaders.x a", "RFC 7230"),
    ("  priority: 50\n  matchHeaders: {x-a: {nested: {deep: 1}}}\n  backendService: llm\n",
     "spec.matchHeaders.x-a", "must be a string"),
    ("  priority: 50\n  matchHeaders: {x-mcp-qos-class: latency-critical}\n  backendService: llm\n",
     "spec.matchHeaders.x-mcp-qos-class", "the mesh sets"),
    ("  priority: 50\n  matchHeaders: {x-a: '" + "v" * 5000 + "'}\n  backendService: llm\n",
     "spec.matchHeaders.x-a", "longer than 1024"),
    ("  priority: 50\n  matchHeaders: {" + ", ".join(f"x-{i}: '1'" for i in range(500)) + "}\n  backendService: llm\n",
     "spec.matchHeaders", "at most 16"),
    ("  priority: 50\n  matchHeaders: {x-a: '1'}\n  backendService: 'llm; rm -rf /'\n", "spec.backendService", "DNS-1123"),
    ("  priority: 50\n  matchHeaders: {x-a: '1'}\n", "spec.backendService", "required with"),
    ("  priority: 50\n  matchHeaders: {x-a: '1'}\n  backendService: llm\n  classWeights: {latency-critical: 9}\n",
     "spec.classWeights.latency-critical", "strict"),
])
def test_bad_routing_fields_are_refused_naming_file_line_resource_and_field(mcpctl, tmp_path, spec, field, says):
    f = tmp_path / "policy.yaml"
    f.write_text(HEAD + spec)
    r = mcpctl("validate", str(f))
    assert r.returncode != 0
    line = next(ln for ln in (r.stdout + r.stderr).splitlines() if f"{field}:" in ln)
    assert f"{f}:" in line and "L7SchedulingPolicy/inference/p" in line and says in line, line
