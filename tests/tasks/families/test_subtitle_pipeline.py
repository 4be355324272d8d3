"""The subtitle pipeline's own pieces, as plain functions: windows of speech, the clock mapping,
the streaming cut, incremental cues, the timestamp checks, and the whole pipeline driven by a
stand-in recogniser (the chunked playlist as a player sees it mid-job). No real recogniser, no broker."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from mediafarm.tasks.families.subtitle.checks import SilentWords, timing_report
from mediafarm.tasks.families.subtitle.cue_stream import CueStream
from mediafarm.tasks.families.subtitle.cues import build_cues
from mediafarm.tasks.families.subtitle.engines import CHUNKS, PLAYLIST, transcribe
from mediafarm.tasks.families.subtitle.recognisers import Recognition
from mediafarm.tasks.families.subtitle.records import Cue, CueRules, Segment, Word
from mediafarm.tasks.families.subtitle.spec import SubtitleRequest
from mediafarm.tasks.families.subtitle.windows import (
    JOIN_SECONDS,
    PAD_SECONDS,
    WINDOW_SECONDS,
    cut_windows,
    plan_windows,
)
from mediafarm.tasks.media.decode import KeptAudio
from mediafarm.tasks.media.intervals import Span
from mediafarm.tasks.runtime.context import EngineContext

RATE = 16000


def test_windows_pad_merge_and_pack_speech_up_to_the_window_length() -> None:
    spans = [Span(1.0, 2.0), Span(2.2, 3.0), Span(10.0, 12.0), Span(40.0, 100.0)]
    windows = plan_windows(spans, duration=120.0)
    pieces = [(p.start, p.end) for w in windows for p in w.pieces]
    # The first two touch once padded: one piece. The minute-long span is cut at window length.
    assert pieces[0] == pytest.approx((1.0 - PAD_SECONDS, 3.0 + PAD_SECONDS))
    assert pieces[1] == pytest.approx((10.0 - PAD_SECONDS, 12.0 + PAD_SECONDS))
    assert all(w.length <= WINDOW_SECONDS + 1e-9 for w in windows)
    covered = sum(e - s for s, e in pieces)
    assert covered == pytest.approx((3.15 - 0.85) + (12.15 - 9.85) + (100.15 - 39.85))
    # Pieces within a window are laid out one after another with the join between them.
    first = windows[0]
    assert first.pieces[1].at == pytest.approx(first.pieces[0].end - first.pieces[0].start + JOIN_SECONDS)


def test_times_in_a_window_map_back_to_the_media_clock() -> None:
    [window] = plan_windows([Span(5.0, 6.0), Span(20.0, 21.0)], duration=30.0)
    a, b = window.pieces
    assert window.media_time(0.0) == pytest.approx(a.start)
    assert window.media_time(0.5) == pytest.approx(a.start + 0.5)
    assert window.media_time(b.at + 0.25) == pytest.approx(b.start + 0.25)
    # A time inside the join goes to the nearer edge.
    join_start = a.at + (a.end - a.start)
    assert window.media_time(join_start + 0.01) == pytest.approx(a.end)
    assert window.media_time(b.at - 0.01) == pytest.approx(b.start)
    segment = Segment(start=0.1, end=b.at + 0.3, text="hi there", words=[
        Word(text="hi", start=0.1, end=0.4), Word(text="there", start=b.at + 0.1, end=b.at + 0.3)])  # fmt: skip
    mapped = window.to_media(segment)
    assert [(w.start, w.end) for w in mapped.words] == [
        (round(a.start + 0.1, 3), round(a.start + 0.4, 3)), (round(b.start + 0.1, 3), round(b.start + 0.3, 3))]  # fmt: skip


def test_a_word_at_the_end_of_a_piece_does_not_stretch_across_the_cut_silence() -> None:
    [window] = plan_windows([Span(10.0, 12.0), Span(40.0, 42.0)], duration=60.0)
    a, b = window.pieces
    # Its start is in the first piece, its end in the join: the recogniser's word ran into the gap.
    last = a.at + (a.end - a.start) - 0.2
    mapped = window.to_media(Segment(start=last, end=last + 0.6, text="now.", words=[
        Word(text="now.", start=last, end=last + 0.6)]))  # fmt: skip
    [word] = mapped.words
    assert word.start == pytest.approx(a.end - 0.2, abs=1e-3) and word.end == pytest.approx(a.end, abs=1e-3)


def test_cut_windows_gives_exactly_the_speech_samples_in_one_pass(tmp_path: Path) -> None:
    # A ramp, so every sample says where it came from; 25 s spans block boundaries (10 s blocks).
    samples = (np.arange(RATE * 25) % 30000).astype(np.int16)
    path = tmp_path / "ramp.wav"
    sf.write(path, samples, RATE, subtype="PCM_16")
    windows = plan_windows([Span(1.0, 2.0), Span(9.5, 10.5), Span(19.0, 24.9)], duration=25.0)
    got = list(cut_windows(KeptAudio(path, keep_seconds=0.0), windows))
    assert [w for w, _ in got] == windows
    for window, audio in got:
        position = 0
        for i, piece in enumerate(window.pieces):
            if i:
                assert not audio[position : position + round(JOIN_SECONDS * RATE)].any()
                position += round(JOIN_SECONDS * RATE)
            first, last = round(piece.start * RATE), round(piece.end * RATE)
            expected = samples[first:last].astype(np.float32) / 32768.0
            assert np.array_equal(audio[position : position + expected.size], expected)
            position += expected.size
        assert position == audio.size


def words_at(texts: str, start: float = 0.0, step: float = 0.4) -> list[Word]:
    return [Word(text=t, start=start + i * step, end=start + i * step + 0.3) for i, t in enumerate(texts.split())]


def test_incremental_cues_are_the_cues_of_the_whole() -> None:
    request = SubtitleRequest(media="x.wav")
    batches = [
        words_at("The quick brown fox jumps over the lazy dog.", 0.0),
        words_at("Please leave the package at the front door, and ring twice.", 5.0),
        words_at("Someone is walking across the garden now.", 12.0),
        words_at("Turn off the lights before you go to sleep tonight.", 18.0),
    ]
    stream = CueStream(request)
    emitted: list[Cue] = []
    for batch in batches:
        stream.add(batch)
        emitted += stream.take_final()
        assert all(c.end <= stream.final_until(batch[-1].end) + 1e-9 for c in emitted)
    emitted += stream.take_rest()
    assert emitted == stream.all
    assert stream.all == build_cues([w for b in batches for w in b], request.rules)


def test_timing_report_names_what_is_wrong() -> None:
    rules = CueRules()
    speech = [Span(1.0, 3.0), Span(10.0, 12.0)]
    good = [Cue(start=1.05, end=2.9, lines=["hello there"]), Cue(start=10.2, end=11.5, lines=["again"])]
    report = timing_report(good, speech, duration=15.0, rules=rules)
    assert (report.cues, report.monotonic, report.overlaps, report.in_silence, report.outside_media) == (
        2,
        True,
        0,
        0,
        0,
    )
    assert report.offset_ms_median == pytest.approx(125.0) and report.offset_ms_max == pytest.approx(200.0)
    assert [late.index for late in report.late] == [1]  # 200 ms from its onset: perceptible
    bad = [Cue(start=5.0, end=6.0, lines=["in silence"]), Cue(start=4.0, end=16.0, lines=["too long, too late"])]
    report = timing_report(bad, speech, duration=15.0, rules=rules)
    assert not report.monotonic and report.in_silence == 1 and report.outside_media == 1
    assert report.rule_violations  # 12 s is past max_cue_seconds
    assert timing_report([], speech, duration=15.0, rules=rules).cues == 0


def test_words_in_silence_are_counted_even_inside_a_cue_that_touches_speech() -> None:
    speech = [Span(1.0, 3.0), Span(10.0, 12.0)]
    counter = SilentWords(speech, pad=PAD_SECONDS)
    inside = Word(text="hello", start=1.05, end=1.4)
    on_the_pad = Word(text="there", start=3.1, end=3.3)  # touches 3.0 + PAD_SECONDS
    stray = Word(text="uh", start=3.5, end=3.8)  # past the pad, 6 s before the next span
    before_the_pad = Word(text="so", start=9.7, end=9.85)  # ends on 10.0 - PAD_SECONDS
    counter.add([inside, on_the_pad, stray, before_the_pad])
    assert counter.count == 1
    counter.add([Word(text="um", start=5.0, end=5.5), Word(text="end", start=12.2, end=12.4)])
    assert counter.count == 3
    # One cue holding speech and the stray word: the per-cue check passes, the per-word one does not.
    cue = Cue(start=1.05, end=3.8, lines=["hello there uh"])
    report = timing_report([cue], speech, duration=15.0, rules=CueRules(), words_in_silence=counter.count)
    assert report.in_silence == 0 and report.words_in_silence == 3
    assert report.model_dump(mode="json")["words_in_silence"] == 3
    # Not counted is not zero; a report from before the check still parses.
    assert timing_report([cue], speech, duration=15.0, rules=CueRules()).words_in_silence is None
    assert type(report).model_validate({"cues": 1}).words_in_silence is None
    # Every word counts when the VAD found no speech at all.
    nothing = SilentWords([], pad=PAD_SECONDS)
    nothing.add([inside, stray])
    assert nothing.count == 2


def test_words_in_silence_allow_for_times_rounded_to_milliseconds() -> None:
    # The engine rounds word times to ms: a word clamped to its piece's end (6.1506 s) reads 6.151.
    piece_end = 6.0006 + PAD_SECONDS
    counter = SilentWords([Span(5.0, 6.0006)], pad=PAD_SECONDS)
    counter.add([Word(text="edge", start=round(piece_end, 3), end=round(piece_end, 3))])
    assert counter.count == 0
    counter.add([Word(text="past", start=round(piece_end + 0.002, 3), end=round(piece_end + 0.2, 3))])
    assert counter.count == 1


# --- the whole pipeline with a stand-in recogniser --------------------------------------------------------

FRAME_SECONDS = 0.4


def loud_frames_as_words(audio: np.ndarray) -> Recognition:
    """A stand-in recogniser: one word for each loud 0.4 s frame of a window's audio, so words
    fall where the speech is, as a real recogniser's would, in milliseconds instead of seconds."""
    frame = round(FRAME_SECONDS * RATE)
    segments = []
    for i in range(audio.size // frame):
        if np.sqrt(np.mean(np.square(audio[i * frame : (i + 1) * frame]))) > 0.01:
            word = Word(text="la", start=i * FRAME_SECONDS, end=i * FRAME_SECONDS + 0.3)
            segments.append(Segment(start=word.start, end=word.end, text=word.text, words=[word]))
    return Recognition(segments=segments, language="en", language_probability=None, model="loud frames")


def run_engine(engine: Generator[Any, None, Any], after_each_yield: Callable[[Any], None]) -> Any:
    """Drive a generator engine as the worker does; return what it returns."""
    while True:
        try:
            item = next(engine)
        except StopIteration as stop:
            return stop.value
        after_each_yield(item)


def playlist_segments(text: str) -> list[str]:
    """The segment names an HLS media playlist lists, after checking the lines a player relies on."""
    lines = text.splitlines()
    assert lines[0] == "#EXTM3U" and "#EXT-X-PLAYLIST-TYPE:EVENT" in lines, text
    target = int(next(line for line in lines if line.startswith("#EXT-X-TARGETDURATION:")).split(":")[1])
    names = []
    for tag, uri in zip(lines, lines[1:], strict=False):
        if tag.startswith("#EXTINF:"):
            assert 0 < float(tag[len("#EXTINF:") :].rstrip(",")) <= target, tag
            assert re.fullmatch(r"segment_\d{5}\.vtt", uri), uri
            names.append(uri)
    assert names == [line for line in lines if not line.startswith("#")], text
    return names


def test_the_playlist_grows_while_a_long_job_runs(speech_track, tmp_path: Path) -> None:
    from tests.support.speech import write_long_track

    path = tmp_path / "ninety-seconds.wav"
    duration = write_long_track(path, 90, pattern=speech_track)
    ctx = EngineContext.local(storage_dir=tmp_path / "storage")
    chunks = ctx.artifacts.path(CHUNKS)
    windows_heard: list[int] = []

    def recognise(audio: np.ndarray) -> Recognition:
        windows_heard.append(audio.size)
        return loud_frames_as_words(audio)

    # What a player polling the playlist sees after each partial output: (windows recognised, playlist).
    seen: list[tuple[int, str]] = []

    def look(item: dict[str, str]) -> None:
        text = ctx.artifacts.path(PLAYLIST).read_text()
        for name in playlist_segments(text):  # each segment listed is there already
            assert (chunks / name).is_file(), (name, text)
        seen.append((len(windows_heard), text))

    request = SubtitleRequest(media=str(path), chunk_seconds=5)
    result = run_engine(transcribe(ctx, request, recognise), look)

    assert len(windows_heard) >= 2 and result.words > 0  # a track of several windows, heard
    running = [(heard, text) for heard, text in seen if "#EXT-X-ENDLIST" not in text]
    # A playlist was there, listing segments, before the last window was recognised.
    assert running and running[0][0] < len(windows_heard) and playlist_segments(running[0][1])
    # Each playlist only appends to the one before (RFC 8216, EVENT); the last one ends the list.
    texts = [text for _, text in seen]
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:], strict=False))
    final = ctx.artifacts.path(PLAYLIST).read_text()  # written at the end, with or without a new segment
    assert final.startswith(texts[-1]) and final.endswith("#EXT-X-ENDLIST\n")
    listed = playlist_segments(final)
    assert listed == sorted(p.name for p in chunks.glob("segment_*.vtt"))
    assert len(listed) == math.ceil(duration / request.chunk_seconds)
    assert result.timing.words_in_silence == 0
