"""Pushed audio through the session's real Redis: what the pusher writes is what the reader reads,
sample for sample, from the start or from a resume point, at any rate; the stream ends, stalls,
trims and tells its pusher how far ahead it is."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest
import redis as redis_lib

from mediafarm.tasks.families.subtitle_live.push import (
    AudioPush,
    PushEnded,
    PushFormatError,
    PushSource,
    PushTaken,
    parse_push_url,
    push_key,
    read_key,
    reader_key,
)
from mediafarm.tasks.families.subtitle_live.sources import SourceNotAllowed, check_source, parse_url
from mediafarm.tasks.families.subtitle_live.spec import LiveSubtitleRequest


@pytest.fixture()
def redis(redis_url: str):
    client = redis_lib.Redis.from_url(redis_url)
    yield client
    client.close()


def _tone(seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    mono = (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")
    return np.repeat(mono[:, None], channels, axis=1)


def _read_all(source: PushSource) -> tuple[list[float | None], np.ndarray]:
    pts, chunks = [], []
    with source:
        for at, samples in source.frames():
            pts.append(at)
            chunks.append(samples)
    return pts, np.concatenate(chunks)


def test_what_is_pushed_in_odd_pieces_is_read_back_sample_for_sample(redis) -> None:
    pcm = _tone(3.0, 16000).tobytes()
    with AudioPush(redis) as push:
        # Pieces that split frames (a WebSocket message may end mid-sample).
        for i in range(0, len(pcm), 3001):
            push.write(pcm[i : i + 3001])
    pts, samples = _read_all(PushSource(redis, push.url, stall_timeout=2, reader="job-1"))
    expected = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    assert np.array_equal(samples, expected)
    assert pts[0] == 0.0 and all(b > a for a, b in itertools.pairwise(pts))


def test_a_resumed_reader_starts_exactly_at_its_resume_point(redis) -> None:
    pcm = _tone(4.0, 16000).tobytes()
    with AudioPush(redis) as push:
        for i in range(0, len(pcm), 6400):
            push.write(pcm[i : i + 6400])
    pts, samples = _read_all(PushSource(redis, push.url, stall_timeout=2, reader="job-1", start_pts=1.2345))
    start = round(1.2345 * 16000)
    assert pts[0] == pytest.approx(start / 16000)
    assert np.array_equal(samples, (np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0)[start:])


def test_stereo_at_48k_is_read_as_16k_mono_on_the_pushed_clock(redis) -> None:
    with AudioPush(redis, sample_rate=48000, channels=2) as push:
        push.write(_tone(2.0, 48000, channels=2).tobytes())
    pts, samples = _read_all(PushSource(redis, push.url, stall_timeout=2, reader="job-1"))
    assert abs(samples.size - 32000) <= 64 and pts[0] == 0.0
    spectrum = np.abs(np.fft.rfft(samples[1000:17000]))
    assert abs(np.argmax(spectrum) * 16000 / 16000 - 440) <= 2  # the 440 Hz tone, resampled


def test_a_push_with_nothing_coming_stalls_with_its_reason(redis) -> None:
    push = AudioPush(redis)
    push.write(_tone(0.5, 16000).tobytes())
    began = time.monotonic()
    with pytest.raises(PushEnded, match=r"stalled: nothing was pushed for 1.5 s"):
        _read_all(PushSource(redis, push.url, stall_timeout=1.5, reader="job-1"))
    assert 1.4 <= time.monotonic() - began < 4


def test_a_reader_waits_for_a_pusher_that_starts_late(redis) -> None:
    push = AudioPush(redis)

    def later() -> None:
        time.sleep(0.8)
        with push:
            push.write(_tone(1.0, 16000).tobytes())

    threading.Thread(target=later).start()
    _, samples = _read_all(PushSource(redis, push.url, stall_timeout=5, reader="job-1"))
    assert samples.size == 16000


def test_the_pusher_trims_behind_the_reader_and_is_told_how_far_ahead_it_is(redis) -> None:
    push = AudioPush(redis, keep_seconds=1.0)
    second = _tone(1.0, 16000).tobytes()
    for _ in range(5):
        ahead = push.write(second)
    assert ahead == pytest.approx(5.0)  # no reader yet: nothing is trimmed, all of it is ahead
    assert redis.xlen(push_key(push.id)) == 5
    reader = PushSource(redis, push.url, stall_timeout=0.5, reader="job-1")
    with pytest.raises(PushEnded):
        _read_all(reader)  # reads the 5 s, then stalls
    assert push.write(second) == pytest.approx(1.0)
    # Kept: 1 s behind the reader's 5 s, and the second after it.
    first_kept = int(redis.xrange(push_key(push.id), count=1)[0][0].decode().split("-")[1]) - 1
    assert first_kept == 4 * 16000
    push.end()
    with pytest.raises(PushFormatError, match="has ended"):
        push.write(second)


def test_push_urls_are_checked_and_need_no_allow_list_entry() -> None:
    assert parse_push_url("push://abcdef0123456789?sample_rate=48000&channels=2")[1].sample_rate == 48000
    for bad, words in [
        ("push://short", "8-64"),
        ("push://abcdef0123456789?sample_rate=7", "sample_rate 7"),
        ("push://abcdef0123456789?channels=6", "mono or stereo"),
        ("push://abcdef0123456789?sample_rate=96000", "sample_rate 96000"),
        ("push://abcdef0123456789?rate=16000", "unknown parameter"),
        ("push://abcdef0123456789?channels=two", "whole number"),
    ]:
        with pytest.raises(SourceNotAllowed, match=words):
            parse_url(bad)
        with pytest.raises(ValueError, match=words):
            LiveSubtitleRequest(stream=bad)
    url = "push://abcdef0123456789?sample_rate=16000&channels=1"
    assert check_source(url, []) == url  # no FARM_LIVE_SOURCES entry: it is the farm's own Redis


def test_one_job_reads_a_push_and_its_keys_go_when_it_is_done(redis) -> None:
    with AudioPush(redis) as push:
        push.write(_tone(0.5, 16000).tobytes())
    _read_all(PushSource(redis, push.url, stall_timeout=2, reader="job-1"))
    # The same job's next attempt reads it again; another job naming the same URL is refused.
    again = PushSource(redis, push.url, stall_timeout=2, reader="job-1", start_pts=0.25)
    assert _read_all(again)[1].size == 4000
    with pytest.raises(PushTaken, match="read by another job \\(job-1\\)"):
        _read_all(PushSource(redis, push.url, stall_timeout=2, reader="job-2"))
    assert redis.ttl(push_key(push.id)) > 3600 and redis.ttl(read_key(push.id)) > 3600  # a worker's death outlived
    again.done()
    assert not redis.exists(push_key(push.id), read_key(push.id), reader_key(push.id))


def test_small_writes_are_gathered_into_entries_of_50_ms(redis) -> None:
    push = AudioPush(redis)
    pcm = _tone(1.0, 16000).tobytes()
    for i in range(0, len(pcm), 256):  # 128 samples at a time, as a browser's AudioWorklet posts them
        push.write(pcm[i : i + 256])
    push.end()
    assert redis.xlen(push_key(push.id)) <= 21  # 20 entries of 50 ms and the end, not 126
    assert np.array_equal(_read_all(PushSource(redis, push.url, stall_timeout=2, reader="j"))[1],
                          np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0)  # fmt: skip
