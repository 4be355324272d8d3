"""TTS checkpoints as plain engine calls on the real seam (``tasks.wire.checkpoint``): an attempt cut off
after some chunks, the next one handed its checkpoint, the whole compared with an unkilled run.

Real espeak-ng and the real Piper voice; the seam's store and writer are the worker's (the
interval 0: a checkpoint after every chunk). The worker-level kills are in
tests/integration/test_tts_resume.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import soundfile as sf

from mediafarm.config.settings import get_settings
from mediafarm.tasks.families.dialogue.script import MAX_LINE_CHARS
from mediafarm.tasks.families.tts import checkpoints, engines
from mediafarm.tasks.families.tts.audio import encode, pcm16
from mediafarm.tasks.families.tts.resume import RESUME, SHORT_TEXT_CHARS, STATE_VERSION
from mediafarm.tasks.families.tts.spec import ChatTTSParams, EspeakParams, PiperParams, TtsRequest
from mediafarm.tasks.families.tts.text import plan_chunks
from mediafarm.tasks.runtime.base import drain
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.wire.checkpoint import Checkpoint, CheckpointWriter, store_for
from tests.support.piper_voice import link_joe_voice

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please leave the package at the front door, and ring twice.",
    "Someone is walking across the garden now!",
    "Turn off the lights before you go to sleep.",
    "We will meet again early in the evening?",
    "A long sentence goes on and on, past a comma, past a semicolon; and then, at last, it ends.",
)


def text_of(chars: int) -> str:
    words, n = [], 0
    while n < chars:
        words.append(SENTENCES[len(words) % len(SENTENCES)])
        n += len(words[-1]) + 1
    return " ".join(words)


LONG = text_of(SHORT_TEXT_CHARS + 300)
# The sample-equality tests speak less (the short-text rule lowered for them): Piper is slow here.
SHORTER = text_of(700)
PARAMS = {"espeak": EspeakParams(max_chars=120), "piper": PiperParams(max_chars=120),
          # The tiny random ChatTTS (tests/support/tiny_chattts.py): noise, but seeded per call.
          "chattts": ChatTTSParams(model="chattts", max_chars=40, max_new_token=8)}  # fmt: skip


@pytest.fixture(scope="module")
def models_dir() -> Path:
    models = get_settings().models_dir
    link_joe_voice(models)
    return models


@pytest.fixture()
def chattts(models_dir: Path) -> None:
    pytest.importorskip("ChatTTS", reason="ChatTTS is not installed (pip install 'mediafarm[tts]')")
    from tests.support.tiny_chattts import ensure_tiny_chattts

    ensure_tiny_chattts(models_dir / "chattts")


class Job:
    """One job's folder and checkpoint, attempted as the worker would (``tasks.runtime.base.Resuming``)."""

    def __init__(self, tmp: Path, engine: str, models_dir: Path, **fields: Any) -> None:
        self.engine, self.models_dir = engine, models_dir
        self.request = TtsRequest(**{"text": LONG, **fields})
        local = EngineContext.local(storage_dir=tmp, models_dir=models_dir, job_id=f"{engine}-{uuid.uuid4().hex[:6]}")
        self.ctx = EngineContext(local.job_id, 0, 0, engine, "cpu", local.artifacts, models_dir)
        self.store = store_for(self.ctx.artifacts, "tts", self.request.model_dump())

    def attempt(self, *, stop_after: int | None = None, rung: str | None = None) -> tuple[Any, list[dict]]:
        """An attempt from the last checkpoint; ``stop_after`` chunks announced, it is cut off (a
        kill leaves its files, the next attempt's folder is cleared but for the checkpoint)."""
        self.ctx.artifacts.clear()
        resume = self.store.load()
        if resume is not None and RESUME.why_not(resume, rung or self.engine) is not None:
            resume = None
        if resume is not None:
            self.store.restore(resume)
        self.ctx.resume = resume
        self.ctx.rung = rung or self.engine
        self.ctx.checkpoints = CheckpointWriter(self.store, "characters", self.ctx.rung, 0.0, resume)
        partials: list[dict] = []
        self.ctx.publish = partials.append
        stream = getattr(engines, self.engine)(self.ctx, self.request, PARAMS[self.engine])
        if stop_after is None:
            return drain(stream, self.ctx), partials
        for item in stream:
            partials.append(item)
            if len(partials) == stop_after:
                stream.close()
                return None, partials
        raise AssertionError(f"the text had fewer than {stop_after} chunks")

    def audio(self, result: Any) -> np.ndarray:
        path = self.ctx.artifacts.path(result.audio)
        if result.format == "wav":
            return sf.read(path, dtype="int16")[0]
        with av.open(str(path)) as container:  # the decoded samples of a lossy file
            return np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])


def unkilled(tmp: Path, engine: str, models_dir: Path, **fields: Any) -> tuple[Any, list[dict], Job]:
    job = Job(tmp / "unkilled", engine, models_dir, **fields)
    result, partials = job.attempt()
    return result, partials, job


def chunk_audio(job: Job, partial: dict) -> np.ndarray:
    return sf.read(job.ctx.artifacts.path(partial["artifact"]), dtype="int16")[0]


@pytest.mark.parametrize(("engine", "fmt", "cuts"), [
    ("espeak", "wav", (2,)), ("espeak", "mp3", (1, 5)), ("espeak", "opus", (4,)), ("piper", "wav", (3,)),
    ("chattts", "wav", (1,)),
])  # fmt: skip
def test_a_resumed_job_is_sample_for_sample_an_unkilled_one(tmp_path, models_dir, monkeypatch, request, engine, fmt,
                                                            cuts) -> None:  # fmt: skip
    if engine == "chattts":
        request.getfixturevalue("chattts")
    monkeypatch.setattr(checkpoints, "SHORT_TEXT_CHARS", 0)
    # Piper and the tiny ChatTTS on a CPU take seconds a chunk here: fewer of them.
    text = {"espeak": SHORTER, "piper": text_of(450), "chattts": text_of(100)}[engine]
    result, partials, reference = unkilled(tmp_path, engine, models_dir, format=fmt, text=text)
    assert result.chunks > sum(cuts) + 1
    job = Job(tmp_path / "killed", engine, models_dir, format=fmt, text=text)
    for cut in cuts:  # killed early, then again further on: each attempt goes on from the last checkpoint
        kept_before = job.store.load()
        job.attempt(stop_after=cut + (len(kept_before.files) if kept_before else 0))
    resumed_result, resumed_partials = job.attempt()
    assert job.ctx.resume is not None and job.ctx.resume.rung == engine
    # The checkpoint written after the last chunk announced before the cut is the one taken.
    kept = sum(cuts)
    assert job.ctx.resume.files == tuple(p["artifact"] for p in partials[:kept])
    chunks = plan_chunks(text, PARAMS[engine].max_chars).chunks
    assert job.ctx.resume.position == sum(c.chars for c in chunks[:kept])
    assert [m.to_json() for m in job.ctx.resume.made] == [{"start": 0.0, "end": job.ctx.resume.position,
                                                           "rung": engine}]  # fmt: skip
    assert resumed_result == result
    assert resumed_partials == partials  # the kept chunks are announced again: one continuous list
    assert np.array_equal(job.audio(resumed_result), reference.audio(result))
    for partial in partials:  # every chunk file too, kept or spoken after the resume
        assert np.array_equal(chunk_audio(job, partial), chunk_audio(reference, partial))


def test_pcm16_rounds_as_the_encoder_does_so_a_wav_keeps_its_samples(tmp_path) -> None:
    # The unkilled run now feeds its encoder pcm16(samples); before, the encoder converted the
    # floats itself. The WAV is the same either way: FFmpeg's float-to-s16 rounds as pcm16 does.
    edges = np.array([-1.0, 1.0, 0.0, 0.5 / 32768, 1.5 / 32768, -0.5 / 32768, 32767.5 / 32768, -32768.5 / 32768])
    samples = np.concatenate([edges, np.random.default_rng(7).uniform(-1, 1, 48_000)]).astype(np.float32)
    encode(tmp_path / "floats.wav", "wav", 22050, samples)
    assert np.array_equal(sf.read(tmp_path / "floats.wav", dtype="int16")[0], pcm16(samples))


def test_a_short_text_never_checkpoints_so_a_dialogue_line_restarts_whole(tmp_path, models_dir) -> None:
    assert MAX_LINE_CHARS <= SHORT_TEXT_CHARS  # every dialogue line is a short text
    job = Job(tmp_path, "espeak", models_dir, text=text_of(SHORT_TEXT_CHARS - 200))
    job.attempt(stop_after=4)
    assert job.store.load() is None and job.ctx.checkpoints.writes == 0
    long = Job(tmp_path, "espeak", models_dir)
    long.attempt(stop_after=4)
    assert long.store.load() is not None and long.ctx.checkpoints.writes == 4  # one after each chunk (interval 0)


def test_a_checkpoint_is_refused_on_another_rung_and_in_another_state_version(tmp_path, models_dir) -> None:
    job = Job(tmp_path, "espeak", models_dir)
    job.attempt(stop_after=2)
    checkpoint = job.store.load()
    assert RESUME.why_not(checkpoint, "espeak") is None
    assert "same rung only" in RESUME.why_not(checkpoint, "piper")
    old = Checkpoint(**{**checkpoint.__dict__, "state": {**checkpoint.state, "version": STATE_VERSION + 1}})
    assert "version" in RESUME.why_not(old, "espeak")


def test_a_checkpoint_of_another_voice_on_the_same_rung_is_spoken_again_from_the_start(tmp_path, models_dir) -> None:
    # The rung was re-configured between two attempts (here: another chunk size): the engine
    # does not go on from chunks cut otherwise, and speaks the whole text as the new rung says.
    result, partials, reference = unkilled(tmp_path, "espeak", models_dir)
    job = Job(tmp_path / "changed", "espeak", models_dir)
    PARAMS["espeak"] = EspeakParams(max_chars=60)  # more chunks than the rung now makes: 35 kept of 50
    try:
        job.attempt(stop_after=35)
    finally:
        PARAMS["espeak"] = EspeakParams(max_chars=120)
    again, again_partials = job.attempt()
    assert job.ctx.resume is not None  # it was offered, and the engine chose to start over
    assert again == result and again_partials == partials
    # No chunk of the other cut is left among the artifacts.
    assert sorted(a.name for a in job.ctx.artifacts.list() if a.name.startswith("chunks/")) == [
        p["artifact"] for p in partials
    ]
    assert np.array_equal(job.audio(again), reference.audio(result))
