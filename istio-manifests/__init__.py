"""What an operator applies (README.md): CRDs, admission policies, examples. Shipped in the
wheel as package data (`mcp26.manifests`), so the demo and `mcpctl` find them outside a checkout."""
from pathlib import Path

HERE = Path(__file__).resolve().parent
CRDS = HERE / "crds"
ADMISSION = HERE / "admission"
EXAMPLES = HERE / "examples"
