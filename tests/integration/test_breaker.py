"""The rung circuit breaker on real prefork workers and the session's Redis (issue #15 item 2).

Two workers of one pool (``chaos``), each on a queue of its own so the test says which one runs a
job: what one worker's jobs open, the other's jobs obey. The ladders (farm-test.toml) open a
breaker after two resource failures a minute; ``breaker_oom``'s first rung raises a MemoryError
while a flag file exists, ``breaker_kill``'s is killed by the watchdog over the pool's cap.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mediafarm.tasks.app import app
from mediafarm.tasks.producer.client import submit
from mediafarm.tasks.runtime.breaker import BreakerState, read_breakers
from mediafarm.tasks.wire import keys

pytestmark = pytest.mark.integration

QUEUES = ("breaker-a", "breaker-b")


@pytest.fixture(scope="module")
def two_workers(start_worker: Any) -> tuple[Any, Any]:
    return tuple(start_worker("chaos", concurrency=1, queues=[q]) for q in QUEUES)


@pytest.fixture()
def clean() -> Iterator[None]:
    client = app.backend.client

    def wipe() -> None:
        client.delete(keys.breakers("chaos"), keys.rung_failures("chaos"),
                      *client.keys(f"{keys.PREFIX}:breaker-failures:chaos:breaker_*"))  # fmt: skip

    wipe()
    yield
    wipe()


def run(worker: int, ladder: str, **plan: Any) -> dict[str, Any]:
    return submit("chaos", queue=QUEUES[worker], ladder=ladder, plan=plan).wait(timeout=90)


def seen(envelope: dict[str, Any]) -> list[tuple[str, str]]:
    return [(a["variant"], a["outcome"]) for a in envelope["attempts"]]


def breaker(ladder: str, rung: str) -> BreakerState | None:
    found = [s for s in read_breakers(app.backend.client, "chaos") if (s.ladder, s.rung) == (ladder, rung)]
    return found[0] if found else None


def test_resource_failures_open_it_the_other_worker_obeys_a_probe_reopens_then_closes_it(
    two_workers: tuple[Any, Any], clean: None, tmp_path: Path
) -> None:
    flag = tmp_path / "heavy-fails"
    flag.touch()
    for _ in range(2):
        assert seen(run(0, "breaker_oom", fail_while=str(flag))) == [("heavy", "oom"), ("light", "ok")]
    state = breaker("breaker_oom", "heavy")
    assert state is not None and (state.state, state.failures) == ("open", 2)

    # The other worker starts the next job on the next rung: no attempt spent, the reason kept.
    envelope = run(1, "breaker_oom", fail_while=str(flag))
    assert seen(envelope) == [("heavy", "skipped"), ("light", "ok")]
    skipped = envelope["attempts"][0]
    assert skipped["worker"] == two_workers[1].node and skipped["duration"] is None
    assert "breaker open since" in skipped["reason"] and "2 failures in 60 s on pool chaos" in skipped["reason"]
    assert {a["retries"] for a in envelope["attempts"]} == {0}
    # Operators see it in `farm families`.
    families = subprocess.run([sys.executable, "-m", "mediafarm.workers.cli", "families"], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "COLUMNS": "250"})  # fmt: skip
    row = next((line for line in families.stdout.splitlines() if "breaker_oom" in line), "")
    assert "heavy" in row and "open" in row and "2 in 60 s" in row, families.stdout + families.stderr

    # After the cool-down one job probes the rung; it still fails: open again, a fresh cool-down.
    time.sleep(max(0.0, state.until - time.time()) + 0.2)
    envelope = run(1, "breaker_oom", fail_while=str(flag))
    assert seen(envelope) == [("heavy", "oom"), ("light", "ok")]
    assert "the breaker's probe" in envelope["attempts"][0]["reason"]
    state = breaker("breaker_oom", "heavy")
    assert state is not None and (state.state, state.opened) == ("open", 2)
    envelope = run(0, "breaker_oom", fail_while=str(flag))
    assert seen(envelope) == [("heavy", "skipped"), ("light", "ok")]
    assert "reopened after 1 failed probe(s)" in envelope["attempts"][0]["reason"]

    # The rung heals; the next probe succeeds and closes the breaker for every worker.
    flag.unlink()
    time.sleep(max(0.0, state.until - time.time()) + 0.2)
    envelope = run(0, "breaker_oom", fail_while=str(flag))
    assert seen(envelope) == [("heavy", "ok")] and "the breaker's probe" in envelope["attempts"][0]["reason"]
    assert breaker("breaker_oom", "heavy") is None
    envelope = run(1, "breaker_oom", fail_while=str(flag))
    assert seen(envelope) == [("heavy", "ok")] and envelope["attempts"][0]["reason"] == ""


def families_output() -> str:
    families = subprocess.run([sys.executable, "-m", "mediafarm.workers.cli", "families"], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "COLUMNS": "250"})  # fmt: skip
    assert families.returncode == 0, families.stderr
    return families.stdout


def test_watchdog_kills_open_it_too(two_workers: tuple[Any, Any], clean: None) -> None:
    # A killed child's attempt is settled by the job's next delivery, which counts it.
    for _ in range(2):
        envelope = run(0, "breaker_kill")
        assert seen(envelope) == [("hungry", "killed"), ("frugal", "ok")]
        killed = envelope["attempts"][0]
        assert (killed["counted"], killed["cause"]) == (True, "watchdog_cap")
    envelope = run(1, "breaker_kill")
    assert seen(envelope) == [("hungry", "skipped"), ("frugal", "ok")]
    assert "2 failures in 60 s" in envelope["attempts"][0]["reason"]
    rows = families_output().splitlines()
    row = next((line for line in rows if "breaker_kill" in line and "watchdog_cap" in line), "")
    assert "hungry" in row and " 2 " in row and "counted" in row and "not counted" not in row, families_output()


def test_outside_kills_never_open_it(two_workers: tuple[Any, Any], clean: None) -> None:
    from tests.support.kills import kill_running

    for _ in range(3):  # more than the two failures that open this ladder's breaker
        job = submit("chaos", queue=QUEUES[0], ladder="breaker_outside")
        kill_running(job, "patient", after=0.5)
        envelope = job.wait(timeout=90)
        assert seen(envelope) == [("patient", "killed"), ("frugal", "ok")]
        killed = envelope["attempts"][0]
        assert killed["counted"] is False and killed["cause"] in ("outside_kill", "unknown_kill"), killed
    assert breaker("breaker_outside", "patient") is None
    # The next job, on the other worker, still starts on the first rung.
    assert seen(run(1, "breaker_outside")) == [("patient", "ok")]
    row = next((line for line in families_output().splitlines() if "breaker_outside" in line and "_kill" in line), "")
    assert "patient" in row and " 3 " in row and "not counted" in row, families_output()


def test_under_memory_pressure_a_ladder_that_steps_down_starts_new_jobs_one_rung_lower(
    two_workers: tuple[Any, Any],
) -> None:
    from mediafarm.tasks.producer.admission import Reading, publish_reading
    from mediafarm.tasks.producer.client import JobHandle

    def send() -> dict[str, Any]:
        # Straight to the queue, as a foreign client may: the worker decides, whatever the producer did.
        result = app.send_task("farm.test.chaos", kwargs={"ladder": "pressure_steps"}, queue=QUEUES[0])
        return JobHandle(result.id, "chaos").wait(timeout=60)

    assert seen(send()) == [("roomy", "ok")]
    # Any fresh reading of one worker of the pool below its thresholds is pressure on the pool.
    publish_reading(app.backend.client, "chaos", Reading("squeezed@test", time.time(), 1.0, 64_000.0, {}))
    envelope = send()
    assert seen(envelope) == [("roomy", "skipped"), ("snug", "ok")]
    reason = envelope["attempts"][0]["reason"]
    assert "pool 'chaos' is under memory pressure" in reason and "the ladder steps down under pressure" in reason
    app.backend.client.delete(keys.pressure("chaos"))
    assert seen(send()) == [("roomy", "ok")]
