"""Policy plugins: Python policies compiled to Wasm components (componentize-py) and run in a
sandbox by wasmtime (scheduler/README.md, "Policy plugins").

  wit/policy.wit      the world mcp:scheduler/policy: exports decide/score (the records encoded as
                      one string each way), imports WASI-NN-shaped inference, log and a clock
  convert.py          scheduler.decisions dataclasses <-> the encoding mcp-policy-json/1
  inference.py        the WASI-NN import, implemented with ONNX Runtime
  sandbox.py          engine, limits (fuel, epoch deadline, memory), one instantiated plugin
  compiled_cache.py   compiled components serialized to disk
  build.py            componentize-py: FILE.py -> component
  host.py             PolicyHost: what the decision loop and the Endpoint Picker call; hot swap
  policies/           the built-in default (the seed's decision table) and an ONNX-scoring example
"""
