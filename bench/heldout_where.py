"""Where the subtitle job loses to the best bare pipeline on the held-out half (issue #35 item 3).

Run from the repository root::

    .venv/bin/python -m bench.heldout_where
    .venv/bin/python -m bench.heldout_where --half tuning     # the same on the tuning half

On every track of the half, in this process, one CPU thread: the farm's engine on the
``whisper-tiny`` rung's params (``EngineContext.local``, as the job runs it in its pool child),
``transcribe(vad_filter=True)`` and ``BatchedInferencePipeline`` (beam 1). The bare pipeline with
the lower WER over the half is "the best", and the engine is compared with it:

- **Words, per window**: each reference sentence is placed in the engine's recognition window its
  middle lies in (``engines.plan_windows``, captured; none: the VAD missed it). Each side's words
  are aligned to the whole reference (edit distance with its path), so every error belongs to one
  sentence whatever its time. Listed: windows where the engine made more errors than the best bare
  pipeline, with what each side heard there.
- **Time, per stage** (CPU seconds of this process): VAD (the farm's streaming silero / faster-
  whisper's own), mel features, encoder, decoder (CTranslate2's ``generate``), word alignment
  (``find_alignment``), onset refinement and cue building (the farm's), and the rest (decoding
  the media, faster-whisper's Python around the model, the farm's windows, second looks'
  bookkeeping, writing files).

Results go to ``bench/results/heldout_where.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.farm import REPO
from bench.peers import ONE_THREAD

RESULTS = REPO / "bench" / "results" / "heldout_where.json"
Words = list[tuple[str, float, float]]


class Stages:
    """CPU seconds per stage, from wrappers put around the functions that do each (outermost
    wrapper counts: a stage inside another is not counted twice)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._depth = 0

    def wrap(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            c0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[stage] += time.process_time() - c0
                self.calls[stage] += 1
                self._depth -= 1

        return timed

    def take(self) -> tuple[dict[str, float], dict[str, int]]:
        out = dict(self.seconds), dict(self.calls)
        self.seconds.clear()
        self.calls.clear()
        return out


class _TimedGenerate:
    """CTranslate2's Whisper model with its ``generate`` (the decoder) timed; the rest passed on."""

    def __init__(self, inner: Any, stages: Stages) -> None:
        self._inner = inner
        self.generate = stages.wrap("decoder", inner.generate)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextlib.contextmanager
def instrumented(stages: Stages, windows: list[Any]) -> Iterator[None]:
    """The stage wrappers in place (and every window plan the engine makes appended to ``windows``)."""
    import faster_whisper.transcribe as fwt
    from faster_whisper.feature_extractor import FeatureExtractor
    from faster_whisper.transcribe import WhisperModel

    from mediafarm.tasks.families.subtitle import engines, onsets

    def plan(*args: Any, **kwargs: Any) -> Any:
        planned = kept["plan_windows"](*args, **kwargs)
        windows.append(planned)
        return planned

    targets = [
        (WhisperModel, "encode", "encoder"), (WhisperModel, "find_alignment", "alignment"),
        (FeatureExtractor, "__call__", "features"), (fwt, "get_speech_timestamps", "vad"),
        (engines, "speech_spans", "vad"), (onsets, "refine_heard", "onsets"),
        (engines.CueStream, "add", "cues"), (engines.CueStream, "take_final", "cues"),
        (engines.CueStream, "take_rest", "cues"), (engines, "timing_report", "cues"),
    ]  # fmt: skip
    kept: dict[str, Any] = {"plan_windows": engines.plan_windows}
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
    try:
        for owner, name, stage in targets:
            setattr(owner, name, stages.wrap(stage, getattr(owner, name)))
        engines.plan_windows = plan
        yield
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
        engines.plan_windows = kept["plan_windows"]


def aligned_errors(reference: list[str], hypothesis: list[str]) -> tuple[list[int], list[list[str]]]:
    """Per reference word: errors charged to it (a substitution or deletion of it, insertions
    after it; insertions before the first word go to the first), and the hypothesis words aligned
    to it. The total is the word edit distance."""
    n, m = len(reference), len(hypothesis)
    cost = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        cost[i][0] = i
    for j in range(m + 1):
        cost[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            cost[i][j] = min(cost[i - 1][j] + 1, cost[i][j - 1] + 1,
                             cost[i - 1][j - 1] + (reference[i - 1] != hypothesis[j - 1]))  # fmt: skip
    errors, heard = [0] * max(1, n), [[] for _ in range(max(1, n))]
    i, j = n, m
    while i or j:
        at = max(0, i - 1)
        if i and j and cost[i][j] == cost[i - 1][j - 1] + (reference[i - 1] != hypothesis[j - 1]):
            errors[at] += reference[i - 1] != hypothesis[j - 1]
            heard[at].insert(0, hypothesis[j - 1])
            i, j = i - 1, j - 1
        elif i and cost[i][j] == cost[i - 1][j] + 1:
            errors[at] += 1
            i -= 1
        else:
            errors[at] += 1
            heard[at].insert(0, hypothesis[j - 1])
            j -= 1
    return errors[:n] if n else errors, heard[:n] if n else heard


def per_sentence(track: Any, words: Words) -> list[dict[str, Any]]:
    """Each reference sentence of ``track`` with the errors and words of ``words`` aligned to it."""
    from tests.support.subtitle_tracks import normalise

    errors, heard = aligned_errors(track.words, [w for w, _, _ in words])
    out, at = [], 0
    for text, span in zip(track.text, track.truth, strict=True):
        n = len(normalise(text))
        out.append({"span": span, "text": text, "words": n, "errors": sum(errors[at : at + n]),
                    "heard": " ".join(w for h in heard[at : at + n] for w in h)})  # fmt: skip
        at += n
    return out


def main() -> None:
    os.environ.update(ONE_THREAD)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--half", choices=("heldout", "tuning"), default="heldout")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mediafarm-peers")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--show", type=int, default=12, help="windows listed where the engine loses most")
    ap.add_argument("--tracks", type=int, default=None, help="only the half's first N tracks (a quick look)")
    ap.add_argument("--names", default=None, help="only these tracks of the half, comma-separated (heldout-08,...)")
    ap.add_argument("--peer", choices=("transcribe", "batched"), default=None,
                    help="the bare pipeline to compare with (default: both run, the lower WER is the best)")
    args = ap.parse_args()

    from bench.peers_subtitle import BARE, PIPELINE, bare_pipelines, engine_words, linked_models, tiny_model
    from mediafarm.tasks.families.subtitle import recognisers
    from mediafarm.tasks.families.subtitle.spec import FAMILY, WhisperParams
    from tests.support.heldout_corpus import corpus

    made = corpus(args.workdir / "heldout-corpus", halves=(args.half,))
    tracks = [t for t in getattr(made, args.half) if args.names is None or t.name in args.names.split(",")]
    tracks = tracks[: args.tracks]
    models = linked_models(args.workdir)
    rung = next(r for r in FAMILY.ladder if r.name == "whisper-tiny")
    params = WhisperParams(**rung.params)
    bare_model = tiny_model(params.compute_type)
    bare = bare_pipelines(bare_model)
    stages = Stages()
    engine = "farm engine (whisper-tiny rung)"
    peers = {"transcribe": [BARE], "batched": [PIPELINE], None: [BARE, PIPELINE]}[args.peer]
    contenders: dict[str, Callable[[str], Words]] = {engine: lambda path: engine_words(models, path, params),
                                                     **{p: bare[p] for p in peers}}  # fmt: skip
    for run in contenders.values():  # model loads, first calls
        run(str(tracks[0].path))
    # The decoder timed in both models: the engine's (cached by the recogniser) and the peers'.
    engine_model = recognisers.load_whisper(models / params.model, "cpu", params.compute_type, params.cpu_threads)
    for m in {id(engine_model): engine_model, id(bare_model): bare_model}.values():
        m.model = _TimedGenerate(m.model, stages)
    results: dict[str, Any] = {c: {"tracks": {}, "stages": defaultdict(float), "calls": defaultdict(int)}
                               for c in contenders}  # fmt: skip
    for track in tracks:
        for name, run in contenders.items():
            windows: list[Any] = []
            with instrumented(stages, windows):
                c0 = time.process_time()
                words = run(str(track.path))
                total = time.process_time() - c0
            seconds, calls = stages.take()
            seconds["total"] = total
            seconds["rest"] = total - sum(v for k, v in seconds.items() if k != "total")
            for k, v in seconds.items():
                results[name]["stages"][k] += v
            for k, v in calls.items():
                results[name]["calls"][k] += v
            cell: dict[str, Any] = {"sentences": per_sentence(track, words)}
            if windows:
                cell["windows"] = [[p.start, p.end] for w in windows[-1] for p in w.pieces[:1]]
                cell["window_ends"] = [w.end for w in windows[-1]]
            results[name]["tracks"][track.name] = cell
            errs = sum(s["errors"] for s in cell["sentences"])
            print(f"{track.name} {name:<42} errors {errs:>3}/{len(track.words):<4} CPU {total:.2f} s", flush=True)
    wer = {n: sum(s["errors"] for c in r["tracks"].values() for s in c["sentences"]) for n, r in results.items()}
    best = min(peers, key=lambda n: wer[n])
    report = compare_windows(results[engine]["tracks"], results[best]["tracks"], tracks)
    summary = {
        "half": args.half, "voices": made.voices, "best_bare": best, "errors": wer,
        "ref_words": sum(len(t.words) for t in tracks),
        "stages": {n: {k: round(v, 3) for k, v in r["stages"].items()} for n, r in results.items()},
        "calls": {n: dict(r["calls"]) for n, r in results.items()}, **report,
        "command": " ".join([".venv/bin/python", "-m", "bench.heldout_where", *sys.argv[1:]]),
    }  # fmt: skip
    print_summary(summary, args.show)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({**summary, "per_track": {n: r["tracks"] for n, r in results.items()}},
                                       indent=1, default=str))  # fmt: skip
    print(f"wrote {args.results}")


def compare_windows(ours: dict[str, Any], theirs: dict[str, Any], tracks: list[Any]) -> dict[str, Any]:
    """The engine's windows with each side's errors in them; the ones it loses, worst first."""
    rows = []
    missed = {"sentences": 0, "words": 0, "errors_ours": 0, "errors_theirs": 0}
    for track in tracks:
        mine, peer = ours[track.name], theirs[track.name]
        starts, ends = [w[0] for w in mine.get("windows", [])], mine.get("window_ends", [])
        by_window: dict[int, list[tuple[dict, dict]]] = defaultdict(list)
        for a, b in zip(mine["sentences"], peer["sentences"], strict=True):
            middle = (a["span"][0] + a["span"][1]) / 2
            index = next((i for i, (s, e) in enumerate(zip(starts, ends, strict=True)) if s <= middle <= e), None)
            if index is None:
                missed["sentences"] += 1
                missed["words"] += a["words"]
                missed["errors_ours"] += a["errors"]
                missed["errors_theirs"] += b["errors"]
                index = -1
            by_window[index].append((a, b))
        for index, pairs in by_window.items():
            rows.append({
                "track": track.name, "window": index,
                "start": starts[index] if index >= 0 else None, "end": ends[index] if index >= 0 else None,
                "words": sum(a["words"] for a, _ in pairs), "ours": sum(a["errors"] for a, _ in pairs),
                "theirs": sum(b["errors"] for _, b in pairs),
                "sentences": [{"text": a["text"], "ours": a["heard"], "theirs": b["heard"], "errors": [a["errors"], b["errors"]]}
                              for a, b in pairs if a["errors"] != b["errors"]],
            })  # fmt: skip
    losing = sorted((r for r in rows if r["ours"] > r["theirs"]), key=lambda r: r["theirs"] - r["ours"])
    winning = [r for r in rows if r["ours"] < r["theirs"]]
    return {
        "windows": len(rows), "windows_lost": len(losing), "windows_won": len(winning),
        "errors_in_lost_windows": [sum(r["ours"] for r in losing), sum(r["theirs"] for r in losing)],
        "errors_in_won_windows": [sum(r["ours"] for r in winning), sum(r["theirs"] for r in winning)],
        "outside_every_window": missed, "lost": losing,
    }  # fmt: skip


def print_summary(s: dict[str, Any], show: int) -> None:
    print(f"\n{s['half']} half, {s['ref_words']} reference words; errors: {s['errors']}; best bare: {s['best_bare']}")
    print(f"windows: {s['windows']}, the engine loses {s['windows_lost']} (errors engine/bare "
          f"{s['errors_in_lost_windows']}), wins {s['windows_won']} ({s['errors_in_won_windows']}); sentences "
          f"outside every window: {s['outside_every_window']}")  # fmt: skip
    names = list(s["stages"])
    keys = ["vad", "features", "encoder", "decoder", "alignment", "onsets", "cues", "rest", "total"]
    print(f"\n{'CPU s':<10}" + "".join(f"{n[:34]:>36}" for n in names))
    for k in keys:
        print(f"{k:<10}" + "".join(f"{s['stages'][n].get(k, 0.0):>36.2f}" for n in names))
    print(f"calls: {s['calls']}")
    for r in s["lost"][:show]:
        print(f"\n{r['track']} window {r['window']} ({r['start']}-{r['end']} s): engine {r['ours']} errors, "
              f"bare {r['theirs']}, of {r['words']} words")  # fmt: skip
        for x in r["sentences"]:
            print(f"  ref:    {x['text']}\n  engine: {x['ours']}  ({x['errors'][0]})\n  bare:   {x['theirs']}  ({x['errors'][1]})")


if __name__ == "__main__":
    main()
