"""WebVTT and SRT writing, read back with webvtt-py, srt and PyAV; chunked WebVTT for HLS."""

from __future__ import annotations

import html
import io
import math
from pathlib import Path

import av
import pytest
import srt
import webvtt
from hypothesis import given, settings
from hypothesis import strategies as st

from mediafarm.tasks.families.subtitle.cues import build_cues
from mediafarm.tasks.families.subtitle.records import Cue, CueRules, Word
from mediafarm.tasks.families.subtitle.writers import (
    X_TIMESTAMP_MAP,
    ChunkedWebVTT,
    concat_segment_cues,
    to_srt,
    to_webvtt,
)

CUES = [
    Cue(start=0.5, end=1.2344, lines=["Hello there,", "general Kenobi."]),
    Cue(start=1.3, end=2.0005, lines=["AT&T <unk> a<b>c -->"]),
    Cue(start=9.5, end=10.5, lines=["Across the boundary."]),
    Cue(start=3725.25, end=3727.0, lines=["An hour later: ünïcödé …"]),
]


def ms(seconds: float) -> int:
    return math.floor(seconds * 1000 + 0.5)


def test_webvtt_reads_back_to_the_same_times_and_text() -> None:
    text = to_webvtt(CUES)
    assert text.startswith("WEBVTT\n")
    for parsed in (webvtt.from_string(text), webvtt.from_buffer(io.StringIO(text))):
        got = [(c.start_time.in_milliseconds(), c.end_time.in_milliseconds(), html.unescape(c.text)) for c in parsed]
        assert got == [(ms(c.start), ms(c.end), c.text) for c in CUES]


def test_webvtt_escapes_markup_so_a_player_shows_it() -> None:
    assert "AT&amp;T &lt;unk&gt; a&lt;b&gt;c --&gt;" in to_webvtt(CUES)


def test_srt_reads_back_to_the_same_times_and_text() -> None:
    parsed = list(srt.parse(to_srt(CUES)))
    assert [s.index for s in parsed] == [1, 2, 3, 4]
    got = [(s.start.total_seconds() * 1000, s.end.total_seconds() * 1000, s.content) for s in parsed]
    assert got == [(ms(c.start), ms(c.end), c.text) for c in CUES]


def test_empty_cue_lists_write_valid_empty_files() -> None:
    assert to_webvtt([]) == "WEBVTT\n"
    assert len(webvtt.from_string(to_webvtt([]))) == 0
    assert list(srt.parse(to_srt([]))) == []


def test_a_negative_time_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        to_webvtt([Cue(start=-1.0, end=1.0, lines=["x"])])


def test_pyav_opens_the_webvtt_file_as_a_subtitle_stream(tmp_path: Path) -> None:
    path = tmp_path / "subtitles.vtt"
    path.write_text(to_webvtt(CUES), encoding="utf-8")
    got = []
    with av.open(str(path)) as container:
        assert [s.type for s in container.streams] == ["subtitle"]
        stream = container.streams.subtitles[0]
        for packet in container.demux(stream):
            for subtitle in packet.decode():
                start = round(packet.pts * packet.time_base * 1000)
                got.append((start, subtitle.dialogue.decode("utf-8")))
    assert got == [(ms(c.start), c.text) for c in CUES]


def stream_cues() -> list[Cue]:
    """Cues of about 95 s of speech, with pauses, so some cross a 10 s window boundary."""
    sentence = "Chunks let a player fetch subtitles while a long job still runs."
    words, t = [], 0.3
    for k in range(18):
        for w in sentence.split():
            words.append(Word(text=w, start=t, end=t + 0.3))
            t += 0.42
        t += 1.0 if k % 3 else 0.1
    return build_cues(words, CueRules())


def feed(chunker: ChunkedWebVTT, cues: list[Cue], step: float, duration: float) -> list[tuple[str, str]]:
    """As recognition would: at each step, every cue that starts before it is final."""
    out, passed, now = [], 0, 0.0
    while now < duration:
        now = min(now + step, duration)
        fresh = [c for c in cues[passed:] if c.start < now]
        passed += len(fresh)
        out += chunker.add(fresh, final_until=now)
    return out + chunker.close(duration)


def test_chunks_fed_bit_by_bit_concatenate_to_the_whole_file() -> None:
    cues = stream_cues()
    duration = cues[-1].end + 3.0
    segments = feed(ChunkedWebVTT(window_seconds=10.0), cues, step=7.3, duration=duration)

    assert [name for name, _ in segments] == [f"segment_{k:05d}.vtt" for k in range(math.ceil(duration / 10))]
    for k, (_, text) in enumerate(segments):
        assert text.startswith(f"WEBVTT\n{X_TIMESTAMP_MAP}\n")
        for caption in webvtt.from_string(text).captions:  # each cue overlaps its window
            assert caption.start_time.in_milliseconds() < (k + 1) * 10_000
            assert caption.end_time.in_milliseconds() > k * 10_000
    assert concat_segment_cues([t for _, t in segments]) == concat_segment_cues([to_webvtt(cues)])
    assert len(concat_segment_cues([t for _, t in segments])) == len(cues)


def test_a_cue_across_a_window_boundary_is_in_both_windows_and_once_after_concatenation() -> None:
    chunker = ChunkedWebVTT(window_seconds=10.0)
    crossing = Cue(start=9.5, end=10.5, lines=["Across the boundary."])
    segments = chunker.add([Cue(start=1.0, end=2.0, lines=["Before."]), crossing], final_until=12.0)
    segments += chunker.add([Cue(start=12.0, end=13.0, lines=["After."])], final_until=15.0)
    segments += chunker.close(duration=15.0)
    assert len(segments) == 2
    assert all("Across the boundary." in text for _, text in segments)
    assert [c[2] for c in concat_segment_cues([t for _, t in segments])] == [
        "Before.",
        "Across the boundary.",
        "After.",
    ]


def test_a_cue_over_three_windows_is_written_three_times_and_read_once() -> None:
    chunker = ChunkedWebVTT(window_seconds=2.0)
    segments = chunker.add([Cue(start=1.0, end=5.5, lines=["long"])], final_until=6.0)
    assert [("long" in t) for _, t in segments] == [True, True, True]
    assert concat_segment_cues([t for _, t in segments]) == [(1.0, 5.5, "long")]


def test_an_empty_media_gives_valid_empty_files() -> None:
    chunker = ChunkedWebVTT()
    segments = chunker.close(duration=0.0)
    assert segments == [("segment_00000.vtt", f"WEBVTT\n{X_TIMESTAMP_MAP}\n")]
    parsed = webvtt.from_string(segments[0][1])
    assert len(parsed) == 0 and parsed.metadata == [X_TIMESTAMP_MAP]
    assert chunker.playlist(ended=True).count("#EXTINF:") == 1


def test_the_playlist_lists_every_segment_and_ends_only_when_ended() -> None:
    chunker = ChunkedWebVTT(window_seconds=4.0)
    assert chunker.add([Cue(start=1.0, end=2.0, lines=["a"])], final_until=9.0) != []
    running = chunker.playlist(ended=False)
    assert running.splitlines()[:5] == [
        "#EXTM3U",
        "#EXT-X-TARGETDURATION:4",
        "#EXT-X-VERSION:3",
        "#EXT-X-MEDIA-SEQUENCE:0",
        "#EXT-X-PLAYLIST-TYPE:EVENT",
    ]
    assert running.splitlines()[5:] == ["#EXTINF:4.000,", "segment_00000.vtt", "#EXTINF:4.000,", "segment_00001.vtt"]
    assert "#EXT-X-ENDLIST" not in running

    chunker.close(duration=10.5)
    ended = chunker.playlist(ended=True)
    # RFC 8216 6.2.1: a published EVENT playlist only gets lines appended, #EXT-X-ENDLIST last.
    assert ended.startswith(running) and ended.endswith("#EXT-X-ENDLIST\n")
    assert ended.count("#EXTINF:") == 3 and "#EXTINF:2.500,\nsegment_00002.vtt" in ended


def test_memory_holds_only_cues_that_reach_a_future_window() -> None:
    chunker = ChunkedWebVTT(window_seconds=10.0)
    most = 0
    for k in range(2000):  # 10000 s of cues, one every 5 s
        chunker.add([Cue(start=5.0 * k, end=5.0 * k + 4.0, lines=[f"cue {k}"])], final_until=5.0 * k + 4.5)
        most = max(most, chunker.held_cues)
    assert most <= 3
    chunker.close(duration=10_000.0)
    assert chunker.segment_count == 1000 and chunker.held_cues == 0


def test_contract_breaches_are_refused() -> None:
    chunker = ChunkedWebVTT(window_seconds=10.0)
    chunker.add([Cue(start=5.0, end=6.0, lines=["a"])], final_until=20.0)
    with pytest.raises(ValueError, match="after one"):
        chunker.add([Cue(start=4.0, end=4.5, lines=["b"])], final_until=20.0)
    with pytest.raises(ValueError, match="already written"):
        chunker.add([Cue(start=15.0, end=16.0, lines=["c"])], final_until=20.0)
    chunker.close(duration=20.0)
    with pytest.raises(ValueError, match="closed"):
        chunker.add([], final_until=30.0)
    with pytest.raises(ValueError):
        ChunkedWebVTT(window_seconds=0)


@st.composite
def cue_lists(draw) -> list[Cue]:
    cues, t = [], draw(st.floats(0.0, 3.0))
    for k in range(draw(st.integers(0, 25))):
        start = t + draw(st.floats(0.0, 6.0))
        end = start + draw(st.floats(0.01, 12.0))
        cues.append(Cue(start=round(start, 3), end=round(end, 3), lines=[f"cue {k}"]))
        t = end
    return cues


@settings(max_examples=60, deadline=None, database=None)
@given(cues=cue_lists(), window=st.sampled_from([1.0, 2.5, 6.0, 10.0]), step=st.floats(0.3, 30.0))
def test_any_feeding_schedule_concatenates_to_the_whole_file(cues: list[Cue], window: float, step: float) -> None:
    duration = (cues[-1].end if cues else 0.0) + 1.0
    segments = feed(ChunkedWebVTT(window_seconds=window), cues, step=step, duration=duration)
    assert len(segments) == max(1, math.ceil(duration / window - 1e-9))
    assert concat_segment_cues([t for _, t in segments]) == concat_segment_cues([to_webvtt(cues)])
