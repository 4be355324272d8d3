"""Worker pools: which queues each consumes, on which GPUs, with how many children and what caps.

A pool's queues may name families' queues through two patterns, so that a new family needs no
pool edited: ``*`` is the queue of every family served by default pools, and ``gpu<N>.*`` the
GPU-affinity queue ``gpu<N>.<family>`` of each of them. Operators override or add pools in the
``[pools.<name>]`` tables of ``FARM_CONFIG_FILE``::

    [pools.gpu1]
    queues = ["gpu1.tts", "tts"]
    gpus = [1]
    concurrency = 1
    child_rss_cap_mb = 6144
    gpu_memory_fraction = 0.45
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from mediafarm.config.file import ConfigFileError, section

EVERY_FAMILY = "*"


def gpu_queue(gpu: int, family: str) -> str:
    """The affinity queue of one family on one GPU, e.g. ``gpu0.tts``: a producer that wants the
    GPU already holding a speaker's embedding, say, sends there."""
    return f"gpu{gpu}.{family}"


# Between a family's queue and a pool's name in the pool's own queue of that family (``subtitle@gpu0``).
POOL_QUEUE_SEP = "@"


def pool_queue(pool: str, family_queue: str) -> str:
    """The queue of one family that only ``pool``'s workers consume, e.g. ``subtitle@gpu0``: a job
    routed to the pool whose workers run the best rung of its ladder goes there (``tasks.producer.routing``).
    Every worker adds its pool's queue of each family whose queue it consumes (``workers.capability``)."""
    return f"{family_queue}{POOL_QUEUE_SEP}{pool}"


def expand_queues(patterns: Sequence[str], family_queues: Sequence[str]) -> tuple[str, ...]:
    """Queue names with ``*`` and ``gpu<N>.*`` replaced by the given family queues, order kept."""
    out: list[str] = []
    for pattern in patterns:
        if pattern == EVERY_FAMILY:
            names = list(family_queues)
        elif pattern.endswith("." + EVERY_FAMILY):
            prefix = pattern[: -len(EVERY_FAMILY)]
            names = [prefix + q for q in family_queues]
        else:
            names = [pattern]
        out += [n for n in names if n not in out]
    return tuple(out)


@dataclass(frozen=True)
class Pool:
    """One Celery worker (one main process and its prefork children).

    Attributes:
        name: Pool name; the worker's node name is ``<name>@<host>``.
        queues: Queues it consumes; ``*`` and ``gpu<N>.*`` stand for every family (``expand_queues``).
        gpus: GPU ids it may use. One id: the whole worker is pinned to it. Several: child *i*
            is pinned to ``gpus[i % len(gpus)]`` (a replacement child reuses its index).
        concurrency: Prefork children.
        child_rss_cap_mb: The watchdog SIGKILLs a child whose RSS passes this while it runs a
            job; the job then moves down its ladder. ``None`` disables the cap.
        gpu_memory_fraction: Per-child cap on the CUDA caching allocator (torch), 0..1.
        max_tasks_per_child: Recycle a child after this many jobs (leaks, fragmentation).
        max_memory_per_child_mb: Recycle a child after a job that left it above this RSS.
        gpu_fragmentation_limit: A GPU child whose CUDA caching allocator is more fragmented than
            this after a job (inactive split bytes / reserved bytes, 0..1) empties its cache, and
            is recycled if that was not enough (``workers.gpu_hygiene``). ``None``: measured only.
        malloc_arena_max: ``MALLOC_ARENA_MAX`` in the worker's environment, which its children
            inherit: glibc's malloc arenas, one per thread by default up to 8 per core, multiply
            a threaded child's RSS. glibc reads it as a process starts, so it is set when the
            worker is launched (``workers.launch``), not later. 0 or ``None``: glibc's default
            (any value in the launching environment is removed: the pool's setting decides).
    """

    name: str
    queues: tuple[str, ...]
    gpus: tuple[int, ...] = ()
    concurrency: int = 2
    child_rss_cap_mb: int | None = 2048
    gpu_memory_fraction: float | None = None
    max_tasks_per_child: int | None = 200
    max_memory_per_child_mb: int | None = 1536
    gpu_fragmentation_limit: float | None = 0.3
    malloc_arena_max: int | None = 2

    def __post_init__(self) -> None:
        if not self.queues:
            raise ConfigFileError(f"pool {self.name!r} consumes no queue")
        if POOL_QUEUE_SEP in self.name:
            raise ConfigFileError(f"pool {self.name!r}: a pool's name has no {POOL_QUEUE_SEP!r} (it ends its queues' names)")
        if self.concurrency < 1:
            raise ConfigFileError(f"pool {self.name!r}: concurrency must be >= 1")
        if self.gpu_memory_fraction is not None and not 0 < self.gpu_memory_fraction <= 1:
            raise ConfigFileError(f"pool {self.name!r}: gpu_memory_fraction must be in (0, 1]")
        if self.gpu_fragmentation_limit is not None and not 0 < self.gpu_fragmentation_limit <= 1:
            raise ConfigFileError(f"pool {self.name!r}: gpu_fragmentation_limit must be in (0, 1]")
        if self.malloc_arena_max is not None and self.malloc_arena_max < 0:
            raise ConfigFileError(f"pool {self.name!r}: malloc_arena_max must be >= 0 (0: glibc's default)")
        if self.child_rss_cap_mb is not None and self.child_rss_cap_mb <= 0:
            raise ConfigFileError(f"pool {self.name!r}: child_rss_cap_mb must be positive")


DEFAULT_POOLS: dict[str, Pool] = {
    # Everything on the CPU: what `farm up` runs and what CI tests.
    "cpu": Pool("cpu", queues=(EVERY_FAMILY,)),
    # One GPU: its affinity queues first, then the family queues it shares with other GPUs.
    "gpu0": Pool(
        "gpu0",
        queues=(gpu_queue(0, EVERY_FAMILY), EVERY_FAMILY),
        gpus=(0,),
        concurrency=2,
        child_rss_cap_mb=8192,
        gpu_memory_fraction=0.45,
        max_memory_per_child_mb=6144,
    ),
}

_FIELDS = {f.name for f in fields(Pool)}


def _pool_from_table(name: str, table: object, base: Pool | None) -> Pool:
    if not isinstance(table, dict):
        raise ConfigFileError(f"[pools.{name}] must be a table")
    unknown = set(table) - _FIELDS
    if unknown:
        raise ConfigFileError(f"[pools.{name}] unknown keys: {sorted(unknown)}")
    values = {f: getattr(base, f) for f in _FIELDS} if base else {}
    values.update(table)
    values["name"] = name
    for key in ("queues", "gpus"):
        values[key] = tuple(values.get(key, ()))
    try:
        return Pool(**values)
    except TypeError as exc:
        raise ConfigFileError(f"[pools.{name}]: {exc}") from exc


def get_pools() -> dict[str, Pool]:
    """Declared pools, operator overrides applied on top of the defaults."""
    pools = dict(DEFAULT_POOLS)
    for name, table in section("pools").items():
        pools[name] = _pool_from_table(name, table, pools.get(name))
    return pools


def get_pool(name: str) -> Pool:
    pools = get_pools()
    try:
        return pools[name]
    except KeyError:
        raise ConfigFileError(f"no pool named {name!r}; declared: {sorted(pools)}") from None
