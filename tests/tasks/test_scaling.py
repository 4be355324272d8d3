"""The pools' scaling signal (``tasks.producer.scaling``) from hand-built records and depths, the load
records it sums (``tasks.wire.worker_load``) on the session's real Redis, and the depths read over
every priority list."""

from __future__ import annotations

import uuid

import pytest
import redis

from mediafarm.config.pools import Pool
from mediafarm.config.priorities import REDIS_PRIORITY_STEPS, redis_lists
from mediafarm.tasks.producer import scaling
from mediafarm.tasks.wire import keys, worker_load
from mediafarm.tasks.wire.capability import WorkerCapability
from mediafarm.tasks.wire.worker_load import WorkerLoad

FAMILY_QUEUES = {"subtitle": "subtitle", "tts": "tts"}
DEFAULT = ["subtitle", "tts"]
POOLS = {
    "cpu": Pool("cpu", queues=("*",), concurrency=2),
    "gpu0": Pool("gpu0", queues=("gpu0.*", "*"), gpus=(0,), concurrency=2),
    "gpu1": Pool("gpu1", queues=("gpu1.*", "*"), gpus=(1,), concurrency=3),  # at zero replicas
}
# The cpu worker runs no subtitle rung: it leaves the subtitle queues out.
RECORDS = [
    WorkerCapability("cpu@a", "cpu", ("tts", "tts@cpu"), {"subtitle": "subtitle: no rung runnable"}),
    WorkerCapability("gpu0@a", "gpu0", ("gpu0.subtitle", "gpu0.tts", "subtitle", "tts", "subtitle@gpu0", "tts@gpu0")),
    WorkerCapability("gpu0@b", "gpu0", ("gpu0.subtitle", "gpu0.tts", "subtitle", "tts", "subtitle@gpu0", "tts@gpu0")),
    WorkerCapability("edge@a", "edge", ("edge-q",)),  # a pool no configuration here declares
]
LOADS = [
    WorkerLoad("cpu@a", "cpu", slots=2, reserved=0, running=1),
    WorkerLoad("gpu0@a", "gpu0", slots=2, reserved=1, running=2),
    WorkerLoad("gpu0@b", "gpu0", slots=0, reserved=0, running=1, draining=True),  # its slots are going away
    WorkerLoad("edge@a", "edge", slots=4, reserved=0, running=0),
]
DEPTHS = {"subtitle": 5, "tts": 1, "subtitle@gpu0": 3, "gpu0.tts": 2, "tts@cpu": 4, "subtitle@cpu": 7,
          "gpu1.subtitle": 6, "edge-q": 2, "unrelated": 100}  # fmt: skip


def signals(records=RECORDS, loads=LOADS, depths=DEPTHS) -> dict[str, scaling.PoolSignal]:
    asked: list[list[str]] = []

    def read(queues):
        asked.append(list(queues))
        return {q: depths[q] for q in queues if q in depths}

    out = scaling.pool_signals(POOLS, records, loads, read, FAMILY_QUEUES, DEFAULT)
    assert len(asked) == 1 and len(asked[0]) == len(set(asked[0])), asked  # one read, each queue once
    return out


def test_each_pool_counts_its_queues_its_workers_jobs_and_its_slots() -> None:
    got = signals()
    gpu0 = got["gpu0"]
    # Its own queues of each family, its affinity queues and the shared family queues it consumes.
    assert gpu0.queues == {"gpu0.subtitle": 0, "gpu0.tts": 2, "subtitle": 5, "tts": 1, "subtitle@gpu0": 3,
                           "tts@gpu0": 0}  # fmt: skip
    assert (gpu0.queued, gpu0.reserved, gpu0.running) == (11, 1, 3)  # the draining worker's job still runs there
    assert (gpu0.slots, gpu0.replicas, gpu0.slots_per_replica) == (2, 1, 2.0)
    assert gpu0.jobs == 15 and gpu0.load == pytest.approx(7.5)
    # The cpu pool's worker can run no subtitle rung: no subtitle queue is its work, not even its own.
    cpu = got["cpu"]
    assert set(cpu.queues) == {"tts", "tts@cpu"} and cpu.queued == 5
    assert (cpu.reserved, cpu.running, cpu.slots, cpu.load) == (0, 1, 2, pytest.approx(3.0))


def test_a_pool_at_zero_replicas_has_a_load_from_its_declared_concurrency() -> None:
    gpu1 = signals()["gpu1"]
    assert set(gpu1.queues) == {"gpu1.subtitle", "gpu1.tts", "subtitle", "tts", "subtitle@gpu1", "tts@gpu1"}
    assert (gpu1.queued, gpu1.reserved, gpu1.running, gpu1.slots, gpu1.replicas) == (12, 0, 0, 0, 0)
    assert gpu1.slots_per_replica == 3.0 and gpu1.load == pytest.approx(4.0)  # 12 jobs, 3 slots a replica
    # With no worker live anywhere, the cpu pool takes its subtitle queues back.
    cold = signals(records=[], loads=[])
    assert "subtitle@cpu" in cold["cpu"].queues and cold["cpu"].queued == 5 + 1 + 7 + 4
    assert cold["gpu0"].slots == 0 and cold["gpu0"].load == pytest.approx(cold["gpu0"].queued / 2)
    assert set(cold) == {"cpu", "gpu0", "gpu1"}  # undeclared pools only through their live workers


def test_a_pool_only_a_live_worker_names_is_shown_with_what_that_worker_consumes() -> None:
    edge = signals()["edge"]
    assert edge.queues == {"edge-q": 2} and (edge.slots, edge.slots_per_replica, edge.load) == (4, 4.0, 0.5)


def test_an_idle_pool_has_load_zero_and_a_draining_pool_falls_back_to_its_declaration() -> None:
    idle = signals(depths={})
    assert all(s.queued == 0 for s in idle.values()) and idle["edge"].load == 0.0
    drained = signals(loads=[WorkerLoad("gpu0@b", "gpu0", slots=0, running=2, draining=True)])["gpu0"]
    assert (drained.slots, drained.replicas, drained.slots_per_replica, drained.running) == (0, 0, 2.0, 2)
    assert drained.to_dict()["load"] == pytest.approx((11 + 2) / 2, abs=1e-3)


def test_depths_count_every_priority_list_and_nothing_else(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"scaling-test-{uuid.uuid4().hex[:6]}"
    lists = redis_lists(queue)
    assert len(lists) == len(REDIS_PRIORITY_STEPS)
    try:
        for step, name in enumerate(lists):
            for _ in range(step % 3):  # 0, 1, 2, 0, ... messages per priority step
                client.rpush(name, b"m")
        client.rpush(f"{queue}-other", b"m")
        assert scaling.redis_depths(client, [queue, f"{queue}@nowhere"]) == {
            queue: sum(step % 3 for step in REDIS_PRIORITY_STEPS), f"{queue}@nowhere": 0,
        }  # fmt: skip
        assert client.llen(queue) == 0  # what the one-list recipe reads: nothing, with 9 waiting
    finally:
        client.delete(*lists, f"{queue}-other")


def test_load_records_are_written_with_the_servers_time_and_read_while_fresh(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    node = f"scale-t{uuid.uuid4().hex[:6]}@host"
    try:
        worker_load.write(client, WorkerLoad(node, "gpu0", slots=2, reserved=1, running=1))
        mine = [r for r in worker_load.live(client) if r.node == node]
        seconds, micros = client.time()
        assert len(mine) == 1 and (mine[0].slots, mine[0].reserved, mine[0].running) == (2, 1, 1)
        assert 0 <= seconds + micros / 1e6 - mine[0].at < 2
        stale = WorkerLoad(node, "gpu0", 2, at=100.0).to_json()
        assert worker_load.fresh([stale, b"not json"], now=100.0 + worker_load.STALE_S + 0.1) == []
        assert [r.node for r in worker_load.fresh([stale], now=100.0 + worker_load.STALE_S - 0.1)] == [node]
        worker_load.forget(client, node)
        assert node not in {r.node for r in worker_load.live(client)}
    finally:
        client.hdel(keys.worker_loads(), node)
