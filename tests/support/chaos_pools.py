"""The chaos suite's two pools (tests/support/chaos_suite.py): where its jobs are sent, and what the
run must show of routing.

Both pools serve the chaos family and differ by one file: ``chaos``'s models folder holds the
weights the top rung of the ``routed`` and ``moving`` ladders needs (tests.support.chaos
``WeightedParams``), ``chaos-b``'s does not (tests/support/farm-test.toml). A job is sent to the
queue routing chooses from the live capability records (``tasks.producer.routing.choose``), as
``tasks.producer.client.submit`` sends it; the producer is the suite's own app on the suite's own Redis,
which the farm's client (bound to the session's) cannot send through.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mediafarm.tasks import registry
from mediafarm.tasks.producer import routing, scaling
from mediafarm.tasks.wire import capability

FAMILY = "chaos"
POOLS = ("chaos", "chaos-b")
# As many jobs on each pool (``routed`` and ``moving`` go to the first, the rest to the least deep
# queue), and a ladder whose every job moves: its top rung fails by resource on the one pool that runs it.
MIX = (("steady", 0.3), ("routed", 0.3), ("moving", 0.1), ("memerr", 0.1), ("kill_once", 0.1), ("bad", 0.1))
WEIGHTS = "chaos-weights.bin"
# Never spill, neither the suite's sends nor its workers' moves: a job whose next rung is the
# other pool's best always moves there, whatever that pool's queue holds.
SPILL_DEPTH = 0


def models_dir(workdir: Path, pool: str) -> Path:
    """The pool's models folder under ``workdir``: the first pool's holds the weights."""
    folder = workdir / f"models-{pool}"
    if not folder.exists():
        folder.mkdir()
        if pool == POOLS[0]:
            (folder / WEIGHTS).write_bytes(b"chaos")
    return folder


def wait_for_records(client: Any, timeout: float = 3 * capability.INTERVAL_S) -> None:
    """Until each pool has a live capability record: routing sends jobs to live pools only."""
    deadline = time.monotonic() + timeout
    while {r.pool for r in capability.live(client)} < set(POOLS):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no live capability record of each pool of {POOLS} in {timeout:g} s")
        time.sleep(0.2)


def route(client: Any, ladder: str) -> routing.Route | None:
    """Where routing sends a job of ``ladder`` now; None: no pool is live (the family's queue)."""
    spec = registry.get(FAMILY)
    rungs = [r.name for r in registry.ladder_for(spec, ladder).rungs]
    # The depths on the suite's broker (``admission.queue_depths`` reads this process's: the session's).
    return routing.choose(family=FAMILY, family_queue=spec.queue, ladder=ladder, rungs=rungs,
                          records=capability.live(client), spill_depth=SPILL_DEPTH,
                          depths=lambda queues: scaling.redis_depths(client, queues))  # fmt: skip


@dataclass
class RoutingCounts:
    """What the run shows of routing.

    Attributes:
        routed_to: Pool -> the jobs sent to its queue.
        answered_on: Pool -> the jobs answered there (their ``ok`` attempt's worker).
        moved: Jobs with an attempt of outcome ``moved``.
        workers_killed: Pool -> its workers SIGKILLed whole.
        routes_not_kept: Jobs sent with a route whose first attempt kept none (``Attempt.route``).
    """

    routed_to: Counter[str] = field(default_factory=Counter)
    answered_on: Counter[str] = field(default_factory=Counter)
    moved: int = 0
    workers_killed: Counter[str] = field(default_factory=Counter)
    routes_not_kept: list[str] = field(default_factory=list)

    def count(self, job: str, attempts: list[dict[str, Any]], sent: bool, pool_of: Mapping[str, str]) -> None:
        """One terminal job's attempts; ``sent``: it was sent with a route; ``pool_of``: node -> pool."""
        self.moved += any(a.get("outcome") == "moved" for a in attempts)
        self.answered_on.update(pool_of.get(a.get("worker", ""), "?") for a in attempts if a.get("outcome") == "ok")
        if sent and not (attempts and attempts[0].get("route")):
            self.routes_not_kept.append(f"{job}: {[a.get('outcome') for a in attempts]}")

    def problems(self) -> list[tuple[str, list[str]]]:
        return [("pools no job was routed to", [p for p in POOLS if not self.routed_to[p]]),
                ("pools no job was answered on", [p for p in POOLS if not self.answered_on[p]]),
                ("pools none of whose workers was killed", [p for p in POOLS if not self.workers_killed[p]]),
                ("routed jobs whose first attempt kept no route", self.routes_not_kept),
                ("no job moved to another pool", [] if self.moved else ["0 attempts of outcome moved"])]  # fmt: skip

    def text(self) -> str:
        return (f"  pools: routed to {dict(self.routed_to)}, answered on {dict(self.answered_on)}, jobs moved "
                f"{self.moved}, workers SIGKILLed whole {dict(self.workers_killed)}")  # fmt: skip
