"""How a job's end reads to an operator (issue #18 items 2 and 5), on a real Redis and a chaos
worker of its own (one child, its own queue), whose log is read line by line.

- A rejection (bad input) is one WARNING line naming the job, its family, its rung and the reason,
  and no traceback; an engine error (a bug) is still an ERROR with its traceback.
- A cancelled job is REVOKED, for the client, ``farm status`` and Flower alike, whether it was
  cancelled before it ran, as it ran, or as a pipeline's part; its history keeps the cancelled attempt.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest

from mediafarm import JobCancelled, JobFailed, JobRejected, LadderExhausted, submit
from mediafarm.tasks.app import app
from mediafarm.tasks.producer.client import JobHandle, handle, send_plan
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.plan import Part, Plan
from tests.conftest import REPO

pytestmark = pytest.mark.integration

QUEUE = "chaos-ends"


@pytest.fixture(scope="module")
def worker(start_worker):
    # One child: a job sent while another runs waits in the queue (cancelled while queued).
    return start_worker("chaos", concurrency=1, queues=[QUEUE])


def log_size(worker) -> int:
    return worker.log.stat().st_size


def log_since(worker, offset: int, job_id: str, last: str, timeout: float = 30) -> str:
    """The worker's log from ``offset`` once a line naming ``job_id`` and ``last`` (the last line
    Celery writes for such an end) is there, and a moment more for anything behind it."""
    deadline = time.monotonic() + timeout
    while True:
        text = worker.log.read_bytes()[offset:].decode(errors="replace")
        if any(job_id in line and last in line for line in text.splitlines()):
            time.sleep(0.5)
            return worker.log.read_bytes()[offset:].decode(errors="replace")
        assert time.monotonic() < deadline, f"no line with {job_id} and {last!r} in:\n{text[-4000:]}"
        time.sleep(0.1)


def lines_at(log: str, level: str) -> list[str]:
    return [line for line in log.splitlines() if f"{level}/" in line or f" {level} " in line]


def test_a_rejected_job_logs_one_warning_naming_it_and_no_traceback(worker) -> None:
    start = log_size(worker)
    job = submit("chaos", queue=QUEUE, ladder="bad")
    with pytest.raises(JobRejected, match="malformed on purpose"):
        job.wait(timeout=60)
    log = log_since(worker, start, job.id, "raised expected")
    [line] = lines_at(log, "WARNING")
    assert job.id in line and "rejected" in line and "family chaos" in line and "rung strict" in line
    assert "PermanentFailure: chaos: this input is malformed on purpose" in line
    assert "Traceback" not in log and not lines_at(log, "ERROR"), log
    assert job.state() == "FAILURE"  # a rejection is still a failure, for Celery and Flower


@pytest.mark.parametrize(
    ("args", "kwargs", "reason"),
    [((), {"ladder": 5}, "ladder must name a ladder"), ((1,), {"ladder": "bad"}, "keyword arguments only")],
    ids=["ladder-not-a-name", "positional-arguments"],
)
def test_a_job_refused_before_any_rung_names_no_rung(worker, args: tuple, kwargs: dict, reason: str) -> None:
    # Sent as a plain Celery client would, unchecked: the worker refuses it.
    start = log_size(worker)
    job_id = app.send_task("farm.test.chaos", args=args, kwargs=kwargs, queue=QUEUE).id
    with pytest.raises(JobRejected, match=reason):
        handle(job_id).wait(timeout=60)
    log = log_since(worker, start, job_id, "raised expected")
    [line] = lines_at(log, "WARNING")
    assert job_id in line and "family chaos, rung -:" in line and reason in line
    assert "Traceback" not in log and not lines_at(log, "ERROR"), log


def test_an_exhausted_ladder_logs_one_warning_and_no_traceback(worker) -> None:
    # Every rung killed for its memory: the pool's lack of resources, no bug; the history says why.
    start = log_size(worker)
    job = submit("chaos", queue=QUEUE, ladder="kill_all")
    with pytest.raises(LadderExhausted):
        job.wait(timeout=90)
    log = log_since(worker, start, job.id, "raised expected")
    # The watchdog's kill lines are WARNINGs of their own, one a kill; the job's end is one more.
    [line] = [w for w in lines_at(log, "WARNING") if "watchdog" not in w]
    assert job.id in line and "family chaos" in line and "no rung of the kill_all ladder is left" in line
    assert "Traceback" not in log and not lines_at(log, "ERROR"), log


def test_an_engine_error_is_still_an_error_with_its_traceback(worker) -> None:
    start = log_size(worker)
    # The ok engine reads plan.sleep with float(): a ValueError inside the engine, as a bug would raise.
    job = submit("chaos", queue=QUEUE, ladder="steady", plan={"sleep": "not a number"})
    with pytest.raises(JobFailed, match="ValueError") as caught:
        job.wait(timeout=60)
    assert type(caught.value) is JobFailed
    log = log_since(worker, start, job.id, "raised unexpected")
    errors = lines_at(log, "ERROR")
    assert len(errors) == 1 and job.id in errors[0] and "EngineError" in errors[0], log
    assert "Traceback" in log and "ValueError: could not convert string to float" in log
    assert not lines_at(log, "WARNING"), log


class FlowerView:
    """Celery's own event state machine, as Flower keeps it, fed by a receiver on a thread."""

    def __init__(self) -> None:
        self.state = app.events.State()
        self._listening = threading.Event()
        self._stop = threading.Event()
        threading.Thread(target=self._listen, daemon=True).start()
        assert self._listening.wait(15), "no worker event reached the receiver"

    def _on_event(self, event: dict[str, Any]) -> None:
        self.state.event(event)
        if event["type"] == "worker-heartbeat":
            self._listening.set()

    def _listen(self) -> None:
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers={"*": self._on_event})
            for _ in receiver.itercapture(limit=None, timeout=None, wakeup=True):
                if self._stop.is_set():
                    break

    def state_of(self, job_id: str, want: str, timeout: float = 15) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            task = self.state.tasks.get(job_id)
            if task is not None and task.state == want:
                return want
            time.sleep(0.1)
        task = self.state.tasks.get(job_id)
        return task.state if task is not None else "unseen"

    def close(self) -> None:
        self._stop.set()


def test_a_job_cancelled_as_it_ran_is_revoked_with_its_cancelled_attempt(worker) -> None:
    flower = FlowerView()
    try:
        # What a worker that missed the revoke sees: the cancel flag alone. The ok engine never
        # checks it; the job is refused its output as it ends.
        job_id = f"ends-{uuid.uuid4()}"
        app.backend.client.set(keys.cancel(job_id), "1", ex=600)
        start = log_size(worker)
        app.send_task("farm.test.chaos", kwargs={"ladder": "steady"}, task_id=job_id, queue=QUEUE)
        job = handle(job_id, "chaos")
        with pytest.raises(JobCancelled) as caught:
            job.wait(timeout=60)
        assert job.state() == "REVOKED"
        assert [a["outcome"] for a in caught.value.attempts] == ["cancelled"]
        assert [a["outcome"] for a in job.attempts()] == ["cancelled"]
        assert flower.state_of(job_id, "REVOKED") == "REVOKED"
    finally:
        flower.close()
    farm = [sys.executable, "-m", "mediafarm.workers.cli"]
    status = subprocess.run([*farm, "status", job_id], env={**os.environ, "COLUMNS": "200"}, cwd=REPO,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert f"{job_id}: REVOKED" in status.stdout and "cancelled" in status.stdout, status.stdout
    log = log_since(worker, start, job_id, "ignored")
    cancelled = [line for line in log.splitlines() if "cancelled" in line and job_id in line]
    assert len(cancelled) == 1 and "INFO" in cancelled[0] and "family chaos, rung a:" in cancelled[0], log
    assert "Traceback" not in log and not lines_at(log, "WARNING") and not lines_at(log, "ERROR"), log


def test_a_job_cancelled_while_queued_is_revoked_and_never_ran(worker) -> None:
    busy = submit("chaos", queue=QUEUE, ladder="slow")  # holds the one child for 4 s
    deadline = time.monotonic() + 30
    while busy.state() != "STARTED":
        assert time.monotonic() < deadline, "the first job never started"
        time.sleep(0.05)
    queued = submit("chaos", queue=QUEUE, ladder="steady")
    queued.cancel()
    with pytest.raises(JobCancelled):
        queued.wait(timeout=60)
    assert queued.state() == "REVOKED" and queued.attempts() == []
    assert busy.wait(timeout=60)["variant"] == "only"


def test_a_pipeline_part_cancelled_as_it_ran_ends_the_pipeline_as_cancelled(worker) -> None:
    pipeline = f"ends-pipe-{uuid.uuid4()}"
    parts = (Part("chaos", f"{pipeline}-1", {"ladder": "steady"}, "part 1"),
             Part("chaos", f"{pipeline}-2", {"ladder": "steady"}, "part 2"))  # fmt: skip
    app.backend.client.set(keys.cancel(parts[0].job_id), "1", ex=600)
    start = log_size(worker)
    job = send_plan(Plan(parts, Part("chaos", pipeline, {"ladder": "steady"}, "fan-in")), queue=QUEUE)
    # The cancelled part is counted in the chord: the fan-in job is settled, not left waiting.
    with pytest.raises(JobCancelled, match="part 1"):
        job.wait(timeout=60)
    assert JobHandle(parts[0].job_id, "chaos").state() == "REVOKED"
    # The pipeline itself reads cancelled too (Celery stored its fan-in job's ChordError as a FAILURE).
    assert job.state() == "REVOKED" and JobHandle(pipeline, "").state() == "REVOKED"
    assert [a["outcome"] for a in JobHandle(parts[0].job_id, "chaos").attempts()] == ["cancelled"]
    assert JobHandle(parts[1].job_id, "chaos").state() == "SUCCESS"
    assert JobHandle(pipeline, "chaos").attempts() == []  # the fan-in job never ran
    log = log_since(worker, start, parts[1].job_id, "succeeded in")
    assert "Traceback" not in log and not lines_at(log, "WARNING") and not lines_at(log, "ERROR"), log


def test_a_pipeline_part_rejected_logs_one_warning_and_no_traceback(worker) -> None:
    pipeline = f"ends-pipe-{uuid.uuid4()}"
    parts = (Part("chaos", f"{pipeline}-1", {"ladder": "bad"}, "part 1"),
             Part("chaos", f"{pipeline}-2", {"ladder": "steady"}, "part 2"))  # fmt: skip
    start = log_size(worker)
    job = send_plan(Plan(parts, Part("chaos", pipeline, {"ladder": "steady"}, "fan-in")), queue=QUEUE)
    with pytest.raises(JobRejected, match="part 1"):
        job.wait(timeout=60)
    assert job.state() == "FAILURE"  # a refused part is no cancel
    log_since(worker, start, parts[0].job_id, "raised expected")
    log = log_since(worker, start, parts[1].job_id, "succeeded in")
    [line] = lines_at(log, "WARNING")
    assert parts[0].job_id in line and "rejected" in line and "rung strict" in line
    assert "Traceback" not in log and not lines_at(log, "ERROR"), log
