"""Where the checkout's own files are, for tests and benchmarks that read them.

The shipped parts find their files through their packages, in a checkout and in
an installed wheel alike: the built filter is `mcp26.wasm.HEADER_CONTRACT_WASM`,
the operator's manifests `mcp26.manifests.EXAMPLES` / `CRDS` / `ADMISSION`.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSOLE = ROOT / "xds-server" / "console"
TEST_DATA = ROOT / "tests" / "data"          # fixture files tests share (manifests, plugins)


def checkout_examples(into: Path) -> Path:
    """A copy of the operator's examples whose WasmPlugin url names this checkout's build of the
    module, not the image's path (mcp26.manifests.WASM_MODULE_URL): what `validate` reads here."""
    from mcp26.manifests import EXAMPLES, WASM_MODULE_URL
    from mcp26.wasm import HEADER_CONTRACT_WASM
    into.mkdir(parents=True, exist_ok=True)
    for src in sorted(EXAMPLES.glob("*.yaml")):
        (into / src.name).write_text(src.read_text().replace(WASM_MODULE_URL, HEADER_CONTRACT_WASM.as_uri()))
    return into
