"""TTS jobs on a real worker: the ladder on a CPU pool, a killed rung, bad input, the CLI.

The worker runs the family's ladder shape with test-sized ChatTTS calls (FARM_CONFIG_FILE of its
own, a queue of its own): ``chattts`` wants a GPU (unavailable here, skipped without an attempt),
``chattts-cpu`` runs the tiny random model built into the models dir, then the real Piper voice
and espeak-ng.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import soundfile as sf

from mediafarm import JobRejected, submit
from mediafarm.config.settings import get_settings
from mediafarm.tasks.app import app
from mediafarm.tasks.wire import keys
from tests.conftest import REPO
from tests.support.kills import kill_running
from tests.support.piper_voice import link_joe_voice

pytestmark = pytest.mark.integration
QUEUE = "tts-test"
LADDER = """
[ladders.tts]
rungs = [
  { name = "chattts", engine = "chattts", device = "cuda", params = { max_chars = 40, max_new_token = 16 } },
  { name = "chattts-cpu", engine = "chattts", params = { max_chars = 40, max_new_token = 16 } },
  { name = "piper", engine = "piper" },
  { name = "espeak", engine = "espeak" },
]
"""
TEXT = "Hello there. This is a test of chunks. They come in order. Goodbye now."


@pytest.fixture(scope="module")
def tts_worker(start_worker, session_dir: Path):
    pytest.importorskip("ChatTTS")
    from tests.support.tiny_chattts import ensure_tiny_chattts

    models = get_settings().models_dir
    ensure_tiny_chattts(models / "chattts")
    link_joe_voice(models)
    config = session_dir / "farm-tts-test.toml"
    config.write_text((REPO / "tests" / "support" / "farm-test.toml").read_text() + LADDER)
    return start_worker("cpu", concurrency=1, queues=[QUEUE], env={"FARM_CONFIG_FILE": str(config)})


def outcomes(attempts) -> list[str]:
    return [a["outcome"] for a in attempts]


def test_a_killed_chattts_cpu_attempt_comes_back_on_piper_under_the_same_id(tts_worker) -> None:
    # First in the module: the child has not imported ChatTTS yet (~9 s), time enough to kill it.
    job = submit("tts", queue=QUEUE, text=TEXT)
    kill_running(job, "chattts-cpu")
    envelope = job.wait(timeout=120)
    assert envelope["job_id"] == job.id and envelope["variant"] == "piper"
    assert outcomes(envelope["attempts"]) == ["unavailable", "killed", "ok"]
    assert "GPU" in envelope["attempts"][0]["reason"]
    assert envelope["output"]["rung"] == "piper" and len(envelope["output"]["sentences"]) == 4
    # The time of the first chunk is the answering attempt's (the workers' first-output metric).
    piper = envelope["attempts"][-1]
    first = float(app.backend.client.get(keys.first_output(job.id)))
    assert piper["started"] < first < piper["started"] + piper["duration"]


def test_end_to_end_on_chattts_cpu_with_chunks_fetchable_in_order(tts_worker, tmp_path: Path) -> None:
    job = submit("tts", queue=QUEUE, text=TEXT, format="mp3")
    envelope = job.wait(timeout=120)
    assert envelope["variant"] == "chattts-cpu" and outcomes(envelope["attempts"]) == ["unavailable", "ok"]
    output = envelope["output"]
    assert output["audio"] == "speech.mp3" and output["voice"].startswith("ChatTTS 0.2.5 chattts (cpu)")
    partials = job.partials()
    assert [p["chunk"] for p in partials] == list(range(output["chunks"])) and output["chunks"] >= 2
    names = {a.name for a in job.artifacts()}
    assert {"speech.mp3", *(p["artifact"] for p in partials)} <= names
    saved = job.download("chunks/chunk_00000.wav", tmp_path)
    assert sf.info(saved).duration == pytest.approx(partials[0]["end"], abs=0.002)
    # ChatTTS (and torch) ran in the child; the worker's main process never imported them.
    [reply] = app.control.broadcast("farm_main_process", destination=[tts_worker.node], reply=True, timeout=5)
    assert reply[tts_worker.node]["torch_imported"] is False


@pytest.mark.parametrize(
    ("fields", "reason"),
    [({"text": "nul\x00byte"}, r"control character U\+0000"), ({"text": "Hi.", "speaker": "nobody"}, "nobody")],
)
def test_bad_input_is_rejected_once_and_never_retried(tts_worker, fields, reason) -> None:
    # Sent as a foreign producer would, past the client's own checks: the worker checks again.
    job_id = str(uuid.uuid4())
    app.send_task("farm.tts.synthesize", kwargs=fields, task_id=job_id, queue=QUEUE)
    from mediafarm.tasks.producer.client import handle

    with pytest.raises(JobRejected, match=reason) as info:
        handle(job_id).wait(timeout=60)
    tried = [a for a in info.value.attempts if a["outcome"] != "unavailable"]
    assert outcomes(tried) == ["rejected"] and tried[0]["retries"] == 0


def test_farm_submit_tts_out_file_wait(tts_worker, tmp_path: Path) -> None:
    target = tmp_path / "hi.wav"
    proc = subprocess.run(
        [sys.executable, "-m", "mediafarm.workers.cli", "submit", "tts", "Hello there. Goodbye now.",
         "--speaker", "default", "--out", str(target), "--queue", QUEUE, "--wait"],
        cwd=REPO, env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"saved {target}" in proc.stdout.replace("\n", "") and "rung chattts-cpu" in proc.stdout
    assert sf.info(target).samplerate == 24000 and sf.info(target).duration > 0.3


def test_a_job_cancelled_before_it_ran_stops_at_its_engines_first_check_with_nothing_spoken(tts_worker) -> None:
    # What a worker that missed the revoke sees: the cancel flag alone. The attempt's record reads
    # it as it is written, and the engine's first check (before its first chunk) takes that answer:
    # the job ends cancelled by the engine, not after speaking the whole text for nothing.
    from mediafarm.tasks.producer.client import handle
    from mediafarm.tasks.wire.errors import JobCancelled

    job_id = f"tts-cancelled-{uuid.uuid4()}"
    app.backend.client.set(keys.cancel(job_id), "1", ex=600)
    app.send_task("farm.tts.synthesize", kwargs={"text": TEXT * 20, "ladder": "espeak"}, task_id=job_id, queue=QUEUE)
    job = handle(job_id)
    with pytest.raises(JobCancelled) as info:
        job.wait(timeout=60)
    [attempt] = info.value.attempts
    assert attempt["outcome"] == "cancelled" and attempt["rung"] == "espeak"
    assert attempt["reason"] == f"job {job_id} was cancelled by its producer", attempt  # the engine's own check
    assert job.partials() == [] and job.progress() is None
