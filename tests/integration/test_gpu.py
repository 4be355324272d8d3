"""GPU pinning, per-child GPU memory caps and CUDA OOM → next rung. Needs a CUDA machine.

Run them with scripts/gpu_check.sh; without CUDA every test here is skipped (CI has no GPU).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from mediafarm.tasks.client import JobHandle, submit

pytestmark = [pytest.mark.gpu, pytest.mark.integration]


def _cuda_available() -> bool:
    # Asked in a subprocess so that the test process itself never initialises CUDA.
    if shutil.which("nvidia-smi") is None:
        return False
    probe = [sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"]
    return subprocess.run(probe, capture_output=True).returncode == 0


if not _cuda_available():
    pytest.skip("no CUDA device (or no CUDA build of torch) on this machine", allow_module_level=True)


@pytest.fixture(scope="module")
def gpu_worker(start_worker):
    return start_worker("gputest", concurrency=2)


def send(ladder: str) -> JobHandle:
    return submit("chaos", queue="gputest", ladder=ladder)


def test_children_see_only_the_pools_gpu_and_the_main_process_no_cuda(gpu_worker) -> None:
    from mediafarm.tasks.app import app

    reports = [send("gpu_report").wait(timeout=120)["output"] for _ in range(4)]
    for report in reports:
        assert report["cuda_visible_devices"] == "0" and report["device_count"] == 1, report
    [reply] = app.control.broadcast("farm_main_process", destination=[gpu_worker.node], reply=True, timeout=5)
    main = reply[gpu_worker.node]
    assert main["torch_imported"] is False and main["cuda_initialized"] is False
    print("GPU children:", {r["pid"]: r["device_name"] for r in reports})


def test_cuda_oom_past_the_memory_fraction_moves_down_a_rung(gpu_worker) -> None:
    envelope = send("cuda_oom").wait(timeout=120)
    first, second = envelope["attempts"]
    assert first["outcome"] == "cuda_oom" and "CUDA out of memory" in first["reason"], first
    assert second["outcome"] == "ok" and envelope["variant"] == "cpu-small"
    assert gpu_worker.process.poll() is None
    print("CUDA OOM reason:", first["reason"][:200])
