"""A test-only job family whose engines misbehave on purpose, run through the real FarmTask machinery.

Registered through FARM_FAMILY_MODULES (tests/conftest.py), like any operator's family. A job
names the ladder it runs (``ladder_field``); those ladders are declared in farm-test.toml with
``family = "chaos"``. Nothing here fakes a result: an engine that "hogs" really allocates until
the watchdog kills it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from pydantic import BaseModel, ConfigDict, Field

from mediafarm.config.ladders import rung
from mediafarm.config.limits import TimeLimits
from mediafarm.config.pools import get_pool
from mediafarm.config.settings import get_settings
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.wire.errors import PermanentFailure
from mediafarm.tasks.wire.family import EngineSpec, FamilySpec, NoParams, Params, Request

MB = 1024 * 1024
HERE = "tests.support.chaos"


class ChaosRequest(Request):
    """Attributes: ladder (a declared chaos ladder), plan (engine overrides, e.g. ``{"sleep": 1}``)."""

    ladder: str = "chaos"
    plan: dict[str, Any] = Field(default_factory=dict)


class ChaosResult(BaseModel):
    """Whatever the engine reports (its pid, what it held, what GPU it saw)."""

    model_config = ConfigDict(extra="allow")

    pid: int


class OkParams(Params):
    sleep: float = 0.0


class WeightedParams(OkParams):
    """``weights``: a file the rung needs in the pool's models folder (FARM_MODELS_DIR), so that
    pools told apart by that folder differ in what they can run (the chaos suite's two pools)."""

    weights: str = "chaos-weights.bin"


class HogParams(Params):
    mb: int = 800
    step_mb: int = 25
    hold: float = 30.0


class StubbornParams(Params):
    seconds: float = 30.0


class CudaHogParams(Params):
    times_cap: float = 1.5


def ok(ctx: EngineContext, request: ChaosRequest, params: OkParams) -> ChaosResult:
    # Works in steps and says so after each (ctx.alive), as a real engine's loop does.
    deadline = time.monotonic() + float(request.plan.get("sleep", params.sleep))
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(0.1, left))
        ctx.alive()
    return ChaosResult(pid=os.getpid(), cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))


def hog(ctx: EngineContext, request: ChaosRequest, params: HogParams) -> ChaosResult:
    """Touch ``mb`` MiB in steps (so the watchdog sees RSS grow), then hold it."""
    held = []
    for _ in range(0, params.mb, params.step_mb):
        held.append(bytearray(b"\x01") * (params.step_mb * MB))  # written, so resident, unlike bytearray(n)
        time.sleep(0.01)
    time.sleep(params.hold)
    return ChaosResult(pid=os.getpid(), held_mb=len(held) * params.step_mb)


def stubborn(ctx: EngineContext, request: ChaosRequest, params: StubbornParams) -> ChaosResult:
    """Keep running through the soft time limit, like C code (FFmpeg, CUDA) that a Python signal
    cannot interrupt; only the hard limit can stop it."""
    deadline = time.monotonic() + params.seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.05)
        except SoftTimeLimitExceeded:
            continue
    return ChaosResult(pid=os.getpid())


def import_probe(ctx: EngineContext, request: ChaosRequest, params: OkParams) -> ChaosResult:
    """Import the fork-gate test's module afresh and log, as a child's first use of a lazily
    imported library does (``tests.support.fork_hazard``): it hangs if this child was forked while
    a thread of the worker's main process held that module's import lock or the log's lock."""
    import importlib
    import logging
    import sys

    from tests.support.fork_hazard import TARGET

    sys.modules.pop(TARGET, None)
    importlib.import_module(TARGET)
    logging.getLogger("tests.fork_hazard").warning("child %d imported %s", os.getpid(), TARGET)
    time.sleep(float(request.plan.get("sleep", params.sleep)))
    return ChaosResult(pid=os.getpid())


class HangParams(Params):
    seconds: float = 3600.0


def hang(ctx: EngineContext, request: ChaosRequest, params: HangParams) -> ChaosResult:
    """Never gives a sign of life: a library deadlocked in C, a read that never returns."""
    import threading

    threading.Event().wait(params.seconds)
    return ChaosResult(pid=os.getpid())


def memory_error(ctx: EngineContext, request: ChaosRequest, params: NoParams) -> ChaosResult:
    raise MemoryError("simulated allocation failure of 64 GiB")


def memory_error_while(ctx: EngineContext, request: ChaosRequest, params: NoParams) -> ChaosResult:
    """A MemoryError while the file ``plan.fail_while`` exists: a rung that fails by resource until
    the test heals it (the breaker tests)."""
    flag = request.plan.get("fail_while")
    if flag and os.path.exists(flag):
        raise MemoryError(f"simulated allocation failure while {flag} exists")
    return ChaosResult(pid=os.getpid())


def bad_input(ctx: EngineContext, request: ChaosRequest, params: NoParams) -> ChaosResult:
    # Looked at as long as a steady job runs (``plan.sleep``), so the chaos suite's kills land on
    # bad inputs too.
    time.sleep(float(request.plan.get("sleep", 0.0)))
    raise PermanentFailure("chaos: this input is malformed on purpose")


def cuda_hog(ctx: EngineContext, request: ChaosRequest, params: CudaHogParams) -> ChaosResult:
    """Ask for ``times_cap`` x the child's GPU memory cap: more than the pool's fraction allows but,
    for a fraction <= 0.6, less than the GPU has, so only the cap can refuse it (GPU machines only)."""
    import torch

    from mediafarm.tasks.runtime.gpu import torch_device

    device = torch_device()
    fraction = get_pool(get_settings().pool).gpu_memory_fraction or 1.0
    total = torch.cuda.get_device_properties(0).total_memory
    block = torch.empty(int(params.times_cap * fraction * total), dtype=torch.uint8, device=device)
    return ChaosResult(pid=os.getpid(), allocated=block.numel())


def gpu_report(ctx: EngineContext, request: ChaosRequest, params: NoParams) -> ChaosResult:
    """Which GPUs this child sees, and its per-process memory fraction."""
    import torch

    from mediafarm.tasks.runtime.gpu import torch_device

    torch_device()
    return ChaosResult(
        pid=os.getpid(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        device_count=torch.cuda.device_count(),
        device_name=torch.cuda.get_device_name(0),
    )


FAMILY = FamilySpec(
    name="chaos",
    task_name="farm.test.chaos",
    description="Test-only: engines that allocate, sleep, raise and refuse on purpose",
    request=ChaosRequest,
    result=ChaosResult,
    engines={
        "ok": EngineSpec(f"{HERE}:ok", OkParams),
        # A stand-in that answers nothing, as VAD's skip: a fallback (tasks.runtime.ladder_choice).
        "stand_in": EngineSpec(f"{HERE}:ok", OkParams, fallback=True),
        "hog": EngineSpec(f"{HERE}:hog", HogParams),
        "ok_weighted": EngineSpec(f"{HERE}:ok", WeightedParams, weights="weights"),
        "memory_error_weighted": EngineSpec(f"{HERE}:memory_error", WeightedParams, weights="weights"),
        "memory_error": EngineSpec(f"{HERE}:memory_error"),
        "import_probe": EngineSpec(f"{HERE}:import_probe", OkParams),
        "hang": EngineSpec(f"{HERE}:hang", HangParams),
        "memory_error_while": EngineSpec(f"{HERE}:memory_error_while"),
        "stubborn": EngineSpec(f"{HERE}:stubborn", StubbornParams),
        "bad_input": EngineSpec(f"{HERE}:bad_input"),
        "needs_missing": EngineSpec(f"{HERE}:ok", OkParams, needs=("a_package_that_is_not_installed",)),
        "cuda_hog": EngineSpec(f"{HERE}:cuda_hog", CudaHogParams, needs=("torch",)),
        "gpu_report": EngineSpec(f"{HERE}:gpu_report", needs=("torch",)),
    },
    ladder=(rung("ok", "ok"),),
    limits=TimeLimits(soft=60, hard=90),
    cli_argument=None,
    ladder_field="ladder",
    # Only the test pools that name the chaos queues run it: its engines need their small caps.
    in_default_pools=False,
)
