"""Regression guard on what a subtitle job hears: WER and words in silence on fixed tracks.

Real parts: a worker with the default cpu pool, faster-whisper tiny.en on the ``whisper-tiny`` rung
(int8, one thread, beam 3, its encoder fitted to each window). The tracks are generated with a fixed
seed (tests/support/subtitle_tracks.py and tests/support/speech.py), their words and speech spans
known. Bounds are the figures measured when they were set plus a margin (stated beside each); a
change to windowing, joins or decoding that loses or invents words crosses them. Not a timing test: speed is bench/peers_subtitle.py's.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from mediafarm import submit
from mediafarm.config.settings import get_settings

pytestmark = [
    pytest.mark.integration,
]

# The clean track: 0.070 when first measured (5 errors in 71 words on an AVX2 machine, "the birch
# canoe" heard as "the merch can do"); on an AVX-512 one 0.127 with the encoder given the whole 30 s
# and 0.155 fitted to each window (11 errors, as faster-whisper's own transcribe, with or without word
# times, and BatchedInferencePipeline heard there). tiny.en's few slips on it move with the CPU's int8
# kernels and the encoder's length, so its bound is the bare library's figure on the same machine plus
# 5 points (3 words of 71), short of what one lost sentence (+0.13) would add, and never above 0.20.
CLEAN_OVER_BARE = 0.05
CLEAN_MAX_WER = 0.20
# The several-voices track (tiny.en on fast and accented espeak-ng voices) is hard enough that what
# tiny.en hears in it moves with the CPU's int8 kernels: 0.387 for the job on an AVX2 machine, 0.589
# on an AVX-512 one, where faster-whisper's own transcribe(vad_filter=True, word_timestamps=True)
# heard 0.524 (transcribe without word times 0.452). So its bound is the bare library's figure on
# the same machine, same model and threads, plus 10 points: about one lost sentence (9 words of
# 124), well short of a lost window.
VOICES_OVER_BARE = 0.10
# And never above this, whatever the bare library hears: a regression the library shares (a model or
# CTranslate2 change) still fails here once it costs a couple of sentences more than any CPU measured.
VOICES_MAX_WER = 0.65
SEED = 16


def heard(job_id: str) -> list[tuple[str, float, float]]:
    data = json.loads((get_settings().storage_dir / job_id / "subtitles.json").read_text())
    return [(w["text"], w["start"], w["end"]) for s in data["segments"] for w in s["words"]]


def score(track, words: list[tuple[str, float, float]]) -> tuple[float, int]:
    from tests.support.subtitle_tracks import normalise, wer, words_in_silence

    hypothesis = [n for text, _, _ in words for n in normalise(text)]
    return wer(track.words, hypothesis), words_in_silence([(s, e) for _, s, e in words], track.truth)


@pytest.fixture(scope="module")
def clean_track(media_root: Path):
    """The default espeak-ng voice, eight sentences 0.8-3 s apart."""
    from tests.support.speech import make_track
    from tests.support.subtitle_tracks import SENTENCES, SubtitleTrack

    phrases = SENTENCES[:8]
    track = make_track(media_root / "accuracy-clean.wav", gaps=(1.0, 2.5, 0.8, 3.0, 1.5, 1.2, 2.2, 0.9, 1.5),
                       phrases=phrases)  # fmt: skip
    return SubtitleTrack("clean", track.path, track.truth, list(phrases), track.duration)


@pytest.fixture(scope="module")
def voices_track(media_root: Path):
    """Five espeak-ng voices at 130-220 words a minute, 0.4-2.5 s apart, about 45 s."""
    from tests.support.subtitle_tracks import make

    return make("conversation", media_root / "accuracy-voices.wav", 45, seed=SEED)


# The held-out corpus's hardest track for the job (tests/support/heldout_corpus.py; docs/benchmarks/subtitle.md
# "Held-out subtitles"): espeak-ng's en-029 and en-gb-scotland voices at 230 words a minute, one pitched
# 30 % down, note runs between sentences, light white noise. When first measured (AVX-512) the job got
# 125 of 199 words wrong (0.628) and faster-whisper's transcribe(vad_filter=True) 113. Its bound, as the
# several-voices track's, is the bare library's figure on the same machine plus 10 points, never above
# 0.75. A note run there that the VAD takes for speech (67.33-67.68 s) was heard as "not", a word in
# true silence (issue #35), until the job set tonal spans aside (tonal.py): the guard holds it at none.
HELDOUT_WORST = "heldout-08"
HELDOUT_OVER_BARE = 0.10
HELDOUT_MAX_WER = 0.75
HELDOUT_TONAL_SPAN = (67.33, 67.68)


@pytest.fixture(scope="module")
def heldout_track(media_root: Path):
    """The held-out corpus's worst track, made from its recipe as the benchmark made it."""
    from tests.support import heldout_corpus

    # piper=True: the corpus's recipes as the benchmark drew them (where the Piper wheel is installed); this
    # track has espeak-ng voices only, so it is the same track on a machine without it.
    [recipe] = [r for r in heldout_corpus.recipes(piper=True) if r.name == HELDOUT_WORST]
    assert all(engine == "espeak" for engine, *_ in recipe.speakers), recipe
    return heldout_corpus.make(recipe, media_root / "heldout")


def rung_params():
    """The whisper-tiny rung's parameters as the job runs them (the family's declared rung)."""
    from mediafarm.tasks.families.subtitle.spec import FAMILY, WhisperParams

    [tiny] = [r for r in FAMILY.ladder if r.name == "whisper-tiny"]
    return WhisperParams(**tiny.params)


def bare_wer(tiny_en: Path, track) -> float:
    """What faster-whisper's own transcribe(vad_filter=True, word_timestamps=True) hears in ``track``,
    on the job's model, compute type, threads and beam (the rung's, read from it: a baseline with
    another beam than the job's measures the beam, not the farm), as a user would call it."""
    from faster_whisper import WhisperModel

    from tests.support.subtitle_tracks import normalise, wer

    params = rung_params()
    model = WhisperModel(str(tiny_en), device="cpu", compute_type=params.compute_type, cpu_threads=params.cpu_threads)
    segments, _ = model.transcribe(str(track.path), beam_size=params.beam_size, vad_filter=True, word_timestamps=True,
                                   language="en")  # fmt: skip
    return wer(track.words, normalise(" ".join(s.text for s in segments)))


BOUNDS = {"clean_track": (CLEAN_OVER_BARE, CLEAN_MAX_WER), "voices_track": (VOICES_OVER_BARE, VOICES_MAX_WER),
          "heldout_track": (HELDOUT_OVER_BARE, HELDOUT_MAX_WER)}  # fmt: skip


@pytest.mark.parametrize("name", list(BOUNDS))
def test_the_job_hears_the_words_and_none_in_silence(cpu_worker, tiny_en, request, name) -> None:
    track = request.getfixturevalue(name)
    over, most = BOUNDS[name]
    bound = min(bare_wer(tiny_en, track) + over, most)
    job = submit("subtitle", media=str(track.path), formats=["json"])
    envelope = job.wait(timeout=300)
    assert envelope["variant"] == "whisper-tiny"
    words = heard(job.id)
    measured, silent = score(track, words)
    assert measured <= bound, (measured, " ".join(w for w, _, _ in words))
    assert silent == 0, [w for w in words if score(track, [w])[1]]
    if name == "heldout_track":  # the note run was set aside, not recognised, and the result says so
        aside = [(r["start"], r["end"], r["reason"]) for r in envelope["output"]["rejected"]]
        low, high = HELDOUT_TONAL_SPAN
        assert any(s < high and e > low and why == "tonal" for s, e, why in aside), aside
    # The job's own count, against the spans its VAD kept: none.
    assert envelope["output"]["timing"]["words_in_silence"] == 0
    assert envelope["output"]["words"] == len(words)


def test_windows_in_batches_hear_what_one_window_a_call_hears(tiny_en, voices_track, tmp_path: Path) -> None:
    # The batch_size rung parameter (GPU rungs batch): the 45 s track is three 20 s windows, recognised
    # in one batch; the same words as one window a call (fitted, a batch's windows are given the
    # longest one's length, each alone its own).
    from mediafarm.tasks.families.subtitle import engines
    from mediafarm.tasks.families.subtitle.spec import SubtitleRequest, WhisperParams
    from mediafarm.tasks.runtime.context import EngineContext

    def run(batch_size: int) -> list[tuple[str, float, float]]:
        ctx = EngineContext.local(storage_dir=tmp_path / str(batch_size), models_dir=tiny_en.parent)
        params = WhisperParams(model=tiny_en.name, batch_size=batch_size, fit_context=True)  # as the tiny rung
        steps = engines.whisper(ctx, SubtitleRequest(media=str(voices_track.path), formats=["json"]), params)
        with contextlib.suppress(StopIteration):
            while True:
                next(steps)
        data = json.loads(ctx.artifacts.path("subtitles.json").read_text())
        return [(w["text"], w["start"], w["end"]) for s in data["segments"] for w in s["words"]]

    one, batched = run(1), run(3)
    # Not word for word: int8 kernels decode a padded batch with other roundings than one window
    # (on an AVX-512 CPU one word of 124 came out different; on AVX2 none did). At most 5 % of the
    # words, and no more errors against the truth than that, nor any word in silence.
    from tests.support.subtitle_tracks import wer

    apart = wer([w for w, _, _ in one], [w for w, _, _ in batched])
    (one_wer, one_silent), (batched_wer, batched_silent) = score(voices_track, one), score(voices_track, batched)
    seen = f"apart {apart:.3f}; WER one {one_wer:.3f} batched {batched_wer:.3f}; in silence {one_silent}, {batched_silent}"
    assert apart <= 0.05, seen
    assert batched_wer <= one_wer + 0.05 and batched_silent == one_silent == 0, seen
