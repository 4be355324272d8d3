"""Audio pushed into the farm's own Redis: a live source that needs no listener, port or allow-list.

A producer that holds the audio itself (the gateway's WebSocket ``/v1/live/subtitles``, or a Python
program with :class:`AudioPush`) appends raw PCM to a Redis stream; the live job reads it as it
comes (:class:`PushSource`), from wherever its worker runs. The stream is named by a URL,
``push://<id>?sample_rate=16000&channels=1``, so it is a request's ``stream`` like any other.

Why a Redis stream: it is already shared by every producer and worker, it blocks a reader until
data comes (the stall timeout is the read's timeout), and it keeps what was pushed for a while, so
an attempt that takes over from a killed one reads the audio again from the checkpoint instead of
losing it (no gap, unlike a UDP or TCP stream, which the farm cannot rewind).

Layout of the stream: each entry holds whole frames of s16le PCM (``pcm``, at least
``ENTRY_SECONDS`` of them: a browser posting 128 samples at a time would otherwise cost a round trip
each), and its id is ``0-<first frame + 1>``: ids grow with the stream's own sample position, so the
entry holding a position is one ``XREVRANGE`` away, and trimming by position is ``XTRIM MINID``. The
last entry may be ``end``: the pusher ended the stream. The reader records how far it has read
(``:read``); the pusher keeps ``KEEP_SECONDS`` of audio behind that for a resumed attempt, trims
the rest, and is told how far ahead of the reader it is, so a producer faster than real time can be
told to wait (the gateway's ``hold`` frame) instead of growing Redis without a bound.

One job reads a push: its first attempt claims it (``:reader``, the job's id), and every other job
naming the same URL is refused, so a push id that leaks (it is in the job's request and result)
lets no one else read the audio or move the reading position. The keys live as long as a job
could still come back for them (the broker's visibility timeout, after a worker's death, plus an
hour; renewed by every write and read) and are deleted when the job ends for good.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from mediafarm.tasks.kit import family_key

if TYPE_CHECKING:
    import numpy as np

SCHEME = "push"
# An id is part of a Redis key and of a URL's host (which urlsplit lower-cases): lower-case only.
PUSH_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{7,63}$")
SAMPLE_RATES = range(8000, 48001)  # speech: 48 kHz is the most any capture needs
CHANNELS = (1, 2)
# Audio kept behind the reader's position, for an attempt that replaces a killed one: the live job
# checkpoints at every segment it publishes (every chunk_seconds, at most 60 s), and the audio from
# the checkpoint on is read again. A resumed attempt whose checkpoint is older than this finds the
# stream trimmed and records the missing part as a gap.
KEEP_SECONDS = 120.0
# How far ahead of the reader a pusher may get before it is told to wait (``AudioPush.ahead``).
MAX_AHEAD_SECONDS = 60.0
# The least audio one stream entry holds (the rest waits in the pusher for the next write).
ENTRY_SECONDS = 0.05
# Keys outlive the last write or read by the broker's visibility timeout (a job whose worker died
# comes back after it) plus this: a pusher or a job that vanished leaves nothing for long.
EXPIRE_MARGIN_SECONDS = 3600
# Entries a reader takes per round trip, and the longest it blocks in one.
READ_COUNT = 64
BLOCK_MS = 1000


class PushFormatError(ValueError):
    """A push URL, or a pushed format, the farm cannot read; the message names the problem."""


@dataclass(frozen=True)
class PushFormat:
    """Raw PCM, signed 16-bit little-endian, interleaved: ``sample_rate`` frames a second of ``channels``."""

    sample_rate: int = 16000
    channels: int = 1

    def __post_init__(self) -> None:
        if self.sample_rate not in SAMPLE_RATES:
            raise PushFormatError(f"sample_rate {self.sample_rate} is not within "
                                  f"{SAMPLE_RATES.start}-{SAMPLE_RATES.stop - 1} Hz")  # fmt: skip
        if self.channels not in CHANNELS:
            raise PushFormatError(f"channels {self.channels}: pushed audio is mono or stereo (1 or 2)")

    @property
    def frame_bytes(self) -> int:
        return 2 * self.channels


def push_key(push_id: str) -> str:
    """The Redis stream a push is written to."""
    return family_key("subtitle-live", "push", push_id)


def read_key(push_id: str) -> str:
    """Frames of the push its reader has taken (``AudioPush.ahead`` and the trim read it)."""
    return family_key("subtitle-live", "push", push_id, "read")


def reader_key(push_id: str) -> str:
    """The job that reads the push (the first to open it)."""
    return family_key("subtitle-live", "push", push_id, "reader")


def expire_seconds() -> int:
    """How long the keys of a push outlive their last write or read."""
    from mediafarm.tasks.kit import get_settings

    return get_settings().visibility_timeout + EXPIRE_MARGIN_SECONDS


def push_url(push_id: str, fmt: PushFormat) -> str:
    return f"{SCHEME}://{push_id}?sample_rate={fmt.sample_rate}&channels={fmt.channels}"


def is_push_url(url: str) -> bool:
    """Does ``url`` name a push (whatever else is wrong with it)?"""
    return urlsplit(url.strip()).scheme.lower() == SCHEME


def parse_push_url(url: str) -> tuple[str, PushFormat]:
    """(id, format) of a ``push://`` URL; PushFormatError naming what does not fit."""
    if not is_push_url(url):
        raise PushFormatError(f"stream {url!r} is not a push:// URL")
    parts = urlsplit(url.strip())
    push_id = parts.netloc
    if not PUSH_ID.match(push_id):
        raise PushFormatError(f"stream {url!r}: a push id is 8-64 lower-case letters, digits, '_' or '-'")
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"sample_rate", "channels"})
    if unknown:
        raise PushFormatError(f"stream {url!r}: unknown parameter(s) {', '.join(unknown)}; "
                              "a push takes sample_rate and channels")  # fmt: skip
    values: dict[str, int] = {}
    for name in ("sample_rate", "channels"):
        if name in query:
            try:
                values[name] = int(query[name][-1])
            except ValueError:
                raise PushFormatError(f"stream {url!r}: {name} must be a whole number") from None
    return push_id, PushFormat(**values)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field(fields: dict[Any, Any], name: str) -> Any:
    return fields.get(name.encode(), fields.get(name))


class AudioPush:
    """The producer's end: ``with AudioPush(redis, sample_rate=16000) as push: job = submit(...,
    stream=push.url); push.write(pcm) ...``; leaving the block (or :meth:`end`) ends the stream.

    ``write`` takes any number of bytes (a WebSocket message may split a frame): whole frames are
    appended, the rest waits for the next write. Not thread-safe: one writer per push.
    """

    def __init__(self, redis: Any, *, sample_rate: int = 16000, channels: int = 1, push_id: str | None = None,
                 keep_seconds: float = KEEP_SECONDS) -> None:  # fmt: skip
        self.redis = redis
        self.format = PushFormat(sample_rate, channels)
        self.id = push_id or uuid.uuid4().hex
        if not PUSH_ID.match(self.id):
            raise PushFormatError(f"push id {self.id!r}: 8-64 lower-case letters, digits, '_' or '-'")
        self.keep_frames = round(keep_seconds * sample_rate)
        self.entry_bytes = round(ENTRY_SECONDS * sample_rate) * self.format.frame_bytes
        self.expire = expire_seconds()
        self.frames = 0  # frames appended to the stream so far
        self._read_frames = 0  # the reader's position as last read
        self.ended = False
        self._rest = b""  # bytes not appended yet: a part of a frame, or less than an entry

    @property
    def url(self) -> str:
        return push_url(self.id, self.format)

    def write(self, data: bytes) -> float:
        """Append ``data`` (s16le PCM); returns how many seconds of audio the reader has not taken yet."""
        if self.ended:
            raise PushFormatError("the push has ended: it takes no more audio")
        self._rest += bytes(data)
        if len(self._rest) < self.entry_bytes:  # held back: the reader's position as last read
            return (self.frames - self._read_frames) / self.format.sample_rate
        return self._append()

    def _append(self) -> float:
        """The whole frames held back, as one entry; the seconds the reader has not taken."""
        whole = len(self._rest) - len(self._rest) % self.format.frame_bytes
        data, self._rest = self._rest[:whole], self._rest[whole:]
        if not whole:
            return self.ahead()
        first = self.frames
        self.frames += whole // self.format.frame_bytes
        key = push_key(self.id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xadd(key, {"pcm": data}, id=f"0-{first + 1}")
        pipe.get(read_key(self.id))
        pipe.expire(key, self.expire)
        _, read, _ = pipe.execute()
        read_frames = self._read_frames = int(read) if read is not None else 0
        keep_from = min(read_frames, self.frames) - self.keep_frames
        if keep_from > 0:
            # From the entry holding the keep point on: trimming at the point itself would drop it whole.
            holding = self.redis.xrevrange(key, max=f"0-{keep_from + 1}", min="-", count=1)
            if holding:
                self.redis.xtrim(key, minid=_text(holding[0][0]), approximate=False)
        return (self.frames - read_frames) / self.format.sample_rate

    def ahead(self) -> float:
        """Seconds of pushed audio the reader has not taken (all of it before a job reads)."""
        read = self.redis.get(read_key(self.id))
        return (self.frames - (int(read) if read is not None else 0)) / self.format.sample_rate

    def end(self) -> None:
        """End the stream (a partial frame left over is dropped): the job ends with it. Marked
        ended only once Redis took it, so a call after a failed one tries again."""
        if self.ended:
            return
        self._append()
        key = push_key(self.id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xadd(key, {"end": "1"}, id=f"0-{self.frames + 1}")
        pipe.expire(key, self.expire)
        pipe.execute()
        self.ended = True

    def __enter__(self) -> AudioPush:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.end()


class PushEnded(Exception):
    """The push stalled: nothing came within the stall timeout (the message says so)."""


class PushTaken(PushFormatError):
    """Another job reads this push."""


class PushSource:
    """The job's end: ``with PushSource(redis, url, stall_timeout=10) as source: for pts, samples
    in source.frames(): ...``, as :class:`~.source.LiveSource` yields them (pts in seconds of the
    pushed stream, samples 16 kHz mono float32).

    ``start_pts``: read from that stream time on (an attempt that resumes: the audio since its
    checkpoint is read again), or from the oldest audio kept when it is gone or not given.
    """

    def __init__(self, redis: Any, url: str, *, stall_timeout: float, reader: str, start_pts: float | None = None,
                 rate: int = 16000) -> None:  # fmt: skip
        self.redis, self.stall_timeout, self.start_pts, self.rate = redis, stall_timeout, start_pts, rate
        self.reader = reader  # the job's id: its attempts read the push, no other job does
        self.id, self.format = parse_push_url(url)
        self.key = push_key(self.id)
        self.expire = expire_seconds()

    def __enter__(self) -> PushSource:
        key = reader_key(self.id)
        if not self.redis.set(key, self.reader, nx=True, ex=self.expire):
            owner = _text(self.redis.get(key) or b"")
            if owner and owner != self.reader:
                raise PushTaken(f"push {self.id} is read by another job ({owner}); a push is read by one job only")
        return self

    def done(self) -> None:
        """The job has ended for good: the push's keys go (a pusher still writing gets an error)."""
        self.redis.delete(self.key, read_key(self.id), reader_key(self.id))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        return None

    def _first_id(self) -> tuple[str, int | None]:
        """The id to read after, and the frame to start at (None: the first one read)."""
        if self.start_pts is None:
            return "0-0", None
        start = max(0, round(self.start_pts * self.format.sample_rate))
        holding = self.redis.xrevrange(self.key, max=f"0-{start + 1}", min="-", count=1)
        if not holding:
            return "0-0", None  # trimmed past the checkpoint (or nothing pushed yet): the oldest kept
        entry_id = _text(holding[0][0])
        first = int(entry_id.split("-")[1])
        return f"0-{first - 1}" if first > 1 else "0-0", start

    def frames(self) -> Iterator[tuple[float | None, np.ndarray]]:
        import numpy as np  # here, not at the top: the spec imports this module in every farm process

        after, start = self._first_id()
        fmt = self.format
        resampler = _Resampler(fmt.sample_rate, self.rate)
        expected: int | None = None  # the next frame position, to see entries trimmed before they were read
        while True:
            answer = self._read(after)
            for entry_id, fields in answer:
                after = _text(entry_id)
                if _field(fields, "end") is not None:
                    self._read_to(expected)
                    yield from resampler.flush()
                    return
                first = int(after.split("-")[1]) - 1
                pcm = np.frombuffer(_field(fields, "pcm"), dtype="<i2")
                samples = pcm.reshape(-1, fmt.channels).astype(np.float32).mean(axis=1) / 32768.0
                if start is not None and first < start:  # the entry holding the resume point: from there
                    samples, first = samples[start - first :], start
                if samples.size == 0:
                    continue
                if expected is not None and first != expected:
                    resampler.reset()  # entries trimmed before they were read: the clock sees the jump
                expected = first + samples.size
                yield from resampler.feed(first / fmt.sample_rate, samples)
            self._read_to(expected)

    def _read_to(self, position: int | None) -> None:
        """Record how far the job has read, and keep the push's keys as long again."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(read_key(self.id), position or 0, ex=self.expire)
        pipe.expire(self.key, self.expire)
        pipe.expire(reader_key(self.id), self.expire)
        pipe.execute()

    def _read(self, after: str) -> list[Any]:
        """The entries after ``after``, waiting up to the stall timeout in reads of at most
        ``BLOCK_MS`` (under any socket timeout the farm's Redis client has); PushEnded past it."""
        from mediafarm.tasks.kit import alive  # the worker's heartbeat: a producer that pushes never loads it

        deadline = time.monotonic() + self.stall_timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PushEnded(f"stalled: nothing was pushed for {self.stall_timeout:g} s (stall_timeout_s)")
            block = max(1, min(BLOCK_MS, round(left * 1000)))
            answer = self.redis.xread({self.key: after}, count=READ_COUNT, block=block)
            alive()  # a push that pauses is no stuck child (it ends past stall_timeout_s)
            if answer:
                return list(answer[0][1])


class _Resampler:
    """Mono float32 at ``source`` Hz → ``target`` Hz, each chunk with its stream time: FFmpeg's
    resampler (PyAV) when the rates differ, nothing at all when they are the same."""

    def __init__(self, source: int, target: int) -> None:
        self.source, self.target = source, target
        self._av: Any = None
        self._pts: float | None = None  # stream time of the next resampled sample

    def reset(self) -> None:
        self._av, self._pts = None, None

    def feed(self, pts: float, samples: np.ndarray) -> Iterator[tuple[float, np.ndarray]]:
        if self.source == self.target:
            yield pts, samples
            return
        import av

        if self._av is None:
            self._av = av.AudioResampler(format="flt", layout="mono", rate=self.target)
            self._pts = pts
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = self.source
        yield from self._out(self._av.resample(frame))

    def flush(self) -> Iterator[tuple[float, np.ndarray]]:
        if self._av is not None:
            yield from self._out(self._av.resample(None))

    def _out(self, frames: list[Any]) -> Iterator[tuple[float, np.ndarray]]:
        for frame in frames:
            out = frame.to_ndarray().reshape(-1)  # float32: the resampler makes "flt"
            if out.size:
                assert self._pts is not None
                yield self._pts, out
                self._pts += out.size / self.target
