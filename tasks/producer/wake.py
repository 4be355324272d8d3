"""A pool at zero replicas, woken by the jobs that want it.

Routing sends a job only to a pool with a live worker (``tasks.producer.routing``). A GPU pool that its
orchestrator scaled to zero then gets none of its family's jobs while the CPU pool runs their
lower rungs: its queues stay empty, its load reads 0, and nothing would ever start it again. So the
pools scaled from zero are named (``FARM_WAKE_POOLS``), and at submit the producer looks at those
with no live worker, each known by what its workers ran when last live
(``capability.known_pools``) or, never seen live, by its declaration (:func:`declared_record`). A
job that such a pool would start on a better rung of its ladder than the one routing chose (or on
any rung, when no live pool runs one) counts as *wanting* that pool: its id stays in the pool's
wanted set (``keys.wanted``) for ``FARM_WAKE_WINDOW`` seconds, and the route's reason in its history
says so. While the set holds a job, the pool's load (``tasks.producer.scaling``) reads at least 1: one
replica to start. Once a worker of it is live, routing sends it the jobs its rungs are best for and
its own queue drives its load; when they stop coming, the scaler's idle time takes it back to zero.

The job itself does not wait for the pool: it starts on the rung routing chose. A job no live pool
can run waits in its family's queue, which the woken pool consumes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mediafarm.config.ladders import Ladder
from mediafarm.config.pools import Pool, expand_queues, pool_queue
from mediafarm.tasks.producer.routing import able_pools, best_rungs
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.capability import WorkerCapability, served_families
from mediafarm.tasks.wire.family import FamilySpec

# The reason a declared pool with no GPU is taken not to run a ``cuda`` rung.
NO_DECLARED_GPU = "rung needs a GPU and the pool declares none"
# The node name of a record judged from a pool's declaration: ``<pool>@declared``.
DECLARED = "declared"


@dataclass(frozen=True)
class Want:
    """A pool with no live worker that would start a job on a better rung.

    Attributes:
        pool: The pool.
        rung: The rung it would start the job on.
        declared: True: judged by the pool's declaration, no worker of it seen live yet.
    """

    pool: str
    rung: str
    declared: bool = False


def declared_record(
    pool: Pool, specs: Mapping[str, FamilySpec], ladders_of: Callable[[FamilySpec], list[Ladder]],
    default_queues: Sequence[str],
) -> WorkerCapability:  # fmt: skip
    """What a declared pool never seen live is taken to run: every rung of every ladder of the
    families its queues name, but a ``cuda`` rung where it declares no GPU. A guess on the hopeful
    side (its image's packages and weights are not known here): its first live worker's record
    replaces it, and a pool that turns out to run nothing better is not woken for it again."""
    family_queues = {name: spec.queue for name, spec in specs.items()}
    queues = expand_queues(pool.queues, default_queues)
    own = tuple(pool_queue(pool.name, q) for q in queues if q in family_queues.values())
    served = served_families(queues, family_queues)
    rungs = {family: {ladder.name: {r.name: NO_DECLARED_GPU if r.device == "cuda" and not pool.gpus else ""
                                    for r in ladder.rungs}
                      for ladder in ladders_of(specs[family])}
             for family in served}  # fmt: skip
    return WorkerCapability(f"{pool.name}@{DECLARED}", pool.name, (*queues, *own), {}, served, rungs)


def dormant_records(
    wakeable: Iterable[str], live: Iterable[WorkerCapability], known: Mapping[str, WorkerCapability],
    declared: Mapping[str, Pool], judge_declared: Callable[[Pool], WorkerCapability],
) -> list[WorkerCapability]:  # fmt: skip
    """One record for each pool of ``wakeable`` (``FARM_WAKE_POOLS``) with no live worker: what its
    workers ran when last live (``known``, ``capability.known_pools``), else, for a declared pool
    never seen live, ``judge_declared(pool)`` (:func:`declared_record`). A name neither known nor
    declared is left out."""
    awake = {r.pool for r in live}
    out = []
    for name in dict.fromkeys(wakeable):
        if name in awake:
            continue
        if name in known:
            out.append(known[name])
        elif name in declared:
            out.append(judge_declared(declared[name]))
    return out


def wanting(
    *, family: str, family_queue: str, ladder: str, rungs: Sequence[str], dormant: Iterable[WorkerCapability],
    chosen: int | None, start: int = 0, language: str | None = None,
) -> list[Want]:  # fmt: skip
    """The pools of ``dormant`` whose best rung of the ladder for a job in ``language`` (None: not
    known), from ``start`` on, is better than ``chosen`` (the index of the rung routing starts the
    job on; None: no live pool runs a rung of it), best first."""
    dormant = list(dormant)
    able = able_pools(dormant, family, family_queue, ladder, rungs, language)
    best = best_rungs([pools if i >= start else () for i, pools in enumerate(able)])
    guessed = {r.pool for r in dormant if r.node == f"{r.pool}@{DECLARED}"}
    return [Want(pool, rungs[i], pool in guessed)
            for pool, i in sorted(best.items(), key=lambda item: (item[1], item[0])) if chosen is None or i < chosen]


def note(wants: Sequence[Want]) -> str:
    """The route reason's words for the pools a job wants: ``''`` for none."""
    if not wants:
        return ""
    named = ", ".join(f"pool {w.pool}{' (by its declaration: never seen live)' if w.declared else ''} would run "
                      f"{w.rung}" for w in wants)  # fmt: skip
    return f"; no live worker: {named}; counted as wanting it, to wake it (FARM_WAKE_WINDOW)"


# KEYS: the wanted sets of the pools. ARGV[1]: the job id, ARGV[2]: the window in seconds. Adds the
# job at the Redis server's time to each set and drops the members older than the window.
_WANT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local window = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now, ARGV[1])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  redis.call('EXPIRE', key, math.ceil(window))
end
return tostring(now)
"""

# KEYS: the wanted sets. ARGV[1]: the window in seconds. The count in each set within the window.
_COUNT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('ZCOUNT', key, now - tonumber(ARGV[1]), '+inf')
end
return out
"""


def want(client: Any, pools: Sequence[str], job_id: str, window: float) -> None:
    """Count job ``job_id`` as wanting each of ``pools`` for ``window`` seconds (one round trip)."""
    if pools and window > 0:
        client.eval(_WANT, len(pools), *(keys.wanted(p) for p in pools), job_id, window)


def wanted_counts(client: Any, pools: Sequence[str], window: float) -> dict[str, int]:
    """Pool -> the jobs that wanted it within the last ``window`` seconds (one round trip)."""
    if not pools or window <= 0:
        return {pool: 0 for pool in pools}
    counts = client.eval(_COUNT, len(pools), *(keys.wanted(p) for p in pools), window)
    return {pool: int(n) for pool, n in zip(pools, counts, strict=True)}
