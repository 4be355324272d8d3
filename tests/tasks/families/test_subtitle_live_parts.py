"""The live subtitle engine's parts, each alone: the VAD family's streaming silero, the audio buffer
and arrival clock, the HLS playlist's gaps, and an attempt's state across a checkpoint. The whole
engine on real streams: tests/integration/test_subtitle_live_jobs.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mediafarm.tasks.families.subtitle.engines import VAD_PARAMS
from mediafarm.tasks.families.subtitle.records import Cue
from mediafarm.tasks.families.subtitle_live.buffer import Arrivals, AudioBuffer
from mediafarm.tasks.families.subtitle_live.job_state import LiveJob
from mediafarm.tasks.families.subtitle_live.playlist import PLAYLIST, files, mark_gaps
from mediafarm.tasks.families.subtitle_live.spec import Gap, LiveSubtitleRequest
from mediafarm.tasks.families.vad.engines import SpanTracker, silero
from mediafarm.tasks.families.vad.spec import VadRequest
from mediafarm.tasks.families.vad.streaming import StreamingSilero
from mediafarm.tasks.kit import EngineContext, Span
from mediafarm.tasks.wire.checkpoint import Checkpoint


def test_the_streaming_vad_finds_the_file_engines_spans_however_the_audio_arrives(tmp_path: Path) -> None:
    from tests.support.speech import make_track

    track = make_track(tmp_path / "speech.wav")
    audio, rate = sf.read(track.path, dtype="float32")
    assert rate == 16000
    whole = silero(EngineContext.local(storage_dir=tmp_path / "s"), VadRequest(media=str(track.path)), VAD_PARAMS)
    rng = np.random.default_rng(3)
    vad, spans, at = StreamingSilero(VAD_PARAMS), [], 0
    while at < audio.size:  # frames of 10-700 ms, as a decoder hands them over
        step = int(rng.integers(160, 11200))
        spans += vad.feed(audio[at : at + step])
        at += step
    last = vad.finish()
    spans += [last] if last is not None else []
    seconds = [round(edge / rate, 3) for span in spans for edge in span]
    assert len(seconds) == 2 * len(whole.spans) >= 8
    assert seconds == pytest.approx([edge for s in whole.spans for edge in (s.start, s.end)], abs=0.002)


def test_a_span_too_long_is_cut_and_a_new_one_opens_where_it_was_cut() -> None:
    tracker = SpanTracker(VAD_PARAMS)
    assert tracker.cut(1000) is None and tracker.close(2000) is None  # nothing open
    tracker.feed([0.9] * 10)  # speech from the first window on
    start = tracker.start
    assert start is not None and tracker.cut(start) is None  # not before it began
    assert tracker.cut(4000) == (start, 4000) and tracker.spans == [(start, 4000)] and tracker.start == 4000
    assert tracker.close(6000) == (4000, 6000) and not tracker.triggered and tracker.spans == [(start, 4000)]


def test_the_buffer_keeps_only_what_is_not_yet_recognised_by_absolute_position() -> None:
    buffer = AudioBuffer()
    buffer.append(np.arange(10, dtype=np.float32))
    buffer.append(np.arange(10, 20, dtype=np.float32))
    buffer.drop_before(5)
    assert (buffer.start, buffer.end) == (5, 20)
    assert buffer.cut(3, 8).tolist() == [5, 6, 7]  # clipped to what is still held
    assert buffer.cut(18, 30).tolist() == [18, 19] and buffer.cut(12, 11).size == 0
    buffer.drop_before(50)
    assert (buffer.start, buffer.end, buffer.data.size) == (20, 20, 0)


def test_arrivals_date_stream_time_by_the_frame_that_waited_least_within_the_window() -> None:
    arrivals = Arrivals()
    assert arrivals.wall_of(1.0) is None
    arrivals.add(0.0, 100.0)
    arrivals.add(1.0, 101.8)  # waited 0.8 s in the socket
    arrivals.add(2.0, 102.1)
    assert arrivals.wall_of(1.0) == pytest.approx(101.0)
    arrivals.add(40.0, 150.0)  # the sender paused: the early frames are out of the window
    assert arrivals.wall_of(40.0) == pytest.approx(150.0)


PLAYLIST_TEXT = "\n".join([
    "#EXTM3U", "#EXT-X-VERSION:6", "#EXT-X-TARGETDURATION:2",
    "#EXTINF:2.000,", "segment_00000.vtt", "#EXTINF:2.000,", "segment_00001.vtt",
    "#EXTINF:2.000,", "segment_00002.vtt",
])  # fmt: skip


def test_segments_wholly_inside_a_gap_are_marked_and_the_playlist_is_version_8() -> None:
    assert mark_gaps(PLAYLIST_TEXT, [], 2.0) == PLAYLIST_TEXT
    marked = mark_gaps(PLAYLIST_TEXT, [Gap(start=1.5, end=4.0, reason="attempt 1 was lost")], 2.0).split("\n")
    assert marked[1] == "#EXT-X-VERSION:8"
    # Only segment 1 ([2, 4)) lies wholly inside [1.5, 4); its tag comes before its #EXTINF.
    assert marked.count("#EXT-X-GAP") == 1 and marked[marked.index("#EXT-X-GAP") + 2] == "segment_00001.vtt"
    assert files(2) == ["chunks/segment_00000.vtt", "chunks/segment_00001.vtt", PLAYLIST]


def test_an_attempt_resumed_from_a_checkpoint_goes_on_from_the_earlier_ones_state(tmp_path: Path) -> None:
    request = LiveSubtitleRequest.model_construct(stream="udp://127.0.0.1:1", language=None, chunk_seconds=2.0,
                                                  rules=LiveSubtitleRequest.model_fields["rules"].get_default(
                                                      call_default_factory=True))  # fmt: skip
    ctx = dataclasses.replace(EngineContext.local(storage_dir=tmp_path), rung="whisper-tiny")
    first = LiveJob(ctx, request)
    first.clock.anchor(0, 90.0)
    first.clock.anchor(32000, 95.0)  # a 3 s jump, absorbed and recorded
    first.cues.all = [Cue(start=0.5, end=1.5, lines=["Hello there."]), Cue(start=4.2, end=5.0, lines=["Again."])]
    first.chunks.add(first.cues.all, final_until=4.0)
    first.speech, first.words, first.language, first.final_until = [Span(0.4, 1.6), Span(4.1, 5.1)], 3, "en", 4.0
    first.gaps = [Gap(start=6.0, end=7.0, reason="attempt 0 was lost")]
    state = first.state()
    assert state["segments"] == 2 and state["clock"]["offset"] == pytest.approx(3.0)

    resumed = LiveJob(dataclasses.replace(ctx, resume=Checkpoint(4.0, "seconds", "whisper-tiny", state)), request)
    again = resumed.state()
    assert (again["attempts"], resumed.resumed_at) == (state["attempts"] + 1, 4.0)
    assert {k: v for k, v in again.items() if k not in ("attempts", "ran")} == {
        k: v for k, v in state.items() if k not in ("attempts", "ran")
    }
    assert resumed.clock.discontinuities == first.clock.discontinuities
    # The segments written are not written again: the next one the writer makes is segment 2.
    assert resumed.chunks.segment_count == 2 and resumed.files()[-1] == PLAYLIST
