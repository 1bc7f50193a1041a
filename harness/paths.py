"""Where the checkout's files are: the one place tests, the harness and the demo look them up.

The package is installed editable (`make install`), so these are the files of
the checkout it was installed from. What needs them:

- EXAMPLES: the operator's istio-manifests/examples (the demo's inference pool
  is examples/inference-pool.yaml).
- HEADER_CONTRACT_WASM: the header-contract filter `make wasm` builds; a step
  or test that needs it skips, with that reason, when it is not built.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "istio-manifests" / "examples"
HEADER_CONTRACT_WASM = ROOT / "wasm-filters" / "build" / "header_contract.wasm"
CONSOLE = ROOT / "xds-server" / "console"
