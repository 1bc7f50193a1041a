"""Shared pytest set-up. The helpers tests use (Envoy, the control plane,
upstreams, ports, certificates) are the installed `harness` package."""
