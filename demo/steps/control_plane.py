"""The control plane (`mcpctl xds serve`) watching a copy of manifests/config/."""
from mcp26.demo.framework import Check, Demo, Step


def run(demo: Demo) -> list[Check]:
    for f in sorted((demo.manifests / "config").glob("*.yaml")):
        demo.write_config(f.name, demo.manifest(f"config/{f.name}"))
    cp = demo.control_plane.start()
    demo.adopt("control-plane", cp.proc, cp.log_path)
    health = cp.healthz()
    print(f"  mcpctl xds serve: ADS 127.0.0.1:{cp.port}, admin http://127.0.0.1:{cp.admin_port}/debug/syncz,"
          f" watching {demo.config_dir}")
    return [Check("config loaded", "a good config", health["generation"] or "none", bool(health["config_loaded"]))]


STEP = Step(20, "control plane", run)
