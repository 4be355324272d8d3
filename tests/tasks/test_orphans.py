"""Jobs left in a pool queue whose pool has no live worker (tasks.runtime.orphans), on the session's real Redis."""

from __future__ import annotations

import uuid

import pytest
import redis

from mediafarm.config.priorities import redis_lists
from mediafarm.tasks.runtime.orphans import OrphanSweep
from mediafarm.tasks.wire.capability import WorkerCapability


@pytest.fixture()
def broker(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def test_after_the_grace_a_dead_pools_backlog_moves_to_the_family_queue_in_order(broker: redis.Redis) -> None:
    family = f"fam-{uuid.uuid4().hex[:6]}"
    dead, low = redis_lists(f"{family}@dead")[0], redis_lists(f"{family}@dead")[-1]
    for n in range(3):
        broker.lpush(dead, f"job-{n}")  # kombu pushes left and pops right: job-0 is the oldest
    broker.lpush(low, "urgent")
    sweep = OrphanSweep(grace=10)
    live = [WorkerCapability("w@h", "alive", (family,))]
    assert sweep.run(broker, live, ["alive", "dead"], {"f": family}, now=100.0) == {}
    assert sweep.run(broker, live, ["alive", "dead"], {"f": family}, now=109.0) == {}  # within the grace
    assert broker.llen(dead) == 3
    assert sweep.run(broker, live, ["alive", "dead"], {"f": family}, now=110.0) == {f"{family}@dead": 4}
    assert broker.llen(dead) == 0 and broker.llen(low) == 0
    target, target_low = redis_lists(family)[0], redis_lists(family)[-1]
    assert [broker.rpop(target) for _ in range(3)] == [b"job-0", b"job-1", b"job-2"]  # served oldest first
    assert broker.rpop(target_low) == b"urgent"  # its priority kept


def test_a_pool_that_comes_back_within_the_grace_keeps_its_queue(broker: redis.Redis) -> None:
    family = f"fam-{uuid.uuid4().hex[:6]}"
    broker.lpush(f"{family}@gpu", "job")
    sweep = OrphanSweep(grace=10)
    assert sweep.run(broker, [], ["gpu"], {"f": family}, now=0.0) == {}
    back = [WorkerCapability("gpu@h", "gpu", (f"{family}@gpu",))]
    assert sweep.run(broker, back, ["gpu"], {"f": family}, now=5.0) == {}
    # Gone again: the grace starts over, from the first look that finds it absent.
    assert sweep.run(broker, [], ["gpu"], {"f": family}, now=12.0) == {}
    assert sweep.run(broker, [], ["gpu"], {"f": family}, now=21.0) == {}
    assert sweep.run(broker, [], ["gpu"], {"f": family}, now=22.0) == {f"{family}@gpu": 1}
    assert broker.llen(family) == 1
