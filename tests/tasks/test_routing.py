"""Routing by capability (issue #36, items 3-4): which pool's queue a job goes to, from live
records, at submit and at a delivery. The records and depths here are built by hand; the same
decisions on real workers are in tests/integration/test_routing.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mediafarm.tasks.producer import routing
from mediafarm.tasks.runtime import reroute
from mediafarm.tasks.wire.capability import WorkerCapability
from mediafarm.tasks.wire.records import Attempt, Outcome

RUNGS = ("large", "small", "tiny", "sphinx")


def record(node: str, pool: str, runs: Sequence[str], *, pool_queue: bool = True) -> WorkerCapability:
    queues = ("subtitle", f"subtitle@{pool}") if pool_queue else ("subtitle",)
    rungs = {"subtitle": {"subtitle": {r: "" if r in runs else "weights absent" for r in RUNGS}}}
    return WorkerCapability(node, pool, queues, served=("subtitle",), rungs=rungs)


GPU = record("gpu0@a", "gpu0", ("large", "small", "tiny", "sphinx"))
CPU = record("cpu@b", "cpu", ("tiny", "sphinx"))
PLAIN = record("plain@c", "plain", ("sphinx",))


def depths_of(waiting: Mapping[str, int]):
    seen: list[Sequence[str]] = []

    def read(queues: Sequence[str]) -> dict[str, int]:
        seen.append(tuple(queues))
        return {q: waiting.get(q, 0) for q in queues}

    read.seen = seen  # type: ignore[attr-defined]
    return read


def choose(records, waiting=None, spill=4, **kw):
    return routing.choose(family="subtitle", family_queue="subtitle", ladder="subtitle", rungs=RUNGS,
                          records=records, depths=depths_of(waiting or {}), spill_depth=spill, **kw)  # fmt: skip


def test_a_job_goes_to_the_pool_that_runs_the_best_rung() -> None:
    route = choose([CPU, GPU, PLAIN])
    assert (route.queue, route.pool, route.rung) == ("subtitle@gpu0", "gpu0", "large")
    assert "best rung" in route.reason and "gpu0" in route.reason


def test_without_the_gpu_pool_the_best_is_the_cpu_pools_rung() -> None:
    route = choose([CPU, PLAIN])
    assert (route.pool, route.rung) == ("cpu", "tiny")


def test_one_pool_that_runs_every_rung_is_chosen_without_reading_a_depth() -> None:
    # Its depth could change nothing: it spills to no one (a broker round trip saved a submit).
    depths = depths_of({"subtitle@gpu0": 99})
    route = routing.choose(family="subtitle", family_queue="subtitle", ladder="subtitle", rungs=RUNGS,
                           records=[GPU], depths=depths, spill_depth=4)  # fmt: skip
    assert (route.pool, route.rung) == ("gpu0", "large") and route.reason.endswith(", the only pool that can")
    assert depths.seen == []  # type: ignore[attr-defined]
    # Two pools: their depths are read, once.
    depths = depths_of({})
    routing.choose(family="subtitle", family_queue="subtitle", ladder="subtitle", rungs=RUNGS, records=[GPU, CPU],
                   depths=depths, spill_depth=4)  # fmt: skip
    assert depths.seen == [("subtitle@gpu0", "subtitle@cpu")]  # type: ignore[attr-defined]


def test_a_full_best_pool_spills_to_the_next_pool_down_saying_why() -> None:
    route = choose([GPU, CPU, PLAIN], {"subtitle@gpu0": 4})
    assert (route.pool, route.rung) == ("cpu", "tiny")
    assert "spill depth 4" in route.reason and "4 waiting" in route.reason
    # Both full: the next one down that is not.
    route = choose([GPU, CPU, PLAIN], {"subtitle@gpu0": 9, "subtitle@cpu": 5})
    assert (route.pool, route.rung) == ("plain", "sphinx")


def test_when_every_pool_is_full_the_job_waits_for_the_best() -> None:
    route = choose([GPU, CPU], {"subtitle@gpu0": 9, "subtitle@cpu": 9})
    assert route.pool == "gpu0" and "waits for the best" in route.reason


def test_spill_depth_zero_never_spills() -> None:
    assert choose([GPU, CPU], {"subtitle@gpu0": 100}, spill=0).pool == "gpu0"


def test_of_two_pools_with_the_same_best_rung_the_least_deep_is_chosen() -> None:
    other = record("gpu1@d", "gpu1", RUNGS)
    assert choose([GPU, other], {"subtitle@gpu0": 2, "subtitle@gpu1": 1}).pool == "gpu1"
    assert choose([GPU, other], {"subtitle@gpu0": 1, "subtitle@gpu1": 2}).pool == "gpu0"


def test_a_rung_requested_lower_starts_there() -> None:
    assert choose([GPU, CPU], start=2).pool in ("cpu", "gpu0")
    assert choose([GPU, CPU], start=2).rung == "tiny"


def test_a_rung_that_cannot_take_the_language_is_passed_over() -> None:
    route = choose([GPU, CPU, PLAIN], why_not=lambda i: "english only" if RUNGS[i] != "sphinx" else None)
    assert (route.pool, route.rung) == ("plain", "sphinx")


def test_a_pool_whose_workers_rung_does_not_handle_the_jobs_language_is_passed_over() -> None:
    # gpu0's models are English only; cpu's "tiny" is multilingual there.
    english = {"subtitle": {"subtitle": {r: ("en",) for r in RUNGS}}}
    gpu = WorkerCapability(GPU.node, GPU.pool, GPU.queues, served=GPU.served, rungs=GPU.rungs, languages=english)
    many = {"subtitle": {"subtitle": {"tiny": ("en", "fr"), "sphinx": ("en",)}}}
    cpu = WorkerCapability(CPU.node, CPU.pool, CPU.queues, served=CPU.served, rungs=CPU.rungs, languages=many)
    french = choose([gpu, cpu], language="fr")
    assert (french.pool, french.rung) == ("cpu", "tiny") and "in 'fr'" in french.reason, french
    assert (choose([gpu, cpu], language="en").pool, choose([gpu, cpu]).pool) == ("gpu0", "gpu0")
    assert choose([gpu], language="de") is None  # no live pool handles it: the family's queue


def test_workers_without_pool_queues_or_no_records_leave_the_family_queue() -> None:
    assert choose([]) is None
    assert choose([record("old@e", "cpu", RUNGS, pool_queue=False)]) is None


def move(pool, index, records, waiting=None, attempts=(), spill=4):
    return routing.move(pool=pool, family="subtitle", family_queue="subtitle", ladder="subtitle", rungs=RUNGS,
                        index=index, attempts=list(attempts), records=records, depths=depths_of(waiting or {}),
                        spill_depth=spill)  # fmt: skip


def test_a_downgrade_to_another_pools_best_rung_moves_the_job() -> None:
    # Killed on large and small on the GPU: tiny is the CPU pool's best, the GPU slot is freed.
    route = move("gpu0", 2, [GPU, CPU])
    assert (route.queue, route.rung) == ("subtitle@cpu", "tiny")
    assert "this slot is freed" in route.reason
    # Killed only on large: small is still the GPU pool's own, it stays.
    assert move("gpu0", 1, [GPU, CPU]) is None


def test_a_job_stays_when_no_other_pool_has_that_rung_as_its_best() -> None:
    assert move("gpu0", 2, [GPU, PLAIN]) is None
    assert move("cpu", 2, [GPU, CPU]) is None  # already where its rung is best


def test_a_job_where_the_best_rung_left_cannot_run_goes_to_a_pool_that_can() -> None:
    route = move("plain", 0, [GPU, CPU, PLAIN])
    assert (route.pool, route.rung) == ("gpu0", "large")
    assert "cannot run large" in route.reason


def test_a_move_into_a_full_queue_is_not_made_when_the_job_can_run_here() -> None:
    assert move("gpu0", 2, [GPU, CPU], {"subtitle@cpu": 4}) is None
    assert move("plain", 0, [GPU, PLAIN], {"subtitle@gpu0": 4}) is None  # plain runs sphinx meanwhile
    # Nothing runs here: it moves into the full queue all the same.
    nothing = record("none@f", "none", ())
    assert move("none", 0, [GPU, nothing], {"subtitle@gpu0": 4}).pool == "gpu0"


def test_a_job_moves_once_per_rung() -> None:
    moved = Attempt(2, "tiny", Outcome.MOVED, "moved", worker="gpu0@a")
    assert move("gpu0", 2, [GPU, CPU], attempts=[moved]) is None


def test_a_moved_attempt_spends_no_rung_and_counts_for_nothing() -> None:
    attempt = reroute.moved_attempt(2, "tiny", "moved to queue subtitle@cpu", 1, "gpu0@a")
    assert attempt.outcome == Outcome.MOVED and not attempt.outcome.moves_down
    assert (attempt.counted, attempt.cause) == (False, "moved")
