#!/usr/bin/env bash
# The checks that need a GPU (benchmarks/gpu_check.py says what they compare). A few minutes; run from the repo
# root on a machine with one or more CUDA GPUs and a CUDA build of torch 2.13:
#   bash benchmarks/gpu_check.sh   → prints the comparison and writes benchmarks/results/gpu_check.json
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
test -x "$PY" || PY=python3
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device (torch ' + torch.__version__ + ')')"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
mkdir -p benchmarks/results
"$PY" benchmarks/gpu_check.py
"$PY" benchmarks/gpu_check.py --json > benchmarks/results/gpu_check.json
