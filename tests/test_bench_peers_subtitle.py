"""bench/peers_subtitle.py and its tracks: the reference the WER is taken against and the sums of
the WER table (no timing here: the bench measures)."""

from __future__ import annotations

from pathlib import Path

import pytest
import soundfile as sf

from bench import peers, peers_subtitle
from tests.support import subtitle_tracks


def test_the_family_is_registered() -> None:
    assert peers.FAMILIES["subtitle"] is peers_subtitle.subtitle_bench


@pytest.mark.parametrize("kind", list(subtitle_tracks.KINDS))
def test_a_track_keeps_what_each_span_says(tmp_path: Path, kind: str) -> None:
    track = subtitle_tracks.make(kind, tmp_path / f"{kind}.wav", 12, seed=3)
    info = sf.info(str(track.path))
    assert (info.samplerate, info.channels) == (16000, 1)
    assert track.duration == pytest.approx(info.duration) and track.duration >= 12
    assert len(track.text) == len(track.truth) >= 1
    assert all(0 <= s < e <= track.duration for s, e in track.truth)
    assert all(a[1] <= b[0] for a, b in zip(track.truth, track.truth[1:]))  # in order, apart
    assert track.words == subtitle_tracks.normalise(" ".join(track.text))
    with pytest.raises(ValueError, match="unknown track kind"):
        subtitle_tracks.make("music", tmp_path / "x.wav", 1)


def test_word_errors_and_words_in_silence() -> None:
    ref = subtitle_tracks.normalise("The quick brown fox, jumps!")
    assert ref == ["the", "quick", "brown", "fox", "jumps"]
    assert subtitle_tracks.word_errors(ref, ref) == 0
    assert subtitle_tracks.word_errors(ref, ["the", "brown", "fox", "jumps", "high"]) == 2  # a deletion, an insertion
    assert subtitle_tracks.wer(ref, ["a", "quick", "brown", "fox", "jumps"]) == pytest.approx(0.2)
    truth = [(1.0, 2.0), (5.0, 6.0)]
    # Midpoints 1.5 (inside), 2.4 (0.4 s out: tolerated), 3.5 (1.5 s from either span: in silence).
    assert subtitle_tracks.words_in_silence([(1.4, 1.6), (2.3, 2.5), (3.4, 3.6)], truth) == 1


def test_the_wer_table_sums_errors_over_inputs_and_counts_the_farm_once() -> None:
    def cell(inp: str, peer: str, farm_errors: int, peer_errors: int, silent: int) -> dict:
        agreement = {"ref_words": 10, "farm_errors": farm_errors, "peer_errors": peer_errors,
                     "farm_words_in_silence": 0, "peer_words_in_silence": silent}  # fmt: skip
        return {"input": inp, "peer": peer, "agreement": agreement}

    result = {
        "farm": "job",
        "cells": [cell("a", "p", 1, 2, 0), cell("a", "q", 1, 5, 3), cell("b", "p", 3, 2, 1), cell("b", "q", 3, 4, 0)],
        "overall": {"p": {"median_ratio": 1.5}, "q": {"median_ratio": 0.5}},
    }
    rows = {r["contender"]: r for r in peers_subtitle.wer_table(result)}
    assert (rows["job"]["errors"], rows["job"]["ref_words"], rows["job"]["wer"]) == (4, 20, 0.2)
    assert (rows["p"]["errors"], rows["p"]["words_in_silence"], rows["p"]["median_time_ratio"]) == (4, 1, 1.5)
    assert (rows["q"]["wer"], rows["q"]["words_in_silence"]) == (0.45, 3)
