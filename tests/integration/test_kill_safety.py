"""Kill-safe children and downgrade ladders, on a real Redis and real prefork workers (issue #3).

The chaos family (tests/support/chaos.py) runs through the same FarmTask machinery as the
media jobs; its engines really allocate, really raise and really sleep.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from typing import Any

import psutil
import pytest

from mediafarm.tasks.app import app
from mediafarm.tasks.producer.client import JobHandle, submit
from mediafarm.tasks.wire.errors import JobRejected, LadderExhausted
from tests.support.kills import kill_children_at_random

pytestmark = pytest.mark.integration

# The session's other chaos workers stay up and serve the family's own queue: the tests below ask
# what this worker did (its metrics, its children), so they send to a queue only it serves.
OWN_QUEUE = "chaos-kill-safety"


@pytest.fixture(scope="session")
def chaos_worker(start_worker):
    from mediafarm.workers.embedded import free_port

    port = free_port()
    worker = start_worker("chaos", concurrency=2, queues=[OWN_QUEUE], env={"FARM_METRICS_PORT": str(port)})
    worker.metrics_url = f"http://127.0.0.1:{port}/metrics"
    return worker


def scrape(url: str, name: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def send(ladder: str, plan: dict[str, Any] | None = None) -> JobHandle:
    return submit("chaos", queue=OWN_QUEUE, ladder=ladder, plan=plan or {})


def outcomes(attempts: list[dict[str, Any]]) -> list[str]:
    return [a["outcome"] for a in attempts]


def test_job_over_the_cap_is_killed_and_completes_on_the_next_rung(chaos_worker) -> None:
    kills_before = scrape(chaos_worker.metrics_url, 'mediafarm_child_kills_total{pool="chaos",reason="killed"}')
    job = send("kill_once")
    envelope = job.wait(timeout=60)
    assert envelope["job_id"] == job.id and envelope["rung"] == "frugal" and envelope["rung_index"] == 1
    killed, ok = envelope["attempts"]
    assert (killed["outcome"], ok["outcome"]) == ("killed", "ok")
    assert "watchdog" in killed["reason"] and "cap of 400 MiB" in killed["reason"]
    assert (killed["counted"], killed["cause"]) == (True, "watchdog_cap")  # the rung's doing (runtime.attribution)
    assert killed["peak_rss_mb"] > 400 and killed["variant"] == "hungry"
    assert killed["pid"] != ok["pid"] or killed["retries"] < ok["retries"]
    assert chaos_worker.process.poll() is None
    # Operators see it in Prometheus.
    kills = scrape(chaos_worker.metrics_url, 'mediafarm_child_kills_total{pool="chaos",reason="killed"}')
    assert kills == kills_before + 1
    assert scrape(chaos_worker.metrics_url, 'mediafarm_child_rss_cap_bytes{pool="chaos"}') == 400 * 1024 * 1024


def test_killed_on_every_rung_fails_after_exactly_as_many_attempts(chaos_worker) -> None:
    job = send("kill_all")
    with pytest.raises(LadderExhausted) as info:
        job.wait(timeout=90)
    assert outcomes(info.value.attempts) == ["killed", "killed", "killed"]
    assert [a["variant"] for a in info.value.attempts] == ["big", "medium", "small"]
    assert "NoRungLeft" in info.value.reason
    assert job.state() == "FAILURE"


def test_memory_error_moves_down_and_leaves_the_worker_alive(chaos_worker) -> None:
    job = send("memerr")
    envelope = job.wait(timeout=60)
    assert outcomes(envelope["attempts"]) == ["oom", "ok"] and envelope["variant"] == "frugal"
    assert "MemoryError" in envelope["attempts"][0]["reason"]
    assert (envelope["attempts"][0]["counted"], envelope["attempts"][0]["cause"]) == (True, "out_of_memory")
    # Same main process, still answering, still serving.
    assert chaos_worker.process.poll() is None
    assert app.control.ping(destination=[chaos_worker.node], timeout=2)
    assert send("memerr").wait(timeout=60)["variant"] == "frugal"


def test_unavailable_rungs_are_skipped_without_spending_attempts(chaos_worker) -> None:
    envelope = send("unavailable_first").wait(timeout=60)
    assert outcomes(envelope["attempts"]) == ["unavailable", "unavailable", "ok"]
    fancy, gpu, _ = envelope["attempts"]
    assert "a_package_that_is_not_installed" in fancy["reason"] and "GPU" in gpu["reason"]
    assert {a["retries"] for a in envelope["attempts"]} == {0}  # no Celery retry was spent


def test_a_job_cancelled_before_it_ran_discards_the_output_of_an_engine_that_never_checks(chaos_worker) -> None:
    import uuid

    from mediafarm.tasks.producer.client import handle
    from mediafarm.tasks.wire import keys
    from mediafarm.tasks.wire.errors import JobCancelled

    # What a worker that missed the revoke sees: only the cancel flag; the `ok` engine never checks it.
    job_id = f"cam1:{uuid.uuid4()}"  # a producer's own id, with a character no file name should hold
    app.backend.client.set(keys.cancel(job_id), "1", ex=600)
    app.send_task("farm.test.chaos", kwargs={"ladder": "steady"}, task_id=job_id, queue=OWN_QUEUE)
    with pytest.raises(JobCancelled) as info:
        handle(job_id).wait(timeout=60)
    assert outcomes(info.value.attempts) == ["cancelled"]
    assert "before it ran; the output is discarded" in info.value.attempts[0]["reason"]


def test_bad_input_fails_once_without_retry(chaos_worker) -> None:
    job = send("bad")
    with pytest.raises(JobRejected, match="malformed on purpose"):
        job.wait(timeout=60)
    assert outcomes(job.attempts()) == ["rejected"]


def test_a_message_back_after_a_rejection_is_not_run_again(chaos_worker) -> None:
    # What a kill between the rejection's record and Celery storing the failure leaves (seen from
    # outside, 0.12 s after a 2 ms rejection): a history ending 'rejected' and the message back
    # with its retry count moved on (task_retry_on_worker_lost). Made here by hand, so the
    # redelivery is certain; the worker and its path are the real ones.
    import uuid

    from mediafarm.tasks.producer.client import handle
    from mediafarm.tasks.wire.history import AttemptLog
    from mediafarm.tasks.wire.records import Attempt, Outcome

    job_id = f"rejected-then-killed-{uuid.uuid4()}"
    reason = "PermanentFailure: chaos: this input is malformed on purpose"
    AttemptLog(app.backend.client, job_id, ttl=600).append(
        Attempt(0, "strict", Outcome.REJECTED, reason, retries=0, worker=chaos_worker.node)
    )
    app.send_task("farm.test.chaos", kwargs={"ladder": "bad"}, task_id=job_id, queue=OWN_QUEUE, retries=1)
    with pytest.raises(JobRejected, match="malformed on purpose") as info:
        handle(job_id).wait(timeout=60)
    assert outcomes(info.value.attempts) == ["rejected"]  # nothing ran, nothing was appended


def test_main_process_never_imports_torch(cpu_worker, speech_track) -> None:
    # A VAD job imports torch in a child ...
    assert submit("vad", media=str(speech_track.path)).wait(timeout=60)["variant"] == "silero-onnx"
    [reply] = app.control.broadcast("farm_main_process", destination=[cpu_worker.node], reply=True, timeout=5)
    report = reply[cpu_worker.node]
    # ... and the main process still holds neither torch nor a CUDA context.
    assert report["pid"] == cpu_worker.main_pid()
    assert report["torch_imported"] is False and report["cuda_initialized"] is False
    assert report["cuda_visible_devices"] == ""  # the cpu pool sees no GPU


def test_children_are_marked_the_oom_killers_first_choice(chaos_worker) -> None:
    # The marks only (oom_score_adj); the kernel choosing a child over the worker in a real memory
    # cgroup is tests/integration/test_oom_killer.py.
    main = psutil.Process(chaos_worker.main_pid())
    children = main.children()
    assert children
    for child in children:
        assert int(open(f"/proc/{child.pid}/oom_score_adj").read()) == 1000
    assert int(open(f"/proc/{main.pid}/oom_score_adj").read()) < 1000


def test_a_child_asked_for_its_stacks_writes_them_to_the_log_and_goes_on(chaos_worker) -> None:
    # What a failed test's report adds (tests/conftest.py), and what an operator does to a stuck job:
    # kill -USR2 <child pid>.
    before = chaos_worker.log.stat().st_size
    asked = chaos_worker.dump_child_stacks()
    assert asked and all(psutil.Process(pid).is_running() for pid in asked)
    with chaos_worker.log.open("rb") as fh:
        fh.seek(before)
        written = fh.read().decode(errors="replace")
    assert written.count("Current thread") >= len(asked), written[-2000:]
    assert "billiard" in written  # the child's own frames: its pool loop, waiting for a job
    assert send("steady").wait(timeout=30)["output"] is not None  # and the children still take jobs


def test_200_jobs_with_random_child_kills_all_end_and_none_is_lost(chaos_worker) -> None:
    # All 200 queued before the worker takes any: on a loaded machine the worker kept up with the
    # sending, the queue was empty when the kills came, and they landed on idle children.
    node = [chaos_worker.node]
    assert app.control.cancel_consumer(OWN_QUEUE, destination=node, reply=True, timeout=10)
    try:
        jobs = [send("steady") for _ in range(200)]
    finally:
        assert app.control.add_consumer(OWN_QUEUE, destination=node, reply=True, timeout=10)
    main = psutil.Process(chaos_worker.main_pid())
    killed_pids: list[int] = []
    stop = threading.Event()
    rng = random.Random(7)

    def killer() -> None:
        # 20 kills = 10% of the jobs, spread over the run. The children are busy nearly all
        # the time (each job sleeps 0.2 s in one), so most kills land mid-job; a replacement child
        # is spared its first second (on a loaded machine it had not taken a job yet).
        kill_children_at_random(main, rng, killed_pids, stop, pause=(0.2, 0.6), most=20, older_than=1.0)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    states: dict[str, str] = {}
    deadline = time.monotonic() + 240
    for job in jobs:
        try:
            job.wait(timeout=max(1.0, deadline - time.monotonic()))
            states[job.id] = "SUCCESS"
        except LadderExhausted:
            states[job.id] = "FAILURE"
    stop.set()
    thread.join(5)
    assert len(states) == 200 and all(s in ("SUCCESS", "FAILURE") for s in states.values())
    assert len(killed_pids) >= 15, "the killer did not get to kill enough children"
    killed_jobs = 0
    for job in jobs:
        history = job.attempts()
        assert history and history[-1]["outcome"] in ("ok", "killed"), history
        for attempt in history[:-1]:
            # Every attempt that did not finish was killed, and by one of our kills.
            assert attempt["outcome"] == "killed" and attempt["pid"] in killed_pids, history
            # An outside kill is no rung's doing: it never counts against the rung's breaker.
            assert attempt["counted"] is False and attempt["cause"] in ("outside_kill", "unknown_kill"), history
        killed_jobs += any(a["outcome"] == "killed" for a in history)
    assert killed_jobs >= 5  # most kills land on a busy child; idle-child kills cost no job
    assert chaos_worker.process.poll() is None


SHORT_QUEUE = "chaos-short"


@pytest.fixture(scope="module")
def short_env(session_dir) -> dict[str, str]:
    """Short time limits (soft 6 s, hard 7 s) and a 10 s visibility timeout: every limit must stay
    below the visibility timeout, or the worker refuses to start."""
    from tests.support.chaos_suite import short_limits_config

    config = short_limits_config(session_dir / "short-limits.toml")
    return {"FARM_CONFIG_FILE": str(config), "FARM_VISIBILITY_TIMEOUT": "10", "FARM_RESTORE_INTERVAL": "1"}


def send_short(ladder: str) -> JobHandle:
    return submit("chaos", queue=SHORT_QUEUE, ladder=ladder)


@pytest.fixture()
def short_worker(start_worker, short_env):
    """Factory: a chaos worker under the short limits, stopped when the test ends, pass or fail.

    It must not outlive its test: kombu's restore sweep hands back *every* queue's unacked
    messages older than the sweeping worker's own visibility timeout (10 s here), so a worker
    left running would redeliver other tests' long jobs while they still run. (The same holds
    in production: all workers on one Redis need the same FARM_VISIBILITY_TIMEOUT.)
    """
    from mediafarm.workers.launch import stop_worker

    started = []

    def start(concurrency: int = 1):
        started.append(start_worker("chaos", concurrency=concurrency, queues=[SHORT_QUEUE], env=short_env))
        return started[-1]

    yield start
    for worker in started:
        stop_worker(worker.process, timeout=20)


def test_time_limits_move_the_job_down_soft_in_process_hard_by_the_watchdog(short_worker) -> None:
    worker = short_worker(concurrency=2)
    soft, hard = send_short("overrun_soft"), send_short("overrun_hard")
    soft_env, hard_env = soft.wait(timeout=60), hard.wait(timeout=60)
    assert outcomes(soft_env["attempts"]) == ["timeout", "ok"]
    assert "soft time limit" in soft_env["attempts"][0]["reason"]
    assert (soft_env["attempts"][0]["counted"], soft_env["attempts"][0]["cause"]) == (True, "time_limit")
    # The stubborn engine ignores the soft limit; the watchdog kills it at the hard one.
    assert outcomes(hard_env["attempts"]) == ["timeout", "ok"], hard_env["attempts"]
    assert "hard time limit of 7 s" in hard_env["attempts"][0]["reason"]
    assert (hard_env["attempts"][0]["counted"], hard_env["attempts"][0]["cause"]) == (True, "hard_time_limit")
    assert hard_env["variant"] == "frugal" and worker.process.poll() is None


def test_whole_worker_death_redelivers_the_job_to_another_worker(short_worker) -> None:
    first = short_worker()
    job = send_short("slow")
    deadline = time.monotonic() + 30
    while job.state() != "STARTED":
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    assert any(a["outcome"] is None for a in job.attempts())
    # The whole worker dies mid-job: main process and children, as in a machine or container loss.
    os.killpg(first.main_pid(), signal.SIGKILL)
    first.process.wait(10)

    second = short_worker()
    killed_at = time.monotonic()
    envelope = job.wait(timeout=120)
    # Back after the visibility timeout plus about one sweep, not kombu's default 100 s sweep.
    assert time.monotonic() - killed_at < 40
    lost, ok = envelope["attempts"]
    assert (lost["outcome"], ok["outcome"]) == ("worker_lost", "ok")
    assert (lost["counted"], lost["cause"]) == (False, "worker_lost")
    assert lost["rung_index"] == ok["rung_index"] == 0  # not the job's fault: same rung, no downgrade
    assert (lost["worker"], ok["worker"]) == (first.node, second.node)


def test_cold_shutdown_hands_a_running_job_back_before_the_visibility_timeout(start_worker) -> None:
    # What `docker compose stop` does to a worker (stop_signal SIGQUIT): the running job's message
    # must go back to the queue when the soft-shutdown time is up, not after the visibility timeout.
    env = {"FARM_SOFT_SHUTDOWN_TIMEOUT": "1"}  # the default 7200 s visibility timeout stays
    first = start_worker("chaos", concurrency=1, queues=["chaos-cold"], env=env)
    job = submit("chaos", queue="chaos-cold", ladder="slow")
    deadline = time.monotonic() + 30
    while not any(a["outcome"] is None for a in job.attempts()):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    os.kill(first.main_pid(), signal.SIGQUIT)
    assert first.process.wait(30) is not None
    second = start_worker("chaos", concurrency=1, queues=["chaos-cold"], env=env)
    envelope = job.wait(timeout=60)  # far less than the 7200 s visibility timeout
    assert outcomes(envelope["attempts"]) == ["worker_lost", "ok"], envelope["attempts"]
    assert envelope["attempts"][1]["worker"] == second.node


def test_a_job_already_stored_as_success_is_not_run_again(chaos_worker) -> None:
    # A worker that dies between storing SUCCESS and acking gets its message redelivered; the
    # redelivery must return the stored result instead of running the job a second time.
    from mediafarm.tasks.wire.history import read_attempts

    job = send("memerr")
    first = job.wait(timeout=60)
    assert outcomes(first["attempts"]) == ["oom", "ok"]
    inspect = app.control.inspect([chaos_worker.node], timeout=2)

    def processed() -> int:
        return inspect.stats()[chaos_worker.node]["total"].get("farm.test.chaos", 0)

    before = processed()
    app.send_task("farm.test.chaos", kwargs={"ladder": "memerr"}, queue=OWN_QUEUE, task_id=job.id, retries=1)
    deadline = time.monotonic() + 60
    while processed() == before:
        assert time.monotonic() < deadline, "the redelivered message was never processed"
        time.sleep(0.1)
    meta = app.backend.get_task_meta(job.id)
    assert meta["status"] == "SUCCESS" and meta["result"]["attempts"] == first["attempts"]
    # No new attempt was recorded: the stored envelope came back untouched.
    assert len(read_attempts(app.backend.client, job.id)) == 2


def test_a_stale_copys_lost_child_never_reopens_a_job_another_worker_ended(chaos_worker) -> None:
    # What the chaos suite once lost a job to: worker A runs the job and is paused past the
    # visibility timeout; worker B gets the message again, settles A's attempt and rejects the job
    # (FAILURE stored); then A's child is killed (the watchdog, for a stale child). A's main process
    # retries the job (task_retry_on_worker_lost): it sends the retry, then stores RETRY. That
    # RETRY must not replace B's FAILURE, and the retry's delivery must run nothing.
    import uuid

    from mediafarm.tasks.producer.client import handle
    from mediafarm.tasks.wire.errors import PermanentFailure
    from mediafarm.tasks.wire.history import AttemptLog
    from mediafarm.tasks.wire.records import Attempt, Outcome

    job_id = f"ended-elsewhere-{uuid.uuid4()}"
    app.send_task("farm.test.chaos", kwargs={"ladder": "slow", "plan": {"sleep": 60}}, task_id=job_id, queue=OWN_QUEUE)
    deadline = time.monotonic() + 30
    while not (open_ := [a for a in handle(job_id).attempts() if a["outcome"] is None]):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    child = open_[0]["pid"]
    inspect = app.control.inspect([chaos_worker.node], timeout=2)
    accepted = inspect.stats()[chaos_worker.node]["total"].get("farm.test.chaos", 0)

    # Worker B's doing, in its order: A's attempt settled, B's rejection recorded, FAILURE stored.
    log = AttemptLog(app.backend.client, job_id, ttl=600)
    result_key = app.backend.get_key_for_task(job_id).decode()
    (stale,), _ = log.read()
    stale.outcome, stale.reason = Outcome.WORKER_LOST, "the worker process died; job redelivered"
    assert log.settle(0, stale, result_key)
    reason = "chaos: this input is malformed on purpose"
    log.append(Attempt(0, "only", Outcome.REJECTED, f"PermanentFailure: {reason}", retries=0, worker="b@elsewhere"))
    app.backend.mark_as_failure(job_id, PermanentFailure(reason))
    history = handle(job_id).attempts()

    # Flower keeps task state with Celery's own event state machine: feed it what the worker sends.
    flower, listening = app.events.State(), threading.Event()

    def listen() -> None:
        def on_event(event: dict[str, Any]) -> None:
            flower.event(event)
            listening.set()

        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers={"*": on_event})
            for _ in receiver.itercapture(limit=None, timeout=None, wakeup=True):
                if flower.tasks.get(job_id) is not None and flower.tasks[job_id].state == "FAILURE":
                    break  # (a heartbeat every 2 s wakes this loop to look)

    threading.Thread(target=listen, daemon=True).start()
    assert listening.wait(15), "no worker event reached the receiver"
    pubsub = app.backend.client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(result_key)
    try:
        os.kill(child, signal.SIGKILL)
        # The retry A's main process sends is accepted by one of its children, and ends.
        deadline = time.monotonic() + 60
        while inspect.stats()[chaos_worker.node]["total"].get("farm.test.chaos", 0) < accepted + 1 or any(
            r["id"] == job_id for r in (inspect.active() or {}).get(chaos_worker.node, [])
        ):
            assert time.monotonic() < deadline, "the retry of the killed child was never processed"
            time.sleep(0.1)
        published, until = [], time.monotonic() + 1
        while (left := until - time.monotonic()) > 0:  # the subscription's confirmation reads as None
            if (message := pubsub.get_message(timeout=left)) is not None:
                published.append(message["data"])
    finally:
        pubsub.close()
    assert published == []  # no RETRY over the end, and no second end either: nothing was run again
    assert app.backend.get_task_meta(job_id, cache=False)["status"] == "FAILURE"
    with pytest.raises(JobRejected, match="malformed on purpose"):
        handle(job_id).wait(timeout=5)
    assert handle(job_id).attempts() == history  # nothing appended, nothing settled anew
    deadline = time.monotonic() + 15  # and Flower reads the stored end, not the delivery as started
    while flower.tasks.get(job_id) is None or flower.tasks[job_id].state != "FAILURE":
        assert time.monotonic() < deadline, flower.tasks.get(job_id) and flower.tasks[job_id].state
        time.sleep(0.1)
    assert chaos_worker.process.poll() is None
