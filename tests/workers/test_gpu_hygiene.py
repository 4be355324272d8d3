"""Allocator hygiene: the CUDA fragmentation index and its threshold (stats dicts shaped as
torch.cuda.memory_stats() returns them; no GPU here), and MALLOC_ARENA_MAX set where glibc reads it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import os
import subprocess
import sys

import pytest

from mediafarm.config.file import ConfigFileError
from mediafarm.config.pools import Pool
from mediafarm.workers.gpu_hygiene import decide, fragmentation
from mediafarm.workers.launch import pool_environment

GB = 1024**3


def stats(reserved: float, inactive_split: float) -> dict[str, int]:
    # A few of the keys torch.cuda.memory_stats() returns, under their real names.
    return {
        "reserved_bytes.all.current": int(reserved),
        "inactive_split_bytes.all.current": int(inactive_split),
        "allocated_bytes.all.current": int(reserved - inactive_split),
        "num_alloc_retries": 0,
    }


def test_fragmentation_is_inactive_split_over_reserved() -> None:
    assert fragmentation(stats(4 * GB, 1 * GB)) == 0.25
    assert fragmentation(stats(0, 0)) is None  # nothing cached: no index
    assert fragmentation({}) is None


def test_above_the_limit_the_cache_is_emptied_and_the_child_recycled_if_that_was_not_enough() -> None:
    emptied: list[bool] = []
    # Below the limit: nothing done.
    verdict = decide(stats(4 * GB, 0.4 * GB), 0.3, lambda: emptied.append(True), lambda: stats(0, 0))
    assert (verdict.action, emptied) == ("keep", [])
    # Above it, and emptying the cache hands the split segments back: enough.
    verdict = decide(stats(4 * GB, 2 * GB), 0.3, lambda: emptied.append(True), lambda: stats(2 * GB, 0.1 * GB))
    assert (verdict.action, verdict.before, emptied) == ("empty_cache", 0.5, [True])
    assert verdict.after == pytest.approx(0.05)
    # Still above after emptying (live blocks keep the segments split): recycle the child.
    verdict = decide(stats(4 * GB, 2 * GB), 0.3, lambda: emptied.append(True), lambda: stats(3 * GB, 1.5 * GB))
    assert (verdict.action, verdict.after) == ("recycle", 0.5)
    # No limit: measured only.
    assert decide(stats(4 * GB, 3 * GB), None, lambda: emptied.append(True), dict).action == "keep"
    assert len(emptied) == 2


def test_malloc_arena_max_is_in_the_workers_environment_from_its_pool() -> None:
    pool = Pool("p", queues=("q",))
    assert pool.malloc_arena_max == 2
    assert pool_environment(pool, {"MALLOC_ARENA_MAX": "8"})["MALLOC_ARENA_MAX"] == "2"  # the pool decides
    for glibc_default in (None, 0):  # 0: what a TOML table can say
        pool_env = pool_environment(Pool("p", queues=("q",), malloc_arena_max=glibc_default), {"MALLOC_ARENA_MAX": "2"})
        assert "MALLOC_ARENA_MAX" not in pool_env
    with pytest.raises(ConfigFileError, match="malloc_arena_max"):
        Pool("p", queues=("q",), malloc_arena_max=-1)
    with pytest.raises(ConfigFileError, match="gpu_fragmentation_limit"):
        Pool("p", queues=("q",), gpu_fragmentation_limit=1.5)
    # glibc reads it at process start: a process started with that environment has it.
    env = pool_environment(pool, dict(os.environ))
    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ['MALLOC_ARENA_MAX'])"], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "2"


def test_gpu_memory_is_read_through_nvml_where_a_driver_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from mediafarm.workers.collectors import GpuMemory

    # Here: nvidia-ml-py is installed, no driver answers: no metric, no error.
    assert list(GpuMemory((0,)).collect()) == []
    # Where one does (the library's own calls, answered as a driver would).
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=(handle + 1) * GB, total=141 * GB),
    )
    with fake_nvml(monkeypatch, fake):
        families = {m.name: m for m in GpuMemory((0, 3)).collect()}
        used = {s.labels["gpu"]: s.value for s in families["mediafarm_gpu_memory_used_bytes"].samples}
        assert used == {"0": 1 * GB, "3": 4 * GB}
        assert {s.value for s in families["mediafarm_gpu_memory_total_bytes"].samples} == {141 * GB}
        assert list(GpuMemory(()).collect()) == []  # a pool without GPUs asks NVML nothing


@contextlib.contextmanager
def fake_nvml(monkeypatch: pytest.MonkeyPatch, fake: object) -> Iterator[None]:
    """``pynvml`` answered by ``fake`` for the block (workers.nvml loads it once per process)."""
    from mediafarm.workers import nvml

    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nvml.nvml.cache_clear()
    try:
        yield
    finally:
        monkeypatch.delitem(sys.modules, "pynvml")
        nvml.nvml.cache_clear()


def test_a_gpu_that_stops_answering_the_driver_is_named_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from mediafarm.workers import nvml

    # Here: no driver answers: nothing is known lost (the start's device check is all there is).
    assert nvml.lost_gpu((0,)) is None

    class NVMLError(Exception):  # pynvml's: the driver's code in .value, its words in str()
        def __init__(self, value: int, words: str) -> None:
            self.value, self.words = value, words

        def __str__(self) -> str:
            return self.words

    answers = {1: NVMLError(15, "GPU is lost"), 2: NVMLError(3, "Not Supported")}

    def handle(index: int) -> int:
        if index in answers:
            raise answers[index]
        return index

    fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=handle,
                                 nvmlDeviceGetUUID=lambda h: f"GPU-{h}", NVML_ERROR_GPU_IS_LOST=15,
                                 NVML_ERROR_INVALID_ARGUMENT=2, NVML_ERROR_NOT_FOUND=6, NVML_ERROR_UNKNOWN=999)  # fmt: skip
    with fake_nvml(monkeypatch, fake):
        assert nvml.lost_gpu((0,)) is None and nvml.lost_gpu(()) is None
        assert nvml.lost_gpu((0, 1)) == "GPU 1 does not answer the driver (NVML: GPU is lost)"
        # An answer that says nothing of the GPU's presence (a query it does not support) is no loss.
        assert nvml.lost_gpu((2,)) is None


@pytest.mark.gpu
def test_a_gpu_present_answers_and_an_index_past_the_devices_is_lost() -> None:
    from mediafarm.workers import nvml

    if nvml.nvml() is None:
        pytest.skip("no NVIDIA driver answers NVML on this machine")
    count = nvml.nvml().nvmlDeviceGetCount()
    assert nvml.lost_gpu(tuple(range(count))) is None
    assert nvml.lost_gpu((count,)).startswith(f"GPU {count} does not answer the driver (NVML: ")


def test_a_pools_gpu_ids_are_numbered_as_nvml_numbers_them() -> None:
    # NVML (the pressure reading, the GPU metrics) and nvidia-smi count in PCI bus order; CUDA
    # counts fastest-first unless told, which on a host with mixed GPUs is another order.
    env = pool_environment(Pool("p", queues=("q",), gpus=(1, 0)), {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    assert env["CUDA_VISIBLE_DEVICES"] == "1,0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
