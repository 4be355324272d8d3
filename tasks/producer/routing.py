"""Which pool's queue a job goes to: a pool whose live workers run the best rung of its ladder.

Every worker consumes, beside its family queues, its pool's own queue of each family
(``subtitle@gpu0``, ``config.pools.pool_queue``), and advertises the rungs it can run
(``tasks.wire.capability``). From those live records:

    at submit (``choose``)      the best rung of the job's ladder that some live pool can run → that
                                pool's queue (if several can: one not full, one whose own best
                                rung it is, the least deep, in that order); if its queue holds
                                ``FARM_ROUTE_SPILL_DEPTH`` waiting jobs or more, the first pool
                                down the ladder whose queue holds fewer, which starts the job on its
                                own best rung; every pool past it → the best one all the same
    at a delivery (``move``)    a job whose next rung is the best rung of another pool than this
                                one (a GPU pool's job killed for memory, whose next rung is the CPU
                                pool's), or that reached a pool unable to run the best rung left to
                                it (a plain Celery client's message on the family queue) → that
                                pool's queue, under the same id, this slot freed at once; the same
                                spill rule keeps it here when that queue is full; once per rung

A pool's best rung of a ladder is the highest rung (lowest index) any of its live workers can run.
The pools' workers are meant to be alike (one image, one models folder); where they differ, the
pool counts as able to run what any of them can. A family no live worker advertises, or a farm
whose workers predate pool queues, keeps the family's queue: the job waits there as before, and a
worker that cannot run it sends it back (``tasks.runtime.reroute``).

Every choice is written with its reason: at submit in the message's ``ROUTE_HEADER``, which the
worker keeps in the job's first attempt (``Attempt.route``); a move as an attempt of outcome
``moved`` (no rung spent).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from mediafarm.config.pools import pool_queue
from mediafarm.tasks.wire.capability import WorkerCapability
from mediafarm.tasks.wire.records import Attempt, Outcome

# The message header that carries the submit's choice and its reason to the worker.
ROUTE_HEADER = "farm_route"


@dataclass(frozen=True)
class Route:
    """Where a job goes, on which rung it is expected to start, and why."""

    queue: str
    pool: str
    rung: str
    reason: str


def able_pools(records: Iterable[WorkerCapability], family: str, family_queue: str, ladder: str,
               rungs: Sequence[str], language: str | None = None) -> list[tuple[str, ...]]:  # fmt: skip
    """For each rung of ``rungs`` (ladder order), the pools (by name) with a live worker that
    consumes the pool's own queue of ``family`` and can run that rung, for a job in ``language``
    (normalised; None: not known) where given: the worker's rung handles it."""
    out: list[set[str]] = [set() for _ in rungs]
    for record in records:
        if pool_queue(record.pool, family_queue) not in record.queues:
            continue  # a worker from before pool queues, or one that left the family out
        runnable = set(record.runnable(family).get(ladder, ()))
        for i, rung in enumerate(rungs):
            if rung in runnable and record.handles(family, ladder, rung, language):
                out[i].add(record.pool)
    return [tuple(sorted(pools)) for pools in out]


def best_rungs(able: Sequence[tuple[str, ...]]) -> dict[str, int]:
    """Pool -> the index of the best rung it can run."""
    best: dict[str, int] = {}
    for i, pools in enumerate(able):
        for pool in pools:
            best.setdefault(pool, i)
    return best


def choose(
    *,
    family: str,
    family_queue: str,
    ladder: str,
    rungs: Sequence[str],
    records: Iterable[WorkerCapability],
    depths: Callable[[Sequence[str]], Mapping[str, int]],
    spill_depth: int,
    start: int = 0,
    why_not: Callable[[int], str | None] | None = None,
    language: str | None = None,
) -> Route | None:
    """The queue for a job of ``family`` whose ladder ``ladder`` has ``rungs``, from rung ``start``
    on; None when no live pool advertises a rung of it (the family's queue, as ever).

    ``depths``: queue names -> the jobs waiting in each. ``spill_depth``: waiting jobs at which a
    pool counts as full (0: never). ``why_not``: why a rung cannot take the job whoever runs it
    (its language), or None. ``language``: the job's (normalised), or None: a pool is able to run
    a rung for it only where its worker's record says the rung handles it."""
    able = able_pools(records, family, family_queue, ladder, rungs, language)
    order = [(i, pools) for i, pools in enumerate(able) if i >= start and pools
             and not (why_not is not None and why_not(i))]  # fmt: skip
    if not order:
        return None
    queues = {pool: pool_queue(pool, family_queue) for _, pools in order for pool in pools}
    # One pool runs every rung it could start on: its depth would change nothing, so it is not read
    # (a round trip to the broker saved on each submit of a one-pool farm, issue #34).
    depth = dict(depths(list(queues.values()))) if len(queues) > 1 else None
    waiting = {pool: int((depth or {}).get(queue, 0)) for pool, queue in queues.items()}

    best = best_rungs(able)

    def least(pools: Iterable[str], rung: int) -> str:
        # A pool not full first; of those, one whose own best rung this is (a job for the CPU
        # pool's rung does not take a GPU slot), then the least deep.
        return min(pools, key=lambda p: (0 < spill_depth <= waiting[p], best[p] != rung, waiting[p], p))

    best_i, best_pools = order[0]
    pool = least(best_pools, best_i)
    rung = rungs[best_i]
    told = f" ({waiting[pool]} waiting in its queue)" if depth is not None else ", the only pool that can"
    why = (f"pool {pool} runs {rung}, the best rung of the {ladder} ladder a live worker can run"
           f"{f' in {language!r}' if language else ''}{told}")  # fmt: skip
    if depth is None or spill_depth <= 0 or waiting[pool] < spill_depth:
        return Route(queues[pool], pool, rung, why)
    seen = set(best_pools)
    for i, pools in order[1:]:
        fresh = [p for p in pools if p not in seen and waiting[p] < spill_depth]
        seen.update(pools)
        if fresh:
            lower = least(fresh, i)
            return Route(queues[lower], lower, rungs[i], (
                f"pool {pool}'s queue holds {waiting[pool]} waiting jobs, at or past the spill depth "
                f"{spill_depth} (FARM_ROUTE_SPILL_DEPTH): started lower, on pool {lower}, whose best rung "
                f"is {rungs[i]} ({waiting[lower]} waiting)"))  # fmt: skip
    return Route(queues[pool], pool, rung, f"{why}; every pool that could take it is at or past the spill depth "
                                           f"{spill_depth}, so it waits for the best")  # fmt: skip


def move(
    *,
    pool: str,
    family: str,
    family_queue: str,
    ladder: str,
    rungs: Sequence[str],
    index: int,
    attempts: Sequence[Attempt],
    records: Iterable[WorkerCapability],
    depths: Callable[[Sequence[str]], Mapping[str, int]],
    spill_depth: int,
    why_not: Callable[[int], str | None] | None = None,
) -> Route | None:
    """Where a job that is to run from rung ``index`` on, delivered to a worker of ``pool``, goes
    instead; None: it runs here. See the module's table."""
    able = able_pools(records, family, family_queue, ladder, rungs)
    target = next((i for i in range(index, len(rungs)) if able[i] and not (why_not is not None and why_not(i))), None)
    if target is None:
        return None  # no live pool runs a rung it has left: this worker's ladder decides (tasks.runtime.reroute)
    if any(a.outcome == Outcome.MOVED and a.rung_index == target for a in attempts):
        return None  # moved once already for this rung: it runs wherever it is now
    best = best_rungs(able)
    here_best = best.get(pool)
    if pool in able[target]:
        # This pool can run it: it moves only to a pool whose own best rung it is, freeing a better slot.
        homes = [p for p in able[target] if p != pool and best[p] == target]
        if here_best is None or here_best >= target or not homes:
            return None
        why_here = f"pool {pool} runs better rungs ({rungs[here_best]})"
    else:
        homes = list(able[target])
        why_here = f"pool {pool} cannot run {rungs[target]}"
    queues = {p: pool_queue(p, family_queue) for p in homes}
    depth = depths(list(queues.values())) if spill_depth > 0 or len(homes) > 1 else {}
    waiting = {p: int(depth.get(q, 0)) for p, q in queues.items()}
    there = min(homes, key=lambda p: (waiting[p], p))
    here_can = any(pool in able[i] for i in range(target, len(rungs)))
    if spill_depth > 0 and waiting[there] >= spill_depth and here_can:
        return None  # the better-suited pool is full: run it here (on the best rung it can) rather than wait
    return Route(queues[there], there, rungs[target], (
        f"moved to queue {queues[there]}: {why_here}, pool {there} runs {rungs[target]}"
        f"{' as its best rung' if best[there] == target else ''} ({waiting[there]} waiting); this slot is freed"))

