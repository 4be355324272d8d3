"""How a job's end reads to an operator (issue #18 item 2), on a real Redis and a chaos worker of
its own (one child, its own queue), whose log is read line by line.

- A rejection (bad input) is one WARNING line naming the job, its family, its rung and the reason,
  and no traceback; an engine error (a bug) is still an ERROR with its traceback.
"""

from __future__ import annotations

import time
import uuid

import pytest

from mediafarm import JobFailed, JobRejected, submit
from mediafarm.tasks.app import app
from mediafarm.tasks.client import handle, send_plan
from mediafarm.tasks.plan import Part, Plan

pytestmark = pytest.mark.integration

QUEUE = "chaos-ends"


@pytest.fixture(scope="module")
def worker(start_worker):
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


def test_a_pipeline_part_rejected_logs_one_warning_and_no_traceback(worker) -> None:
    pipeline = f"ends-pipe-{uuid.uuid4()}"
    parts = (Part("chaos", f"{pipeline}-1", {"ladder": "bad"}, "part 1"),
             Part("chaos", f"{pipeline}-2", {"ladder": "steady"}, "part 2"))  # fmt: skip
    start = log_size(worker)
    job = send_plan(Plan(parts, Part("chaos", pipeline, {"ladder": "steady"}, "fan-in")), queue=QUEUE)
    with pytest.raises(JobRejected, match="part 1"):
        job.wait(timeout=60)
    log_since(worker, start, parts[0].job_id, "raised expected")
    log = log_since(worker, start, parts[1].job_id, "succeeded in")
    [line] = lines_at(log, "WARNING")
    assert parts[0].job_id in line and "rejected" in line and "rung strict" in line
    assert "Traceback" not in log and not lines_at(log, "ERROR"), log
