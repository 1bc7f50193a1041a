"""Three echo upstreams answering v1, v2, v3: the reviews service's endpoints."""
from mcp26.demo.framework import Check, Demo, Step
from mcp26.demo.stack.upstreams import EchoUpstream


def run(demo: Demo) -> list[Check]:
    for version, port in demo.upstream_ports.items():
        demo.upstreams.append(EchoUpstream(version, port).start())
        print(f"  upstream {version} on 127.0.0.1:{port}")
    return []


STEP = Step(10, "sample upstreams v1 v2 v3", run)
