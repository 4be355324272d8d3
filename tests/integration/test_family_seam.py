"""The family seam, end to end on a real Redis and real prefork workers (issue #6).

The toy family (tests/support/toy/) is declared only in its own folder and registered through
FARM_FAMILY_MODULES, as an operator would add one: these tests show it routed to the default
CPU pool, run, moved down its ladder by a MemoryError raised mid-stream, rendered by the CLI, its
own PermanentFailure subclass reaching the producer as JobRejected, and its artifacts listed,
fetched and written atomically even when the writer is SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mediafarm import JobCancelled, JobRejected, submit
from mediafarm.tasks.app import app
from tests.conftest import REPO

pytestmark = pytest.mark.integration


def outcomes(attempts: list[dict]) -> list[str]:
    return [a["outcome"] for a in attempts]


def test_toy_family_is_routed_run_and_its_artifact_fetched(cpu_worker, tmp_path: Path) -> None:
    from mediafarm.tasks.registry import route

    # Routed by the registry: no routing table names the toy family.
    assert route("farm.toy.count", (), {}, {}) == {"queue": "toy"}
    job = submit("toy", text="one two three")
    envelope = job.wait(timeout=60)
    assert envelope["family"] == "toy" and envelope["rung"] == "streaming" and envelope["rung_index"] == 0
    assert envelope["output"] == {"words": ["ONE", "TWO", "THREE"], "engine": "stream"}
    assert envelope["attempts"][0]["worker"] == cpu_worker.node  # the default pool took its queue
    # The typed result and the partial outputs the generator engine yielded, in order.
    assert job.output().words == ["ONE", "TWO", "THREE"]
    assert [p["word"] for p in job.partials()] == ["ONE", "TWO", "THREE"]
    # One artifact, listed with its size and digest, fetched and checked.
    [artifact] = job.artifacts()
    assert (artifact.name, artifact.media_type) == ("words.txt", "text/plain")
    target = job.download("words.txt", tmp_path)
    assert target.read_text() == "ONE\nTWO\nTHREE\n" and artifact.size == len(target.read_bytes())
    with pytest.raises(FileNotFoundError, match="no artifact 'nope.txt'"):
        job.download("nope.txt", tmp_path)


def test_memory_error_inside_a_generator_moves_the_job_down(cpu_worker) -> None:
    job = submit("toy", text="alpha beta gamma delta", fail_after=2)
    envelope = job.wait(timeout=60)
    assert outcomes(envelope["attempts"]) == ["oom", "ok"]
    assert "MemoryError: toy: out of memory after 2 words" in envelope["attempts"][0]["reason"]
    assert envelope["variant"] == "plain" and envelope["output"]["engine"] == "plain"
    # The retried attempt started clean: the first rung's two partial words are gone.
    assert job.partials() == []
    assert cpu_worker.process.poll() is None
    assert app.control.ping(destination=[cpu_worker.node], timeout=2)


def test_a_familys_own_permanent_failure_reaches_the_producer_as_rejected(cpu_worker) -> None:
    # The producer has never imported tests.support.toy.engines, where ToyRejected is raised.
    assert "tests.support.toy.engines" not in sys.modules
    job = submit("toy", text="this is forbidden here")
    with pytest.raises(JobRejected) as info:
        job.wait(timeout=60)
    assert "ToyRejected: the word 'forbidden' is not allowed" in info.value.reason
    assert outcomes(info.value.attempts) == ["rejected"]


def test_an_ended_jobs_envelope_or_failure_is_read_without_waiting(cpu_worker) -> None:
    good, bad = submit("toy", text="two words"), submit("toy", text="a forbidden word")
    envelope = good.wait(timeout=60)
    assert good.envelope() == envelope and good.failure() is None
    with pytest.raises(JobRejected) as raised:
        bad.wait(timeout=60)
    failure = bad.failure()
    assert isinstance(failure, JobRejected) and failure.reason == raised.value.reason and bad.envelope() is None
    running = submit("toy", text="slow words here", word_pause=1.0)
    assert running.envelope() is None and running.failure() is None
    running.cancel()


def test_cli_renders_the_toy_family_and_lists_it(cpu_worker, tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    farm = [sys.executable, "-m", "mediafarm.workers.cli"]
    families = subprocess.run(farm + ["families"], env=env, capture_output=True, text=True, timeout=60)
    assert families.returncode == 0, families.stderr
    assert "farm.toy.count" in families.stdout and "streaming → plain" in families.stdout
    out = tmp_path / "out"
    proc = subprocess.run(farm + ["submit", "toy", "red green", "--wait", "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 words by stream" in proc.stdout and "│ 2 │ GREEN │" in proc.stdout
    assert (out / "words.txt").read_text() == "RED\nGREEN\n"
    bad = subprocess.run(farm + ["submit", "toy", "x", "-p", "fail_after=-1"], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "fail_after: Input should be greater than or equal to 0" in bad.stderr


def test_writer_killed_mid_write_leaves_no_final_file_and_the_next_rung_writes_it(cpu_worker) -> None:
    from mediafarm.config.settings import get_settings

    # The streaming rung writes half of words.txt, then pauses; we SIGKILL its child right there.
    job = submit("toy", text="one two three four", write_pause=20)
    folder = get_settings().storage_dir / job.id
    deadline = time.monotonic() + 30
    while not list(folder.glob(".words.partial-*.txt")):
        assert time.monotonic() < deadline, "the writer never started"
        time.sleep(0.05)
    [running] = [a for a in job.attempts() if a["outcome"] is None]
    assert not (folder / "words.txt").exists()  # half written: only the hidden partial file exists
    os.kill(running["pid"], signal.SIGKILL)
    envelope = job.wait(timeout=60)
    assert outcomes(envelope["attempts"]) == ["killed", "ok"] and envelope["variant"] == "plain"
    # Complete, and nothing of the killed attempt left behind.
    assert (folder / "words.txt").read_text() == "one\ntwo\nthree\nfour\n"  # the plain rung keeps case
    assert sorted(p.name for p in folder.iterdir()) == [".mediafarm-job", "words.txt"]
    assert [a["name"] for a in envelope["artifacts"]] == ["words.txt"]


@pytest.fixture(scope="module")
def ten_minutes(speech_track, media_root: Path) -> Path:
    from tests.support.speech import write_long_track

    path = media_root / "ten-minutes.wav"
    write_long_track(path, 600, pattern=speech_track)
    return path


def test_vad_progress_is_seen_by_a_polling_client(cpu_worker, ten_minutes: Path) -> None:
    seen = []
    envelope = submit("vad", media=str(ten_minutes)).wait(timeout=120, poll=0.02, on_progress=seen.append)
    fractions = [p.fraction for p in seen]
    assert len(set(fractions)) >= 3, fractions
    assert fractions == sorted(fractions) and 0 < fractions[0] < fractions[-1] <= 1
    assert all(p.rung == "silero-onnx" and p.stage == "silero-vad" for p in seen)
    seconds = [p.media_seconds for p in seen]
    assert seconds == sorted(seconds) and seconds[-1] <= 600
    assert envelope["output"]["duration"] == pytest.approx(600, abs=0.1)


def test_flower_sees_the_progress_as_the_jobs_state(cpu_worker, ten_minutes: Path) -> None:
    # Flower keeps task state with Celery's own event state machine; feed it what the worker sends.
    import threading

    state = app.events.State()
    listening, done = threading.Event(), threading.Event()
    seen: list[tuple[str, float | None]] = []
    job_id: list[str] = []
    ended: list[dict] = []

    def on_event(event: dict) -> None:
        state.event(event)
        if event["type"] == "worker-heartbeat":
            listening.set()
        if job_id and event.get("uuid") == job_id[0]:
            task = state.tasks[job_id[0]]
            seen.append((task.state, getattr(task, "fraction", None)))
            if event["type"] in ("task-succeeded", "task-failed"):
                ended.append(event)
                done.set()

    def listen() -> None:
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers={"*": on_event})
            for _ in receiver.itercapture(limit=None, timeout=None, wakeup=True):
                if done.is_set():
                    break

    threading.Thread(target=listen, daemon=True).start()
    assert listening.wait(15), "no worker event reached the receiver"
    job = submit("vad", media=str(ten_minutes))
    job_id.append(job.id)
    job.wait(timeout=120)
    assert done.wait(15)
    progress = [fraction for st, fraction in seen if st == "PROGRESS"]
    assert len(progress) >= 3 and progress == sorted(progress) and 0 < progress[-1] <= 1, seen
    assert seen[-1][0] == "SUCCESS"
    # Flower's result: the envelope's repr, cut short (FarmTask.resultrepr_maxsize), still naming
    # the job, its family and the rung it ran on.
    shown = ended[-1]["result"]
    assert len(shown) < 300 and "..." in shown, shown
    assert f"'job_id': '{job.id}'" in shown and "'family': 'vad'" in shown and "'rung': " in shown, shown


def test_a_running_job_can_be_cancelled(cpu_worker, ten_minutes: Path) -> None:
    job = submit("vad", media=str(ten_minutes))
    deadline = time.monotonic() + 30
    while job.progress() is None:
        assert time.monotonic() < deadline, "the job never reported progress"
        time.sleep(0.02)
    job.cancel()
    with pytest.raises(JobCancelled) as info:
        job.wait(timeout=60)
    # The job can read as cancelled a moment before its attempt record does (seen once in a loaded
    # full run, the record still open; the likely cause: a copy of the message delivered after the
    # revoke, which Celery announces REVOKED at once while the running attempt stops at its next
    # check). The record must end "cancelled" either way.
    attempts, deadline = info.value.attempts, time.monotonic() + 30
    while outcomes(attempts) != ["cancelled"] and time.monotonic() < deadline:
        time.sleep(0.1)
        attempts = job.attempts()
    assert outcomes(attempts) == ["cancelled"]
    assert job.state() == "REVOKED"  # cancelled, for the client and `farm status`, not FAILURE
    assert job.progress().fraction < 1
    assert cpu_worker.process.poll() is None


def test_a_producer_chosen_job_id_keeps_its_artifacts_inside_storage(cpu_worker, tmp_path: Path) -> None:
    import uuid

    from mediafarm.config.settings import get_settings
    from mediafarm.tasks.producer.client import handle

    job_id = f"../cam1:{uuid.uuid4()}"
    app.send_task("farm.toy.count", kwargs={"text": "x y z"}, task_id=job_id, queue="toy")
    job = handle(job_id)
    assert job.wait(timeout=60)["output"]["words"] == ["X", "Y", "Z"]
    folders = get_settings().storage_dir.iterdir()
    [folder] = [p for p in folders if "cam1" in p.name and job_id[3:] in p.name.replace("%3A", ":")]
    assert folder.parent == get_settings().storage_dir and (folder / "words.txt").is_file()
    assert job.download("words.txt", tmp_path / "w.txt").read_text() == "X\nY\nZ\n"


def test_unknown_engine_in_a_config_file_ladder_stops_the_worker(redis_url: str, tmp_path: Path) -> None:
    config = tmp_path / "farm.toml"
    config.write_text(
        "[ladders.vad]\nrungs = [\n"
        "  { name = 'fast', engine = 'webrtc', params = { aggressivness = 3 } },\n"
        "  { name = 'fancy', engine = 'silero-gpu' },\n]\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(FARM_BROKER_URL=redis_url, FARM_CONFIG_FILE=str(config), COLUMNS="200")
    farm = subprocess.run([sys.executable, "-m", "mediafarm.workers.cli", "worker"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert farm.returncode == 2, farm.stdout + farm.stderr
    assert "rung 'fancy' names an unknown engine 'silero-gpu'" in farm.stderr
    assert "rung 'fast' (engine 'webrtc'): params do not fit: aggressivness: Extra inputs" in farm.stderr
    # A worker started with plain `celery worker` refuses just the same.
    celery = subprocess.run([sys.executable, "-m", "celery", "-A", "mediafarm.workers.app", "worker", "-c", "1"],
                            env=env, cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert celery.returncode != 0
    assert "rung 'fancy' names an unknown engine 'silero-gpu'" in celery.stdout + celery.stderr


def test_the_cli_shows_a_running_jobs_progress(cpu_worker, ten_minutes: Path) -> None:
    """`farm status ID` while the job runs, and `farm submit --wait` on a terminal, draw the progress
    bar with the rung and stage (TTY_COMPATIBLE=1: rich treats the captured pipe as a terminal)."""
    env = {**os.environ, "COLUMNS": "160", "TTY_COMPATIBLE": "1"}
    farm = [sys.executable, "-m", "mediafarm.workers.cli"]
    job = submit("vad", media=str(ten_minutes))
    deadline = time.monotonic() + 60
    while job.progress() is None:
        assert time.monotonic() < deadline, "no progress reported"
        time.sleep(0.02)
    # The job (about 4 s) could end while the command starts (1-2 s): its child is stopped
    # mid-job until the command has answered, so the command always sees it running.
    [running] = [a for a in job.attempts() if a["outcome"] is None]
    os.kill(running["pid"], signal.SIGSTOP)
    try:
        assert [a["outcome"] for a in job.attempts()] == [None], job.attempts()
        status = subprocess.run([*farm, "status", job.id], env=env, cwd=REPO, capture_output=True, text=True,
                                timeout=60)  # fmt: skip
    finally:
        os.kill(running["pid"], signal.SIGCONT)
    assert status.returncode == 0, status.stderr
    shown = plain(status.stdout)
    assert f"{job.id}: STARTED" in shown and "silero-onnx silero-vad" in shown, shown
    assert "%" in shown and "s of media" in shown and "running" in shown, shown
    job.wait(timeout=120)
    # Once it succeeded, where its time went in the worker: each step of its trace.
    ended = subprocess.run([*farm, "status", job.id], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert ended.returncode == 0, ended.stderr
    [line] = [li for li in plain(ended.stdout).splitlines() if li.startswith("trace: ")]
    assert [part.split()[0] for part in line.removeprefix("trace: ").split(" · ")] == [
        "child", "ready", "attempt", "engine", "engine_end", "recorded"]

    waited = subprocess.run([*farm, "submit", "vad", str(ten_minutes), "--wait"], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=180)  # fmt: skip
    assert waited.returncode == 0, waited.stderr
    shown = plain(waited.stdout)
    assert "silero-onnx silero-vad" in shown and "s of media" in shown, shown  # the bar's detail
    assert "rung silero-onnx" in shown, shown  # then the result
    assert "trace: child " in shown and "engine_end " in shown, shown


def plain(terminal_output: str) -> str:
    """Terminal output without its colour and cursor escape sequences."""
    import re

    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal_output)
