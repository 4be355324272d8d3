"""A job that reached a worker able to run none of the rungs it has left: sent back, or failed.

Workers consume only the queues of families they can run (``workers.capability``), so a job
reaches one that cannot run it only by a queue of no family, an old message, or a race with a
restart. Running its ladder there would mark every rung unavailable and fail the job, although
another pool may run it. Instead, before any rung is tried (``tasks.runtime.downgrade.run_ladder``)::

    every rung left is unavailable on this worker, and
      the job was never sent back                     → sent back to be routed again: to a queue that
                                                        only live workers able to run a rung of it
                                                        consume, else its family's queue, where it
                                                        waits for one to come
      it was, fewer than MAX_REROUTES times, and a
        queue only able live workers consume exists   → sent there
      otherwise                                       → NoRungLeft, naming why it cannot run here
                                                        and which live workers could

Each sending back is an attempt with outcome ``rerouted`` in the job's history, the cause
``rerouted`` (not counted against the rung: ``tasks.runtime.attribution``), and costs no rung. The bound
keeps a job from going round workers that cannot run it. Who can run what is read from the live
capability records (``tasks.wire.capability``); a worker judges itself afresh (the rung's own check).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mediafarm.config.ladders import Ladder
from mediafarm.tasks.runtime import attribution
from mediafarm.tasks.runtime.ladder_choice import owed
from mediafarm.tasks.wire.capability import WorkerCapability, can_run_any, family_of_queue
from mediafarm.tasks.wire.errors import NoRungLeft
from mediafarm.tasks.wire.family import EngineSpec
from mediafarm.tasks.wire.records import Attempt, Outcome

MAX_REROUTES = 2


@dataclass(frozen=True)
class Reroute:
    """Where to send the job, and why, for its history."""

    queue: str
    reason: str


def clean_queue(records: Iterable[WorkerCapability], family: str, family_queue: str, able: Sequence[WorkerCapability],
                ) -> str | None:  # fmt: skip
    """A queue of the family some worker of ``able`` consumes and that no other live worker does
    (the family's own first); None if there is none."""
    able_nodes = {r.node for r in able}
    queues = {family_queue: family}
    candidates = [q for r in able for q in r.queues if family_of_queue(q, queues) == family]
    others = {q for r in records if r.node not in able_nodes for q in r.queues}
    ordered = sorted(dict.fromkeys(candidates), key=lambda q: q != family_queue)
    return next((q for q in ordered if q not in others), None)


def decide(
    *,
    node: str,
    family: str,
    family_queue: str,
    ladder: str,
    why_not_here: Mapping[str, str],
    attempts: Sequence[Attempt],
    records: Iterable[WorkerCapability],
) -> Reroute:
    """Where a job goes that ``node`` cannot run (``why_not_here``: each rung it has left -> why
    not here), or NoRungLeft. ``ladder``: the ladder as the capability records name it."""
    others = [r for r in records if r.node != node]
    able = can_run_any(others, family, ladder, why_not_here)
    sent_back = sum(1 for a in attempts if a.outcome == Outcome.REROUTED)
    clean = clean_queue(others, family, family_queue, able)
    here = "; ".join(f"{rung}: {why}" for rung, why in why_not_here.items())
    who = ", ".join(r.node for r in able)
    if sent_back == 0 or (clean is not None and sent_back < MAX_REROUTES):
        queue = clean if clean is not None else family_queue
        there = f"where {who} can run it" if clean is not None else (
            f"to wait for a worker that can run it (live workers that can: {who or 'none'})")  # fmt: skip
        return Reroute(queue, f"no rung left of the {ladder} ladder runs on {node} ({here}); "
                              f"sent back to queue {queue} {there}")  # fmt: skip
    if not able:
        cause = "and no live worker advertises any rung of it"
    else:
        cause = f"after {sent_back} times sent back it came again to a worker that cannot run it (able: {who})"
    raise NoRungLeft(f"no rung left of the {ladder} ladder runs on {node} ({here}), {cause}")


def none_runs_here(ladder: Ladder, engines: Mapping[str, EngineSpec], models_dir: Path | None, index: int,
                   attempts: Sequence[Attempt]) -> dict[str, str] | None:  # fmt: skip
    """Each rung the job has left (from ``index``, rungs passed, on, and those owed a try) -> why it
    cannot run on this worker; None if one of them can (or none is left)."""
    why: dict[str, str] = {}
    for i in [*owed(attempts, index), *range(index, len(ladder.rungs))]:
        rung = ladder.rungs[i]
        why[rung.name] = engines[rung.engine].unavailable(rung, models_dir) or ""
        if not why[rung.name]:
            return None  # the common case, at the first rung: one check
    return why or None


# Where a job goes that no rung it has left can run here: (each such rung -> why not, the history).
WhereTo = Callable[[dict[str, str], list[Attempt]], Reroute]


def sender(ladder: Ladder, engines: Mapping[str, EngineSpec], models_dir: Path | None,
           where_to: WhereTo) -> Callable[[int, list[Attempt]], Reroute | None]:  # fmt: skip
    """What ``run_ladder`` asks before anything runs (its ``reroute``): where to send the job back when
    no rung it has left can run on this worker (``where_to``, given each rung and why not, and the
    history: :func:`decide` by the live capability records; or NoRungLeft), None when one can."""

    def send(index: int, attempts: list[Attempt]) -> Reroute | None:
        why_not_here = none_runs_here(ladder, engines, models_dir, index, attempts)
        return None if why_not_here is None else where_to(why_not_here, attempts)

    return send


def rerouted_attempt(rung_index: int, rung: str, reason: str, retries: int, worker: str) -> Attempt:
    """The history's record of one sending back: no rung spent, nothing counted."""
    attempt = Attempt(rung_index, rung, Outcome.REROUTED, reason, retries, worker=worker)
    attribution.judge(attempt, "rerouted")
    return attempt


def moved_attempt(rung_index: int, rung: str, reason: str, retries: int, worker: str) -> Attempt:
    """The history's record of one move: no rung spent, nothing counted."""
    attempt = Attempt(rung_index, rung, Outcome.MOVED, reason, retries, worker=worker)
    attribution.judge(attempt, "moved")
    return attempt
