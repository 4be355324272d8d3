#!/usr/bin/env bash
# GPU checks for a machine with CUDA: per-child GPU pinning, the main process never touching CUDA,
# a CUDA OOM past the pool's gpu_memory_fraction moving the job one rung down. Prints what it saw.
#   bash scripts/gpu_check.sh            (after the README's test set-up, with a CUDA build of torch)
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv
PY=${PYTHON:-.venv/bin/python}
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
"$PY" -m pytest tests/integration/test_gpu.py -m gpu -v -s -p no:cacheprovider
