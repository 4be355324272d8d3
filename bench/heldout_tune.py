"""Subtitle engine settings tried on the tuning half of the held-out corpus (issue #35): a setting
is chosen here and only then measured on the held-out half (bench/peers_heldout.py).

Run from the repository root::

    .venv/bin/python -m bench.heldout_tune
    .venv/bin/python -m bench.heldout_tune --settings rung,beam1 --rounds 1
    .venv/bin/python -m bench.heldout_tune --half heldout --settings rung,beam5   # report, after choosing

Each setting is the ``whisper-tiny`` rung's params with some changed (beam, the longest window,
the fitted encoder, batching), run through the farm's engine in this process
(``EngineContext.local``) on every tuning track; faster-whisper's ``transcribe(vad_filter=True)``
and ``BatchedInferencePipeline`` (beam 1) run beside them on the same tracks. All on one CPU
thread. Reported per contender: WER, words in true silence, CPU seconds (this process: the one
thread doing the work, far steadier on a shared machine than wall time) and wall seconds, summed
over the tracks (the median of ``--rounds`` per track), and CPU against the batched pipeline's.

Picked from the table, by rule: ``quality`` is the lowest WER with no word in silence; ``fast``
the least CPU among settings with no word in silence whose WER is no higher than the better bare
pipeline's (or, where none is, the least CPU with no word in silence).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.farm import REPO
from bench.peers import ONE_THREAD

RESULTS = REPO / "bench" / "results" / "heldout_tune.json"
# name -> (changes to the rung's params, the longest fitted window in seconds)
SETTINGS: dict[str, tuple[dict[str, Any], float]] = {
    "rung": ({}, 20.0),
    "beam1": ({"beam_size": 1}, 20.0),
    "beam2": ({"beam_size": 2}, 20.0),
    "beam5": ({"beam_size": 5}, 20.0),
    "window16": ({}, 16.0),
    "window28": ({}, 28.0),
    "whole30": ({"fit_context": False}, 20.0),  # the window is then engines.WINDOW_SECONDS, 28 s
    "batch4": ({"batch_size": 4}, 20.0),
    "beam1-window28": ({"beam_size": 1}, 28.0),
    "beam1-batch8": ({"beam_size": 1, "batch_size": 8}, 20.0),
    "beam1-batch16": ({"beam_size": 1, "batch_size": 16}, 20.0),
    "beam1-batch16-window28": ({"beam_size": 1, "batch_size": 16}, 28.0),
    # The same decode in smaller batches: the encoder's attention over 16 whole windows at once
    # took a child's peak RSS from 0.38 GB to 1.4 GB (bench/subtitle.py --parts memory).
    "beam1-batch8-window28": ({"beam_size": 1, "batch_size": 8}, 28.0),
    "beam1-batch4-window28": ({"beam_size": 1, "batch_size": 4}, 28.0),
    "batch8": ({"batch_size": 8}, 20.0),
}


def cpu_seconds() -> float:
    return time.process_time()


def run_setting(name: str, models: Path) -> Callable[[str], list[tuple[str, float, float]]]:
    from bench.peers_subtitle import engine_words
    from mediafarm.tasks.families.subtitle import engines
    from mediafarm.tasks.families.subtitle.spec import FAMILY, WhisperParams

    rung = next(r for r in FAMILY.ladder if r.name == "whisper-tiny")
    changes, window = SETTINGS[name]
    params = WhisperParams(**{**rung.params, **changes})

    def run(path: str) -> list[tuple[str, float, float]]:
        kept = engines.FITTED_WINDOW_SECONDS
        engines.FITTED_WINDOW_SECONDS = window  # read by engines.whisper at each call
        try:
            return engine_words(models, path, params)
        finally:
            engines.FITTED_WINDOW_SECONDS = kept

    return run


def choose(rows: dict[str, dict[str, Any]], peers: list[str], bar_peers: list[str] | None = None) -> dict[str, Any]:
    """The module docstring's rule: ``quality`` and ``fast`` among the settings (not the peers);
    the WER bar is the best of ``bar_peers`` (default: every peer)."""
    mine = {n: r for n, r in rows.items() if n not in peers and r["words_in_silence"] == 0}
    if not mine:
        return {"quality": None, "fast": None}
    quality = min(mine, key=lambda n: (mine[n]["wer"], mine[n]["cpu_s"]))
    bar = min(rows[p]["wer"] for p in (bar_peers or peers))
    good = [n for n in mine if mine[n]["wer"] <= bar] or list(mine)
    return {"quality": quality, "fast": min(good, key=lambda n: mine[n]["cpu_s"]), "bare_wer": bar}


def main() -> None:
    os.environ.update(ONE_THREAD)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated: {', '.join(SETTINGS)}")
    ap.add_argument("--rounds", type=int, default=1, help="runs per track and contender (the median is kept)")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mediafarm-peers",
                    help="the corpus (made once, reused) and the models folder")  # fmt: skip
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--word-peers", action="store_true",
                    help="also both pipelines with word_timestamps=True (reported; the rule's bar stays the "
                         "two without)")  # fmt: skip
    ap.add_argument("--half", choices=("tuning", "heldout"), default="tuning",
                    help="heldout: the settings already chosen, measured where they are reported")  # fmt: skip
    args = ap.parse_args()
    names = args.settings.split(",")
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        ap.error(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")

    from bench.peers_subtitle import (
        BARE,
        BARE_WORDS,
        PIPELINE,
        PIPELINE_WORDS,
        bare_pipelines,
        linked_models,
        tiny_model,
    )
    from tests.support.heldout_corpus import corpus
    from tests.support.subtitle_tracks import word_errors, words_in_silence

    made = corpus(args.workdir / "heldout-corpus", halves=(args.half,))
    tracks = getattr(made, args.half)
    models = linked_models(args.workdir)
    bare = bare_pipelines(tiny_model())
    contenders = {BARE: bare[BARE], PIPELINE: bare[PIPELINE], **{n: run_setting(n, models) for n in names}}
    if args.word_peers:  # the pipelines timing every word too, as the job does: the like-for-like cost
        contenders = {BARE_WORDS: bare[BARE_WORDS], PIPELINE_WORDS: bare[PIPELINE_WORDS], **contenders}
    for run in contenders.values():  # model loads and first calls, not counted
        run(str(tracks[0].path))
    per_track: dict[str, dict[str, Any]] = {n: {} for n in contenders}
    for track in tracks:
        for name, run in contenders.items():
            cpu, wall, out = [], [], None
            for _ in range(args.rounds):
                c0, t0 = cpu_seconds(), time.perf_counter()
                out = run(str(track.path))
                wall.append(time.perf_counter() - t0)
                cpu.append(cpu_seconds() - c0)
            hyp = [w for w, _, _ in out]
            cell = {"errors": word_errors(track.words, hyp), "ref_words": len(track.words),
                    "words_in_silence": words_in_silence([(s, e) for _, s, e in out], track.truth),
                    "cpu_s": statistics.median(cpu), "wall_s": statistics.median(wall)}  # fmt: skip
            per_track[name][track.name] = cell
            print(f"{track.name} ({track.duration:.0f} s) {name:<42} errors {cell['errors']:>3}/{cell['ref_words']:<4} "
                  f"silence {cell['words_in_silence']:>2}  CPU {cell['cpu_s']:.2f} s  wall {cell['wall_s']:.2f} s",
                  flush=True)  # fmt: skip
    rows = {}
    for name, cells in per_track.items():
        total = {k: sum(c[k] for c in cells.values()) for k in ("errors", "ref_words", "words_in_silence", "cpu_s", "wall_s")}
        rows[name] = {**total, "wer": round(total["errors"] / max(1, total["ref_words"]), 4)}
    for row in rows.values():
        row["cpu_vs_pipeline"] = round(row["cpu_s"] / rows[PIPELINE]["cpu_s"], 3)
    peers = [p for p in (BARE, PIPELINE, BARE_WORDS, PIPELINE_WORDS) if p in rows]
    picked = choose(rows, peers, bar_peers=[BARE, PIPELINE])
    print(f"\n{'contender':<42} {'WER':>6} {'errors':>7} {'words':>6} {'in silence':>10} {'CPU s':>7} "
          f"{'CPU / pipeline':>14} {'wall s':>7}")  # fmt: skip
    for name, r in rows.items():
        print(f"{name:<42} {r['wer']:>6.3f} {r['errors']:>7} {r['ref_words']:>6} {r['words_in_silence']:>10} "
              f"{r['cpu_s']:>7.1f} {r['cpu_vs_pipeline']:>14.2f} {r['wall_s']:>7.1f}")  # fmt: skip
    print(f"\npicked by the rule on the {args.half} half: {picked}")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({
        "command": " ".join([".venv/bin/python", "-m", "bench.heldout_tune", *sys.argv[1:]]),
        "settings": {n: {"params": SETTINGS[n][0], "fitted_window_s": SETTINGS[n][1]} for n in names},
        "half": args.half, "voices": made.voices, "tracks": [t.name for t in tracks], "rows": rows, "per_track": per_track,
        "picked": picked, "load_average": os.getloadavg(),
    }, indent=1))  # fmt: skip
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
