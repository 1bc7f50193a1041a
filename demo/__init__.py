"""`mcpctl demo` (`make demo`): the mesh end to end on this machine, then a summary.

    framework.py   Demo (ports, processes, config writes, waits), Check, Step
    cli.py         the flags, running the steps, the summary table, --serve
    stack/         the local stack: a real Envoy, the control plane, a model server and echo
                   upstreams on loopback, free ports, JWTs, a gRPC-Web client (tests and
                   benchmarks use it too, through the checkout's harness)
    steps/         one module per step, found without a list (steps/__init__.py)
    manifests/     the config the demo serves first (config/) and its routing changes (steps/)

A part of its own: it drives the other parts as subprocesses and over the wire.
To add a step, see README.md.
"""
