"""`mcpctl demo` (`make demo`): the mesh end to end on this machine, then a summary.

    framework.py   Demo (ports, processes, config writes, waits), Check, Step
    cli.py         the flags, running the steps, the summary table, --serve
    steps/         one module per step, found without a list (steps/__init__.py)
    manifests/     the config the demo serves first (config/) and its routing changes (steps/)

A part of its own: it drives the other parts as subprocesses and over the wire,
with the harness tests use (harness.xds, harness.upstreams, harness.grpcweb, ...).
To add a step, see README.md.
"""
