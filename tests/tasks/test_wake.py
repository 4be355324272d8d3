"""Waking a pool at zero replicas (``tasks.producer.wake``): which pools a job wants, judged from the pools'
last known or declared records; the wanted sets on the session's real Redis; and the load they
give a pool with no replica (``tasks.producer.scaling``)."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from mediafarm.config.ladders import Ladder, Rung
from mediafarm.config.pools import Pool
from mediafarm.tasks.producer import scaling, wake
from mediafarm.tasks.wire import capability, keys
from mediafarm.tasks.wire.capability import WorkerCapability
from mediafarm.tasks.wire.worker_load import WorkerLoad
from tests.tasks.test_routing import CPU, GPU, PLAIN, RUNGS


def wants(dormant, chosen, start=0):
    return wake.wanting(family="subtitle", family_queue="subtitle", ladder="subtitle", rungs=RUNGS,
                        dormant=dormant, chosen=chosen, start=start)  # fmt: skip


def test_a_dormant_pool_is_wanted_only_for_a_better_rung_than_the_chosen_one() -> None:
    # gpu0 (no live worker) runs "large", the best; the live cpu pool was chosen, on "tiny" (index 2).
    assert wants([GPU], chosen=2) == [wake.Want("gpu0", "large")]
    # A dormant pool whose best rung is no better than the chosen one is not wanted.
    assert wants([PLAIN], chosen=2) == []
    assert wants([CPU], chosen=2) == []
    # No live pool runs any rung: every dormant pool that runs one is wanted, best first.
    assert wants([PLAIN, GPU], chosen=None) == [wake.Want("gpu0", "large"), wake.Want("plain", "sphinx")]
    # A job asked to start lower (start=1) wants gpu0 for its "small", not "large".
    assert wants([GPU], chosen=2, start=1) == [wake.Want("gpu0", "small")]


def test_only_wake_pools_are_dormant_known_by_their_workers_records_else_by_their_declaration() -> None:
    declared = {"gpu0": Pool("gpu0", queues=("*",), gpus=(0,)), "cpu": Pool("cpu", queues=("*",)),
                "spare": Pool("spare", queues=("*",)), "quiet": Pool("quiet", queues=("*",))}  # fmt: skip
    judged: list[str] = []

    def judge(pool: Pool) -> WorkerCapability:
        judged.append(pool.name)
        return WorkerCapability(f"{pool.name}@declared", pool.name, ())

    # cpu is live; gpu0 was seen (its workers' records are kept); "spare" was never seen live;
    # "quiet" is declared but not in FARM_WAKE_POOLS: nothing wakes it; "gone" is neither known nor declared.
    out = wake.dormant_records(["gpu0", "cpu", "spare", "gone"], [CPU], {"gpu0": GPU, "cpu": CPU}, declared, judge)
    assert [r.node for r in out] == ["gpu0@a", "spare@declared"]
    assert judged == ["spare"]
    assert wake.dormant_records([], [], {"gpu0": GPU}, declared, judge) == []


def test_a_pools_known_record_is_what_any_of_its_workers_could_run() -> None:
    # Two workers of one pool: one without the large model, one with it whose language list is English.
    a = WorkerCapability("gpu0@a", "gpu0", ("subtitle", "subtitle@gpu0"), served=("subtitle",), at=5.0,
                         rungs={"subtitle": {"subtitle": {"large": "weights absent", "small": ""}}},
                         languages={"subtitle": {"subtitle": {"small": ("en",)}}})  # fmt: skip
    b = WorkerCapability("gpu0@b", "gpu0", ("gpu0.subtitle", "subtitle@gpu0"), served=("subtitle",), at=7.0,
                         rungs={"subtitle": {"subtitle": {"large": "", "small": "no GPU"}}},
                         languages={"subtitle": {"subtitle": {"large": ("en",), "small": ("fr",)}}})  # fmt: skip
    pool = capability.merged("gpu0", [a, b])
    assert (pool.node, pool.pool, pool.at) == ("gpu0@known", "gpu0", 7.0)
    assert pool.queues == ("subtitle", "subtitle@gpu0", "gpu0.subtitle")
    assert pool.runnable("subtitle") == {"subtitle": ("large", "small")}
    # "large" is recorded only by b (a records none for it: any); "small" by both.
    assert pool.languages["subtitle"]["subtitle"] == {"small": ("en", "fr")}
    assert pool.handles("subtitle", "subtitle", "large", "de")


def test_a_declared_pool_runs_every_rung_of_its_families_but_cuda_rungs_without_a_gpu() -> None:
    ladder = Ladder("subtitle", "subtitle", (Rung("large", "whisper", device="cuda"), Rung("sphinx", "sphinx")))

    class Spec:
        name, queue = "subtitle", "subtitle"

    specs = {"subtitle": Spec()}
    gpu = wake.declared_record(Pool("gpu0", queues=("gpu0.*", "*"), gpus=(0,)), specs, lambda s: [ladder],
                               ["subtitle"])  # fmt: skip
    cpu = wake.declared_record(Pool("cpu", queues=("*",)), specs, lambda s: [ladder], ["subtitle"])
    assert gpu.queues == ("gpu0.subtitle", "subtitle", "subtitle@gpu0") and gpu.served == ("subtitle",)
    assert gpu.runnable("subtitle") == {"subtitle": ("large", "sphinx")}
    assert cpu.runnable("subtitle") == {"subtitle": ("sphinx",)}
    assert cpu.rungs["subtitle"]["subtitle"]["large"] == wake.NO_DECLARED_GPU
    # Routing reads it as a record: the GPU pool would start a job on "large".
    assert wake.wanting(family="subtitle", family_queue="subtitle", ladder="subtitle", rungs=("large", "sphinx"),
                        dormant=[gpu, cpu], chosen=1) == [wake.Want("gpu0", "large", declared=True)]  # fmt: skip


def test_the_route_reason_names_each_wanted_pool() -> None:
    assert wake.note([]) == ""
    said = wake.note([wake.Want("gpu0", "large"), wake.Want("gpu1", "small", declared=True)])
    assert "pool gpu0 would run large" in said and "FARM_WAKE_WINDOW" in said, said
    assert "pool gpu1 (by its declaration: never seen live) would run small" in said, said


def test_wanted_jobs_are_counted_within_the_window_by_the_servers_clock(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    a, b = f"wake-a-{uuid.uuid4().hex[:6]}", f"wake-b-{uuid.uuid4().hex[:6]}"
    try:
        wake.want(client, [a, b], "job-1", 1.0)
        wake.want(client, [a], "job-2", 1.0)
        wake.want(client, [a], "job-2", 1.0)  # the same job again: counted once
        assert wake.wanted_counts(client, [a, b, "nobody"], 1.0) == {a: 2, b: 1, "nobody": 0}
        assert 0 < client.ttl(keys.wanted(a)) <= 1
        time.sleep(1.2)
        assert wake.wanted_counts(client, [a, b], 1.0) == {a: 0, b: 0}
        # A window of 0 turns waking off: nothing is written, nothing read.
        wake.want(client, [a], "job-3", 0)
        assert wake.wanted_counts(client, [a], 0) == {a: 0}
        assert client.zcard(keys.wanted(a)) == 0
    finally:
        client.delete(keys.wanted(a), keys.wanted(b))


def test_a_pools_records_are_kept_after_its_workers_forget_their_own(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    pool = f"kept-{uuid.uuid4().hex[:6]}"
    record = WorkerCapability(f"{pool}@h", pool, ("subtitle", f"subtitle@{pool}"), served=("subtitle",),
                              rungs={"subtitle": {"subtitle": {"large": ""}}})  # fmt: skip
    lost = WorkerCapability(f"{pool}@g", pool, ("subtitle",), rungs={"subtitle": {"subtitle": {"large": "GPU lost"}}})
    try:
        capability.advertise(client, record)
        capability.advertise(client, lost, remember=False)  # degraded for a while: not kept for a week
        capability.forget(client, record.node)
        assert record.node not in {r.node for r in capability.live(client)}
        known = capability.known_pools(client)[pool]
        assert (known.node, known.queues, known.runnable("subtitle")) == (f"{pool}@known", record.queues,
                                                                          {"subtitle": ("large",)})  # fmt: skip
    finally:
        client.hdel(keys.pool_capabilities(), record.node, lost.node)
        client.hdel(keys.capabilities(), lost.node)


def test_a_submit_counts_as_wanting_a_dormant_wake_pool_and_never_fails_for_it(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redis.exceptions import ResponseError

    from mediafarm.config.settings import get_settings
    from mediafarm.tasks.producer import client as producer

    backend = redis.Redis.from_url(redis_url)
    pool = f"woken-{uuid.uuid4().hex[:6]}"
    # A pool seen once, able to run the top rung of the chaos ladder unavailable_first, which no
    # worker of this session runs ("fancy" needs a package none has).
    record = WorkerCapability(f"{pool}@h", pool, ("chaos", f"chaos@{pool}"), served=("chaos",),
                              rungs={"chaos": {"unavailable_first": {"fancy": "", "gpu-only": "", "plain": ""}}})  # fmt: skip
    capability.advertise(backend, record)
    capability.forget(backend, record.node)
    sent: list[dict] = []

    class Sent:
        def __init__(self, **options) -> None:
            sent.append(options)
            self.id = options["task_id"] or f"job-{len(sent)}"

    settings = get_settings().model_copy(update={"wake_pools": [pool], "wake_window": 60.0})
    monkeypatch.setattr(producer, "get_settings", lambda: settings)
    monkeypatch.setattr(producer.app, "send_task", lambda name, **options: Sent(**options))
    producer._records_cache.clear()
    try:
        handle = producer.submit("chaos", ladder="unavailable_first")
        assert wake.wanted_counts(backend, [pool], 60.0) == {pool: 1}
        assert backend.zscore(keys.wanted(pool), handle.id) is not None
        # A queue the producer names is kept: no routing, nothing wanted.
        producer.submit("chaos", ladder="unavailable_first", queue="my-own-queue")
        assert sent[-1]["queue"] == "my-own-queue" and wake.wanted_counts(backend, [pool], 60.0) == {pool: 1}

        # Redis refusing the want (a failover's read-only replica): the job was sent, so the submit stands.
        def refuse(*args, **kwargs):
            raise ResponseError("READONLY You can't write against a read only replica.")

        monkeypatch.setattr(wake, "want", refuse)
        before = len(sent)
        assert producer.submit("chaos", ladder="unavailable_first").id and len(sent) == before + 1
    finally:
        backend.hdel(keys.pool_capabilities(), record.node)
        backend.delete(keys.wanted(pool))
        producer._records_cache.clear()


def test_a_pool_at_zero_replicas_reads_load_one_while_jobs_want_it() -> None:
    pools = {"gpu0": Pool("gpu0", queues=("*",), gpus=(0,), concurrency=2), "cpu": Pool("cpu", queues=("*",))}
    live = [WorkerCapability("cpu@a", "cpu", ("subtitle", "subtitle@cpu"), served=("subtitle",))]

    def signals(wanted):
        return scaling.pool_signals(pools, live, [], lambda qs: {q: 0 for q in qs}, {"subtitle": "subtitle"},
                                    ["subtitle"], lambda names: {n: wanted.get(n, 0) for n in names})  # fmt: skip

    idle = signals({})
    assert (idle["gpu0"].load, idle["gpu0"].wanted) == (0.0, 0)
    woken = signals({"gpu0": 3, "cpu": 5})
    assert (woken["gpu0"].load, woken["gpu0"].wanted) == (1.0, 3)
    assert woken["gpu0"].to_dict()["wanted"] == 3
    # A pool with a live replica taking jobs is driven by its own jobs alone (cpu has none here).
    up = scaling.pool_signals(pools, live, [WorkerLoad("cpu@a", "cpu", slots=2, reserved=0, running=0)],
                              lambda qs: {q: 0 for q in qs}, {"subtitle": "subtitle"}, ["subtitle"],
                              lambda names: {"cpu": 5, "gpu0": 0})  # fmt: skip
    assert up["cpu"].load == 0.0
