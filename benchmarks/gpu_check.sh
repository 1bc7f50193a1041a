#!/usr/bin/env bash
# The GPU path, on a machine with an NVIDIA GPU, in under 10 minutes: install `.[gpu]`
# (onnxruntime-gpu + tensorrt) into a venv of its own, then benchmarks/gpu_check.py
# (providers, TensorRT engine cache, I/O binding, CUDA graphs, batching and priority
# benchmarks on the GPU), which prints one table.
#
#   bash benchmarks/gpu_check.sh            # GPU_VENV=DIR to choose the venv (default .cache/gpu-venv)
#
# Without a GPU it says so and exits 0. Where PyPI cannot be reached (an air-gapped GPU
# node), either GPU_PYTHON=PATH names a Python with onnxruntime-gpu and the project's
# dependencies installed, or GPU_WHEELS=DIR names a wheelhouse (onnxruntime-gpu and what the
# machine's python3 lacks of the project's dependencies): they and the project are installed
# with --no-index into a folder put first on that python3's path, so the CUDA libraries
# already beside it (nvidia-* wheels) are the ones used.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi finds none); nothing to check"
    exit 0
fi
nvidia-smi -L
VENV=${GPU_VENV:-.cache/gpu-venv}
PY=${GPU_PYTHON:-}
if [ -n "${GPU_WHEELS:-}" ]; then
    PY=${PY:-python3}
    TARGET=${GPU_TARGET:-.cache/gpu-site}
    rm -rf "$TARGET"
    if ls "$GPU_WHEELS"/*.part1 >/dev/null 2>&1; then        # gpu_wheelhouse --split-mb cut it
        echo "gpu_check: $GPU_WHEELS holds a wheel in parts: cat NAME.whl.part* > NAME.whl && sha256sum -c NAME.whl.sha256 first" >&2
        exit 1
    fi
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$TARGET" "$GPU_WHEELS"/*.whl \
        && "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$TARGET" .; then
        echo "installed the wheels of $GPU_WHEELS and the project into $TARGET for $PY"
    else
        echo "gpu_check: installing from $GPU_WHEELS failed" >&2
        exit 1
    fi
    export PYTHONPATH="$(realpath "$TARGET")${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$(realpath "$TARGET")/bin:$PATH"     # its mcpctl and mcp-bench
elif [ -z "$PY" ]; then
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
# Every folder of them (CUDA 13's wheels keep theirs in nvidia/cu13/lib, 12's in nvidia/NAME/lib).
LIBS=$(find "$SITE"/tensorrt_libs "$SITE"/nvidia -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${LIBS}${LD_LIBRARY_PATH:-}"
case "$PY" in */*) export PATH="$(dirname "$PY"):$PATH" ;; esac     # a venv's mcpctl and mcp-bench
timeout 540 "$PY" -m benchmarks.gpu_check
