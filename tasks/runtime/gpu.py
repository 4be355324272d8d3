"""CUDA set-up for engines, done lazily in the child on first use (never in the main process)."""

from __future__ import annotations

import functools

from mediafarm.config.pools import get_pool
from mediafarm.config.settings import get_settings
from mediafarm.tasks.wire.errors import RungUnavailable


@functools.lru_cache(maxsize=1)
def torch_device() -> str:
    """``"cuda"`` with this child's GPU memory fraction applied, or RungUnavailable.

    The pool's ``gpu_memory_fraction`` caps the caching allocator, so a job that wants more gets
    ``torch.cuda.OutOfMemoryError`` (a resource failure: the job moves down its ladder) instead of
    starving the other children on the same GPU. An engine that calls it declares ``torch`` in its
    ``EngineSpec.needs``.
    """
    import torch

    if not torch.cuda.is_available():
        raise RungUnavailable("CUDA is not available in this child (no GPU, or CUDA_VISIBLE_DEVICES hides it)")
    fraction = get_pool(get_settings().pool).gpu_memory_fraction
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
    return "cuda"
