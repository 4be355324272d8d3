"""NVML (nvidia-ml-py) in a worker's main process: loaded once, and read per GPU.

NVML reads the NVIDIA driver, not CUDA, so the main process stays without a CUDA context (its
children fork from it). It numbers GPUs as the pools declare them (``Pool.gpus``). Where the
package or the driver is absent, :func:`nvml` is None and every reader says nothing rather than
something wrong.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

log = logging.getLogger("mediafarm.nvml")


@functools.lru_cache(maxsize=1)
def nvml() -> Any:
    """The initialised ``pynvml`` module, or None (not installed, no driver): tried once per process."""
    try:
        import pynvml  # the nvidia-ml-py package, in the worker extra

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no package, no driver: no GPU reading
        log.info("NVML unavailable: %s", exc)
        return None
    return pynvml


def memory(gpu: int) -> Any:
    """NVML's memory info of GPU ``gpu`` (``.free``, ``.used``, ``.total`` in bytes); raises
    ``pynvml.NVMLError`` for a GPU that is not there or lost. Only call with :func:`nvml` set."""
    lib = nvml()
    return lib.nvmlDeviceGetMemoryInfo(lib.nvmlDeviceGetHandleByIndex(gpu))


# NVML's answers that mean the GPU is not there to run on (pynvml's NVML_ERROR_* names): it fell
# off the bus or was reset, or its index is past the devices present. Others (a query this GPU does
# not support, a driver busy for a moment) say nothing about it, and are not read as a loss.
LOST = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_FOUND", "NVML_ERROR_UNKNOWN")


def lost_gpu(gpus: tuple[int, ...]) -> str | None:
    """Why one of ``gpus`` cannot be used now, as the driver tells (a GPU fallen off the bus, an
    index past the devices present), or None: all answer, or NVML is not there to ask (then the
    device check at start, ``tasks.wire.family``, is all there is). Asks for each GPU's handle and UUID,
    which every NVIDIA GPU answers."""
    lib = nvml()
    if not gpus or lib is None:
        return None
    lost = {getattr(lib, name) for name in LOST if hasattr(lib, name)}
    for gpu in gpus:
        try:
            lib.nvmlDeviceGetUUID(lib.nvmlDeviceGetHandleByIndex(gpu))
        except Exception as exc:  # noqa: BLE001 - pynvml.NVMLError and its many subclasses
            if getattr(exc, "value", None) in lost:
                return f"GPU {gpu} does not answer the driver (NVML: {exc})"
            log.debug("NVML: GPU %s: %s (not read as lost)", gpu, exc)
    return None
