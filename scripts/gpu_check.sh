#!/usr/bin/env bash
# GPU checks for a machine with CUDA: per-child GPU pinning, the main process never touching CUDA,
# a CUDA OOM past the pool's gpu_memory_fraction moving the job one rung down (chaos and YOLO), the
# YOLO GPU rung on CUDA with .pt weights, whisper-large (faster-whisper, float16) on CUDA, and a
# printed YOLO frames/s on CUDA vs the CPU ONNX rung. Prints what it saw; nvidia-smi again at the end.
#   bash scripts/gpu_check.sh            (after the README's test set-up, with a CUDA build of torch)
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv
PY=${PYTHON:-.venv/bin/python}
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
# What the YOLO and subtitle checks lean on (versions read without importing ultralytics, which
# would probe the network), and whether CTranslate2's own CUDA build sees the GPU.
"$PY" - <<'PYEOF' || true
from importlib.metadata import PackageNotFoundError, version
for name in ("ultralytics", "onnxruntime", "faster-whisper", "ctranslate2", "transformers"):
    try:
        print(name, version(name))
    except PackageNotFoundError:
        print(name, "NOT INSTALLED")
try:
    import ctranslate2
    print("ctranslate2 cuda devices", ctranslate2.get_cuda_device_count(),
          "compute types", sorted(ctranslate2.get_supported_compute_types("cuda")))
except Exception as exc:  # noqa: BLE001 - said, not raised: the subtitle test shows what it means
    print("ctranslate2 cannot use CUDA here:", type(exc).__name__, exc)
PYEOF
status=0
"$PY" -m pytest tests/integration/test_gpu.py -m gpu -v -s -rs -p no:cacheprovider || status=$?
nvidia-smi
exit "$status"
