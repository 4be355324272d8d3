"""The held-out subtitle rows of the peer benchmark (bench/peers.py, issue #35): the subtitle job
against faster-whisper's own pipelines on speech no setting was chosen on.

Run from the repository root::

    .venv/bin/python -m bench.peers --family subtitle-heldout --pairs 3
    .venv/bin/python -m bench.peers_subtitle --family subtitle-heldout   # the WER table

Inputs: the held-out half of ``tests.support.heldout_corpus`` (12 of its 24 tracks, 1-3 min each:
composed sentences of 1-30 words in espeak-ng and Piper voices at several rates and pitches, gaps
of 0.2-20 s, tones, long silences, noise at several levels), made once under ``--workdir`` and
reused. The tuning half is never read here: settings are chosen on it by bench/heldout_tune.py.

Contenders as in bench/peers_subtitle.py: the ``subtitle`` job through a real worker (the
``whisper-tiny`` rung) against ``WhisperModel.transcribe(vad_filter=True)`` and
``BatchedInferencePipeline.transcribe``, tiny.en int8 on one CPU thread on every side, beam 1 for
the bare pipelines (their fastest), English; WER and words in true silence beside the times.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from bench.peers_subtitle import BARE, PIPELINE, tracks_bench

if TYPE_CHECKING:
    from bench.peers import FamilyBench

NAME = "subtitle-heldout"


def heldout_bench(args: argparse.Namespace, workdir: Path) -> FamilyBench:
    """The :class:`bench.peers.FamilyBench` of the held-out half (``args`` unused: the corpus is fixed)."""
    from tests.support.heldout_corpus import corpus

    made = corpus(workdir / "heldout-corpus", halves=("heldout",))
    tracks = {str(t.path): t for t in made.heldout}
    return tracks_bench(NAME, tracks, workdir, peers=(BARE, PIPELINE),
                        meta={"half": "heldout", "voices": made.voices, "tracks": len(tracks)})  # fmt: skip
