"""`mcpctl proxy-status`: the gateway SYNCED for every type, as istioctl shows it."""
import subprocess

from mcp26.demo.framework import GATEWAY_NODE, Check, Demo, Step


def run(demo: Demo) -> list[Check]:
    out = subprocess.run([demo.mcpctl, "proxy-status", "--control-plane", f"127.0.0.1:{demo.admin_port}"],
                         capture_output=True, text=True, timeout=30)
    print("  " + out.stdout.strip().replace("\n", "\n  "))
    return [Check("proxy-status", "gateway SYNCED", "SYNCED" if "SYNCED" in out.stdout else out.stdout.strip()[:40],
                  out.returncode == 0 and GATEWAY_NODE in out.stdout and "NACKED" not in out.stdout)]


STEP = Step(100, "proxy-status", run)
