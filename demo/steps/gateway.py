"""The gateway Envoy (`mcpctl envoy run`, label istio=ingressgateway) fed over ADS."""
import urllib.request

from mcp26.demo.framework import GATEWAY_NODE, Check, Demo, Step


def run(demo: Demo) -> list[Check]:
    demo.start("envoy", [demo.mcpctl, "envoy", "run", "--node-id", GATEWAY_NODE,
                         "--cluster", "demo-gateway", "--xds-address", demo.control_plane.address,
                         "--admin-port", str(demo.envoy_admin_port), "--label", "istio=ingressgateway",
                         "--bootstrap-path", str(demo.workdir / "envoy-bootstrap.yaml")]
               + (["--delta"] if demo.args.delta else []))

    def ready():
        with urllib.request.urlopen(f"http://127.0.0.1:{demo.envoy_admin_port}/ready", timeout=2) as r:
            return r.status == 200
    demo.wait("Envoy to be ready", ready)
    demo.wait_synced()
    print(f"  Envoy gateway on 127.0.0.1:{demo.gateway_port} ({'Delta' if demo.args.delta else 'SotW'} ADS),"
          f" admin http://127.0.0.1:{demo.envoy_admin_port}")
    return [Check("gateway synced", "CDS EDS LDS RDS SYNCED", "SYNCED", True)]


STEP = Step(30, "gateway Envoy over ADS", run)
