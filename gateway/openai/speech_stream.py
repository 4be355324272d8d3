"""A TTS job's audio as one stream, chunk by chunk as the worker announces them.

The TTS engines write each chunk as ``chunks/chunk_NNNNN.wav`` (the track's exact samples) and
then announce it as a partial output (``tasks.families.tts.engines.speak``). The partial outputs
in Redis are always the newest attempt's (an attempt's record clears the ones before in the same
Redis step, ``tasks.wire.history``), and an attempt's folder is cleared only after its record is
written. So a chunk file read while the history still has as many attempts as when its partial
output was seen is that attempt's own; :class:`SpeechFollower` checks this after every read (and
that the file holds as many samples as the partial output says), and never mixes two attempts.

When an attempt whose chunks were already sent is cut short (killed, out of memory), the next
attempt speaks the text again from its first chunk, usually on the rung below: another voice,
other chunk boundaries. The stream goes on with it only if it makes the chunks already sent again
byte for byte (a retry on the same deterministic rung); otherwise it ends with
:class:`StreamBroken`, and the client sees a body cut short. Nothing here blocks on the event
loop: :meth:`SpeechFollower.poll` reads Redis and files, so it runs in a worker thread.
"""

from __future__ import annotations

import hashlib
import io
import struct
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mediafarm.tasks.producer.handles import JobHandle, Snapshot, describe_failure
from mediafarm.tasks.wire import object_store
from mediafarm.tasks.wire.plan import READY

# A chunk's duration in its partial output is rounded to the millisecond at each end.
DURATION_SLACK_S = 0.0025
# WAV sizes for a stream of unknown length: the largest a RIFF header can say, as OpenAI and
# Kokoro-FastAPI send; players read to the end of the stream.
UNKNOWN_SIZE = 0xFFFFFFFF


class NoAudio(Exception):
    """The job ended before any chunk was made. Attributes: state, failure (``{"kind", "reason"}``)."""

    def __init__(self, state: str, failure: dict[str, Any] | None) -> None:
        super().__init__(f"{state}: {(failure or {}).get('reason', 'no audio was made')}")
        self.state, self.failure = state, failure


class StreamBroken(Exception):
    """The audio already sent cannot be continued: the stream must end as an error."""


class StorageMissing(StreamBroken):
    """A chunk the worker announced is not in this gateway's storage folder."""


@dataclass(frozen=True)
class Pcm:
    """One chunk's audio: 16-bit little-endian mono samples. Attributes: rate, data."""

    rate: int
    data: bytes

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.rate.to_bytes(4, "little") + self.data).hexdigest()


def read_wav(data: bytes, name: str) -> Pcm:
    """A chunk file's samples (the engines write 16-bit mono PCM WAV)."""
    with wave.open(io.BytesIO(data), "rb") as chunk:
        if chunk.getsampwidth() != 2 or chunk.getnchannels() != 1:
            raise StreamBroken(f"{name}: not 16-bit mono PCM")
        return Pcm(chunk.getframerate(), chunk.readframes(chunk.getnframes()))


@dataclass
class SpeechFollower:
    """Follows one TTS job; :meth:`poll` gives the chunks to send next.

    Attributes:
        attempt: The attempt whose chunks are being sent (None before the first).
        rung: Its rung's name.
        sent: Digests of the chunks sent, in order.
        checked: Chunks of a newer attempt found equal to those sent (when one takes over).
        done: Every chunk of the successful attempt was given.
    """

    job: JobHandle
    storage_dir: Path
    attempt: int | None = None
    rung: str | None = None
    sent: list[str] = field(default_factory=list)
    checked: int = 0
    done: bool = False

    @property
    def rate(self) -> int | None:
        return self._rate

    def __post_init__(self) -> None:
        self._rate: int | None = None
        self._checking: int | None = None

    def poll(self) -> list[Pcm]:
        """The chunks made since the last call (blocking). NoAudio when the job ended without a
        chunk, StreamBroken when what was sent cannot be continued."""
        now = self.job.snapshot(detail=False)
        target = self.attempt
        if target is None and now.partials and _usable(now.attempts[now.owner]):
            target = now.owner
        elif target is not None and now.owner > target:
            self._take_over(now)
            target = self.attempt
        fresh: list[Pcm] = []
        # An attempt that ended without success sends nothing more: the next one must say it again.
        if target is not None and target == now.owner and _usable(now.attempts[target]):
            for partial in now.partials[len(self.sent) :]:
                pcm = self._read(partial, now)
                if pcm is None:  # a newer attempt began while it was read: the next look sees it
                    break
                if self.attempt is None:
                    self.attempt, self.rung, self._rate = target, now.attempts[target].get("rung"), pcm.rate
                self.sent.append(pcm.digest)
                fresh.append(pcm)
        if now.state in READY:
            self._end(now)
        return fresh

    def _caught_up(self, now: Snapshot) -> bool:
        return self.attempt == now.owner and len(self.sent) == len(now.partials)

    def _end(self, now: Snapshot) -> None:
        """The job has ended: done if every chunk of its successful attempt was given."""
        last = now.attempts[-1] if now.attempts else {}
        if now.state == "SUCCESS" and self._caught_up(now) and last.get("outcome") == "ok":
            self.done = True
            return
        if now.state == "SUCCESS" and self.attempt is not None and self.attempt != now.owner:
            return  # a newer attempt's chunks are still being checked against those sent
        failure = _failure(self.job) if now.state != "SUCCESS" else None
        if not self.sent:
            raise NoAudio(now.state, failure)
        if now.state != "SUCCESS":
            reason = (failure or {}).get("reason", now.state)
            raise StreamBroken(f"job {self.job.id} ended {now.state} after {len(self.sent)} chunks were sent: {reason}")

    def _take_over(self, now: Snapshot) -> None:
        """A newer attempt runs: go on with it only if it speaks the chunks sent, byte for byte."""
        cut = now.attempts[self.attempt or 0]
        if self._checking != now.owner:  # yet another attempt: it is checked from its first chunk
            self._checking, self.checked = now.owner, 0
        for partial in now.partials[self.checked : len(self.sent)]:
            pcm = self._read(partial, now)
            if pcm is None:
                return
            if pcm.digest != self.sent[self.checked]:
                rung, outcome = now.attempts[now.owner].get("rung"), cut.get("outcome") or "cut short"
                raise StreamBroken(
                    f"job {self.job.id}: attempt {self.attempt} on {self.rung} ended {outcome} "
                    f"after {len(self.sent)} chunks were sent, and attempt {now.owner} on {rung} speaks chunk "
                    f"{self.checked} differently; the rest cannot follow without a seam (the whole audio is the "
                    "job's artifact once it succeeds)"
                )  # fmt: skip
            self.checked += 1
        if self.checked == len(self.sent):  # it has said again all that was sent: it takes over
            self.attempt, self.checked, self._checking = now.owner, 0, None

    def _read(self, partial: dict[str, Any], now: Snapshot) -> Pcm | None:
        """The chunk a partial output announces, if it is still the announcing attempt's."""
        name = str(partial.get("artifact", ""))
        try:
            data = self.job.partial_file(partial, len(now.attempts), self.storage_dir)
            if data is None:  # a newer attempt began: whatever was read may be its
                return None
            pcm = read_wav(data, name)
        except object_store.StoreUnavailable as exc:  # the store away (a gone object is FileNotFoundError)
            raise StorageMissing(f"chunk {name!r} of job {self.job.id} cannot be read: {exc}") from None
        except (FileNotFoundError, EOFError, wave.Error):
            if partial.get("url"):
                raise StorageMissing(f"chunk {name!r} of job {self.job.id} is not in the object store at "
                                     f"{partial['url']}") from None  # fmt: skip
            raise StorageMissing(f"chunk {name!r} of job {self.job.id} is not in this gateway's storage folder "
                                 "(FARM_STORAGE_DIR must be the workers' shared one)") from None  # fmt: skip
        seconds = len(pcm.data) / 2 / pcm.rate
        expected = float(partial.get("end", 0)) - float(partial.get("start", 0))
        if abs(seconds - expected) > DURATION_SLACK_S:
            raise StreamBroken(f"chunk {name!r} of job {self.job.id} holds {seconds:.3f} s, its announcement "
                               f"says {expected:.3f} s")  # fmt: skip
        return pcm


def _usable(attempt: dict[str, Any]) -> bool:
    """Is this attempt running, or ended with success?"""
    return attempt.get("outcome") in (None, "ok")


def _failure(job: JobHandle) -> dict[str, Any] | None:
    return describe_failure(job.failure())


def wav_header(rate: int) -> bytes:
    """A 16-bit mono WAV header for a stream whose length is not known yet."""
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", UNKNOWN_SIZE) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + \
        struct.pack("<I", UNKNOWN_SIZE)  # fmt: skip


class _Sink:
    """Where PyAV writes the encoded bytes; taken away after each chunk."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> int:
        self.data += data
        return len(data)

    def take(self) -> bytes:
        data, self.data = bytes(self.data), bytearray()
        return data


class StreamEncoder:
    """PCM chunks → the bytes of one response body in ``fmt`` (``pcm``, ``wav``, ``mp3``, ``opus``).

    mp3 and Ogg Opus go through the TTS family's own PyAV encoder, writing to memory; what it
    muxes is sent after every chunk. Blocking (encoding): call it in a worker thread.
    """

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self._sink = _Sink()
        self._encoder: Any = None
        self._started = False

    def feed(self, pcm: Pcm) -> bytes:
        head = b""
        if not self._started:
            self._started = True
            if self.fmt == "wav":
                head = wav_header(pcm.rate)
            elif self.fmt in ("mp3", "opus"):
                from mediafarm.tasks.families.tts import Encoder

                self._encoder = Encoder(self._sink, self.fmt, pcm.rate)  # type: ignore[arg-type]
        if self._encoder is None:
            return head + pcm.data
        samples = np.frombuffer(pcm.data, dtype="<i2").astype(np.float32) / 32768.0
        self._encoder.write(samples)
        return self._sink.take()

    def finish(self) -> bytes:
        """The encoder's last bytes (its flush); the body ends after them."""
        if self._encoder is None:
            return b""
        encoder, self._encoder = self._encoder, None
        encoder.__exit__(None, None, None)
        return self._sink.take()

    def close(self) -> None:
        """Free the encoder without flushing (the stream was cut short)."""
        if self._encoder is not None:
            encoder, self._encoder = self._encoder, None
            encoder.__exit__(StreamBroken, None, None)
