"""What reaches a worker besides well-formed jobs: repeated submits, foreign serialisations,
unknown task names (issue #10, items 5 and 6). Real Redis, real workers."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from mediafarm import submit
from mediafarm.tasks.app import app

pytestmark = pytest.mark.integration


def received(worker, job_id: str) -> int:
    return worker.log_tail(2_000_000).count(f"[{job_id}] received")


def test_a_job_id_submitted_twice_runs_once(cpu_worker) -> None:
    job_id = f"order-{uuid.uuid4()}"
    first = submit("toy", job_id=job_id, text="one two")
    again = submit("toy", job_id=job_id, text="one two")
    assert first.id == again.id == job_id
    assert again.wait(timeout=60)["output"]["words"] == ["ONE", "TWO"]
    # A later submit, after the job finished, is still the same job: nothing is sent.
    assert submit("toy", job_id=job_id, text="one two").wait(timeout=10)["job_id"] == job_id
    time.sleep(0.5)
    assert received(cpu_worker, job_id) == 1 and len(first.attempts()) == 1
    with pytest.raises(ValueError, match="already submitted with another family or other fields"):
        submit("toy", job_id=job_id, text="something else")


def test_racing_submits_of_one_job_id_send_one_job(cpu_worker) -> None:
    job_id = f"race-{uuid.uuid4()}"
    start = threading.Barrier(8)
    handles = []

    def go() -> None:
        start.wait()
        handles.append(submit("toy", job_id=job_id, text="race me"))

    threads = [threading.Thread(target=go) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {h.id for h in handles} == {job_id} and len(handles) == 8
    handles[0].wait(timeout=60)
    time.sleep(0.5)
    assert received(cpu_worker, job_id) == 1


def test_a_job_id_no_folder_can_hold_is_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="cannot name a storage folder"):
        submit("toy", job_id="x" * 300, text="a")


def test_pickle_and_unknown_tasks_are_refused_with_a_reason_and_the_worker_lives(cpu_worker) -> None:
    # A producer that pushes pickle straight onto a queue, and one that names a task nobody runs.
    pickled = app.send_task("farm.toy.count", kwargs={"text": "x"}, queue="toy", serializer="pickle")
    unknown = app.send_task("farm.nope.nothing", kwargs={}, queue="toy")
    deadline = time.monotonic() + 30
    log = ""
    while time.monotonic() < deadline:
        log = cpu_worker.log_tail(2_000_000)
        if "untrusted content of type pickle" in log and "farm.nope.nothing" in log:
            break
        time.sleep(0.2)
    assert "Refusing to deserialize untrusted content of type pickle" in log
    assert "Received unregistered task of type 'farm.nope.nothing'" in log and "discarded" in log
    # Neither comes back to be refused again, and the worker serves the next job.
    assert submit("toy", text="still here").wait(timeout=60)["output"]["words"] == ["STILL", "HERE"]
    assert cpu_worker.process.poll() is None
    # The unknown task ends FAILURE, so its producer learns why; the pickle message is never
    # decoded (its producer only sees it stay PENDING: only the worker's log can say why).
    from mediafarm.tasks.producer.client import handle
    from mediafarm.tasks.wire.errors import JobRejected

    with pytest.raises(JobRejected, match="farm.nope.nothing"):
        handle(unknown.id).wait(timeout=10)
    assert app.backend.get_task_meta(pickled.id)["status"] == "PENDING"
    time.sleep(1.0)
    assert cpu_worker.log_tail(2_000_000).count("farm.nope.nothing") == log.count("farm.nope.nothing")
