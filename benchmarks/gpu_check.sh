#!/usr/bin/env bash
# The GPU path, on a machine with an NVIDIA GPU, in under 10 minutes: install `.[gpu]`
# (onnxruntime-gpu + tensorrt) into a venv of its own, then benchmarks/gpu_check.py
# (providers, TensorRT engine cache, I/O binding, CUDA graphs, batching and priority
# benchmarks on the GPU), which prints one table.
#
#   bash benchmarks/gpu_check.sh            # GPU_VENV=DIR to choose the venv (default .cache/gpu-venv)
#
# Without a GPU it says so and exits 0. Where PyPI cannot be reached (a device machine
# without network), it uses the Python it finds with onnxruntime-gpu already installed
# (GPU_PYTHON=PATH), or says what is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi finds none); nothing to check"
    exit 0
fi
nvidia-smi -L
VENV=${GPU_VENV:-.cache/gpu-venv}
PY=${GPU_PYTHON:-}
if [ -z "$PY" ]; then
    python3 -m venv "$VENV" && PY="$VENV/bin/python"
    # The CPU and GPU wheels both provide the `onnxruntime` module: the project's
    # dependency brings the CPU one, so it goes before the GPU one is (re)installed.
    if timeout 420 "$PY" -m pip install -q -e '.[gpu]' \
        && "$PY" -m pip uninstall -q -y onnxruntime \
        && timeout 120 "$PY" -m pip install -q --force-reinstall --no-deps onnxruntime-gpu; then
        echo "installed .[gpu] into $VENV"
    else
        echo "gpu_check: installing .[gpu] failed (no network?); set GPU_PYTHON to a Python with onnxruntime-gpu" >&2
        exit 1
    fi
fi
# TensorRT's and CUDA's libraries from their wheels, for onnxruntime's providers.
SITE=$("$PY" -c 'import site; print(site.getsitepackages()[0])')
LIBS=$(ls -d "$SITE"/tensorrt_libs "$SITE"/nvidia/*/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH="${LIBS}${LD_LIBRARY_PATH:-}"
export PATH="$(dirname "$PY"):$PATH"      # its mcpctl and mcp-bench
timeout 540 "$PY" -m benchmarks.gpu_check
