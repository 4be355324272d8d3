"""The speech stream's rule across attempts, on a job written into the session's real Redis and
storage folder the way a TTS worker writes it (attempt records, partial outputs, chunk files):
chunks of one attempt only; a cut-short attempt's successor goes on only if it says the chunks
already sent again, byte for byte."""

from __future__ import annotations

import json
import uuid
import wave
from typing import Any

import numpy as np
import pytest

from mediafarm.config.settings import get_settings
from mediafarm.gateway.openai.speech_stream import (
    SpeechFollower,
    StorageMissing,
    StreamBroken,
    StreamEncoder,
    wav_header,
)
from mediafarm.tasks.app import app
from mediafarm.tasks.producer.handles import JobHandle
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.artifacts import ArtifactStore

RATE = 22050


class FakeTtsJob:
    """A TTS job's traces as the worker leaves them, written by hand."""

    def __init__(self) -> None:
        self.id = f"speech-stream-{uuid.uuid4().hex[:8]}"
        self.redis = app.backend.client
        self.store = ArtifactStore(get_settings().storage_dir, self.id)
        self.at = 0.0

    def start_attempt(self, rung: str) -> None:
        """A new attempt's record; the partial outputs before it go in the same step (tasks.wire.history)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.rpush(keys.history(self.id), json.dumps({"rung": 0, "variant": rung, "outcome": None}))
        pipe.delete(keys.partials(self.id))
        pipe.execute()
        self.store.clear()
        self.at = 0.0

    def end_attempt(self, outcome: str) -> None:
        index = self.redis.llen(keys.history(self.id)) - 1
        record = json.loads(self.redis.lindex(keys.history(self.id), index))
        self.redis.lset(keys.history(self.id), index, json.dumps({**record, "outcome": outcome}))

    def chunk(self, index: int, tone: float, seconds: float = 0.25) -> None:
        """A chunk file, then its partial output (the engine's order)."""
        samples = (np.sin(np.arange(int(seconds * RATE)) * tone) * 8000).astype("<i2")
        name = f"chunks/chunk_{index:05d}.wav"
        with self.store.writing(name) as temp, wave.open(str(temp), "wb") as out:
            out.setnchannels(1), out.setsampwidth(2), out.setframerate(RATE)
            out.writeframes(samples.tobytes())
        start, self.at = self.at, round(self.at + seconds, 3)
        partial: dict[str, Any] = {"chunk": index, "artifact": name, "start": start, "end": self.at, "sentences": []}
        self.redis.rpush(keys.partials(self.id), json.dumps(partial))

    def follower(self) -> SpeechFollower:
        return SpeechFollower(JobHandle(self.id, "tts"), get_settings().storage_dir)


def test_a_successor_that_speaks_the_sent_chunks_differently_breaks_the_stream() -> None:
    job = FakeTtsJob()
    follower = job.follower()
    assert follower.poll() == []  # nothing made yet
    job.start_attempt("piper")
    job.chunk(0, 0.05)
    job.chunk(1, 0.06)
    first = follower.poll()
    assert len(first) == 2 and follower.rung == "piper" and follower.attempt == 0 and follower.rate == RATE
    job.end_attempt("killed")
    job.chunk(2, 0.07)  # never happens after a kill; even so, an ended attempt sends no more
    assert follower.poll() == []
    job.start_attempt("espeak")
    assert follower.poll() == []  # the next attempt has said nothing yet
    job.chunk(0, 0.9)  # another voice
    with pytest.raises(StreamBroken, match="attempt 0 on piper ended killed after 2 chunks were sent"):
        follower.poll()


def test_a_successor_that_says_the_sent_chunks_again_takes_over_without_a_repeat() -> None:
    job = FakeTtsJob()
    follower = job.follower()
    job.start_attempt("espeak")
    job.chunk(0, 0.05)
    job.chunk(1, 0.06)
    sent = follower.poll()
    job.end_attempt("transient")
    job.start_attempt("espeak")
    job.chunk(0, 0.05)
    assert follower.poll() == [] and follower.attempt == 0 and follower.checked == 1
    job.chunk(1, 0.06)
    job.chunk(2, 0.07)
    rest = follower.poll()
    assert follower.attempt == 1 and len(rest) == 1  # chunk 2 only: 0 and 1 were sent already
    assert [p.data for p in sent] != [] and rest[0].data not in [p.data for p in sent]


def test_a_chunk_missing_from_the_gateways_storage_is_said_so() -> None:
    job = FakeTtsJob()
    job.start_attempt("espeak")
    job.chunk(0, 0.05)
    job.store.clear()  # a gateway whose FARM_STORAGE_DIR is not the workers'
    with pytest.raises(StorageMissing, match="FARM_STORAGE_DIR"):
        job.follower().poll()


def test_the_wav_stream_header_says_unknown_sizes_and_the_rate() -> None:
    header = wav_header(RATE)
    assert len(header) == 44 and header[4:8] == header[40:44] == b"\xff\xff\xff\xff"
    assert int.from_bytes(header[24:28], "little") == RATE
    encoder = StreamEncoder("wav")
    job = FakeTtsJob()
    job.start_attempt("espeak")
    job.chunk(0, 0.05)
    [pcm] = job.follower().poll()
    assert encoder.feed(pcm) == header + pcm.data and encoder.feed(pcm) == pcm.data and encoder.finish() == b""
