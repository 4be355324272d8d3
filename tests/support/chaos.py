"""A test-only job family whose engines misbehave on purpose, run through the real FarmTask machinery.

Workers load it with ``--include tests.support.chaos``; ladders are declared in farm-test.toml.
Nothing here fakes a result: an engine that "hogs" really allocates until the watchdog kills it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from config.ladders import Variant
from config.queues import time_limits
from tasks.app import app
from tasks.base import FarmTask
from tasks.engines import Engine, register_engine
from tasks.errors import PermanentFailure

MB = 1024 * 1024


def ok(plan: dict[str, Any], sleep: float = 0.0) -> dict[str, Any]:
    seconds = float(plan.get("sleep", sleep))
    if seconds:
        time.sleep(seconds)
    return {"pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def hog(plan: dict[str, Any], mb: int = 800, step_mb: int = 25, hold: float = 30.0) -> dict[str, Any]:
    """Touch ``mb`` MiB in steps (so the watchdog sees RSS grow), then hold it."""
    held = []
    for _ in range(0, mb, step_mb):
        held.append(bytearray(b"\x01") * (step_mb * MB))  # written, so resident, unlike bytearray(n)
        time.sleep(0.01)
    time.sleep(hold)
    return {"pid": os.getpid(), "held_mb": len(held) * step_mb}


def stubborn(plan: dict[str, Any], seconds: float = 30.0) -> dict[str, Any]:
    """Keep running through the soft time limit, like C code (FFmpeg, CUDA) that a Python signal
    cannot interrupt; only the hard limit can stop it."""
    from celery.exceptions import SoftTimeLimitExceeded

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.05)
        except SoftTimeLimitExceeded:
            continue
    return {"pid": os.getpid()}


def memory_error(plan: dict[str, Any]) -> dict[str, Any]:
    raise MemoryError("simulated allocation failure of 64 GiB")


def bad_input(plan: dict[str, Any]) -> dict[str, Any]:
    raise PermanentFailure("chaos: this input is malformed on purpose")


def cuda_hog(plan: dict[str, Any], times_cap: float = 1.5) -> dict[str, Any]:
    """Ask for ``times_cap`` x the child's GPU memory cap: more than the pool's fraction allows but,
    for a fraction <= 0.6, less than the GPU has, so only the cap can refuse it (GPU machines only)."""
    import torch

    from config.pools import get_pool
    from config.settings import get_settings
    from tasks.engines.gpu import torch_device

    device = torch_device()
    fraction = get_pool(get_settings().pool).gpu_memory_fraction or 1.0
    total = torch.cuda.get_device_properties(0).total_memory
    block = torch.empty(int(times_cap * fraction * total), dtype=torch.uint8, device=device)
    return {"allocated": block.numel()}


def gpu_report(plan: dict[str, Any]) -> dict[str, Any]:
    """Which GPUs this child sees, and its per-process memory fraction."""
    import torch

    from tasks.engines.gpu import torch_device

    torch_device()
    return {
        "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device_count": torch.cuda.device_count(),
        "device_name": torch.cuda.get_device_name(0),
    }


for _name, _target, _needs in (
    ("ok", "ok", ()),
    ("hog", "hog", ()),
    ("memory_error", "memory_error", ()),
    ("stubborn", "stubborn", ()),
    ("bad_input", "bad_input", ()),
    ("needs_missing", "ok", ("a_package_that_is_not_installed",)),
    ("cuda_hog", "cuda_hog", ("torch",)),
    ("gpu_report", "gpu_report", ("torch",)),
):
    register_engine(_name, Engine(f"tests.support.chaos:{_target}", needs=_needs))


@app.task(
    bind=True, base=FarmTask, name="farm.test.chaos", family="chaos", max_retries=10, default_retry_delay=0,
    soft_time_limit=time_limits()["chaos"].soft, farm_hard_limit=time_limits()["chaos"].hard, queue="chaos",
)  # fmt: skip
def chaos(self: FarmTask, ladder: str, plan: dict[str, Any] | None = None) -> dict[str, Any]:
    def run_variant(variant: Variant, engine: Callable[..., Any]) -> dict[str, Any]:
        return engine(plan or {}, **variant.params)

    return self.run_job(run_variant, ladder=ladder)
