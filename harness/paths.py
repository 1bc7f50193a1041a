"""Where the checkout's own files are, for tests and benchmarks that read them.

The shipped parts find their files through their packages, in a checkout and in
an installed wheel alike: the built filter is `mcp26.wasm.HEADER_CONTRACT_WASM`,
the operator's manifests `mcp26.manifests.EXAMPLES` / `CRDS` / `ADMISSION`.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSOLE = ROOT / "xds-server" / "console"
TEST_DATA = ROOT / "tests" / "data"          # fixture files tests share (manifests, plugins)
