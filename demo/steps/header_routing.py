"""Header routing (manifests/config/virtualservice.yaml): end-user: jason -> v2, everyone else v1."""
from mcp26.demo.framework import Check, Demo, Step, show_counts
from mcp26.mesh.headers import END_USER


def run(demo: Demo) -> list[Check]:
    with demo.gateway() as gw:
        jason = gw.count(20, {END_USER: "jason"})
        others = gw.count(20)
    print(f"  end-user: jason x20 -> {show_counts(jason)};  no header x20 -> {show_counts(others)}")
    return [Check("end-user: jason", "v2 20", show_counts(jason), jason == {"v2": 20}),
            Check("everyone else", "v1 20", show_counts(others), others == {"v1": 20})]


STEP = Step(40, "header routing", run)
