"""What an operator applies (README.md): CRDs, admission policies, examples. Shipped in the
wheel as package data (`mcp26.manifests`), so the demo and `mcpctl` find them outside a checkout."""
from pathlib import Path

HERE = Path(__file__).resolve().parent
CRDS = HERE / "crds"
ADMISSION = HERE / "admission"
EXAMPLES = HERE / "examples"

# Where the image (Containerfile) installs the header-contract Wasm module; the examples name it
# so (a checkout's build is wasm-filters/build/: harness.paths.checkout_examples maps the one to the other).
WASM_MODULE_URL = "file:///var/lib/mcp-mesh/wasm/header_contract.wasm"
