"""The CUDA caching allocator's fragmentation in each GPU child, and what the child does about it.

The subtitles story's early sign of a GPU child going bad: memory reserved by torch's caching
allocator but cut into blocks too small to serve the next job. Measured after every job, in the
child (the main process never imports torch), from ``torch.cuda.memory_stats()``:

    fragmentation = inactive_split_bytes / reserved_bytes

(inactive split bytes: the free pieces of segments that still hold live blocks, which
``empty_cache()`` cannot hand back and which only serve requests smaller than themselves).
Above the pool's ``gpu_fragmentation_limit`` (default 0.3) the child first empties the cache; if
the index is still above the limit it is recycled after the job, through billiard's own
memory-recycling check (a child is replaced only between jobs, its result already sent; this needs
the pool's ``max_memory_per_child_mb``, which every declared pool sets). The figures go to Redis
(``keys.gpu_children``), where the worker's main process serves them at each scrape.

Nothing here runs where torch was never imported or CUDA never initialised: the CPU pools.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mediafarm.tasks.wire import keys

log = logging.getLogger("mediafarm.gpu")
DEFAULT_LIMIT = 0.3
ENTRY_TTL = 3600


def fragmentation(stats: Mapping[str, Any]) -> float | None:
    """Inactive split bytes over reserved bytes, 0..1, from ``torch.cuda.memory_stats()``; None
    when nothing is reserved (no index without a cache)."""
    reserved = stats.get("reserved_bytes.all.current") or 0
    inactive = stats.get("inactive_split_bytes.all.current") or 0
    if reserved <= 0:
        return None
    return min(1.0, max(0.0, inactive / reserved))


@dataclass(frozen=True)
class Verdict:
    """What a child does after a job: ``keep``, ``empty_cache`` (it did, and that was enough), or
    ``recycle`` (still above the limit after emptying the cache)."""

    action: str
    before: float | None
    after: float | None


def decide(stats: Mapping[str, Any], limit: float | None, empty_cache: Any, read_stats: Any) -> Verdict:
    """Measure; above ``limit`` call ``empty_cache()`` and measure again (``read_stats()``)."""
    before = fragmentation(stats)
    if limit is None or before is None or before <= limit:
        return Verdict("keep", before, before)
    empty_cache()
    after = fragmentation(read_stats())
    return Verdict("empty_cache" if after is None or after <= limit else "recycle", before, after)


def _cuda() -> Any:
    """torch, where this child imported it and initialised CUDA; None otherwise (imports nothing)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch if torch.cuda.is_initialized() else None
    except Exception:  # noqa: BLE001 - a broken CUDA must not fail the job's ending
        return None


def request_recycle() -> bool:
    """Make billiard replace this child after the job that is ending: its post-job memory check
    (``billiard.pool.Worker.workloop``, active when the pool sets ``max_memory_per_child_mb``) is
    told the child is over any cap. False where billiard is not this child's pool."""
    try:
        import billiard.pool
    except ImportError:
        return False
    billiard.pool.mem_rss = lambda: sys.maxsize  # the child exits after this job's result is sent
    return True


def after_job(client: Any, worker: str, limit: float | None) -> Verdict | None:
    """In a pool child after each job: measure, act, write the figures (``keys.gpu_children``)."""
    torch = _cuda()
    if torch is None:
        return None
    device = torch.cuda.current_device()
    stats = torch.cuda.memory_stats(device)
    verdict = decide(stats, limit, torch.cuda.empty_cache, lambda: torch.cuda.memory_stats(device))
    if verdict.action == "recycle" and not request_recycle():
        verdict = Verdict("empty_cache", verdict.before, verdict.after)
    if verdict.action != "keep":
        log.info("GPU child %d: allocator fragmentation %.2f above %.2f: %s (now %s)", os.getpid(),
                 verdict.before or 0, limit or 0, verdict.action, verdict.after)  # fmt: skip
    entry = {
        "device": str(device),
        "reserved_bytes": int(torch.cuda.memory_reserved(device)),
        "allocated_bytes": int(torch.cuda.memory_allocated(device)),
        "fragmentation": verdict.after,
        "action": verdict.action,
        "at": time.time(),
    }
    key = keys.gpu_children(worker)
    pipe = client.pipeline(transaction=False)
    pipe.hset(key, str(os.getpid()), json.dumps(entry))
    pipe.expire(key, ENTRY_TTL)
    pipe.execute()
    return verdict


def read_children(client: Any, worker: str, alive: set[int]) -> dict[int, dict[str, Any]]:
    """The figures of this worker's live GPU children (main process, at scrape); entries of
    children gone are deleted."""
    raw = client.hgetall(keys.gpu_children(worker))
    out, gone = {}, []
    for pid_raw, value in raw.items():
        pid = int(pid_raw)
        if pid not in alive:
            gone.append(pid_raw)
            continue
        try:
            out[pid] = json.loads(value)
        except ValueError:
            gone.append(pid_raw)
    if gone:
        client.hdel(keys.gpu_children(worker), *gone)
    return out
