"""VAD memory and speed: the streaming silero engine against a naive whole-file load.

Run from the repository root::

    .venv/bin/python -m bench.vad_memory --lengths 600,5820,21600 --runs 3 --runs-long 1

For each input length (seconds of generated 16 kHz mono PCM_16 speech WAV) and each variant,
every measurement runs in a fresh child process (this script with ``--child``), so peak RSS is
that process's alone. Variants:

* ``ours``: :func:`mediafarm.tasks.families.vad.engines.silero`, streaming 10 s blocks through PyAV,
  one call of silero's sequence ONNX model per block (no torch imported).
* ``baseline``: ``soundfile.read`` of the whole file as float32, ``torch.from_numpy``, then
  silero's streaming ONNX model and ``VADIterator`` loop with the same parameters over 512-sample
  windows: the whole-track read behind the 97-minute OOM.

The child reports peak RSS (``VmHWM`` from /proc/self/status, plus ``ru_maxrss``) read at its end,
the model-load time and the wall time of the VAD call alone (RTF = VAD-call seconds / audio
seconds). Cells report the median of the runs. Targets (issue): ours peak RSS at the longest
input <= 1.05 x ours at the shortest; ours RTF <= 0.01 on one thread at every length.
Results go to ``bench/results/vad_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "vad_memory.json"
RATE = 16000
VARIANTS = ("ours", "baseline")
PARAMS: dict[str, Any] = {"threshold": 0.5, "min_silence_ms": 300, "speech_pad_ms": 30}
RSS_TARGET = 1.05
RTF_TARGET = 0.01
LONG_SECONDS = 3600  # lengths above this use --runs-long


# ---------------------------------------------------------------- child: one measurement
def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _baseline(path: Path, model: Any) -> tuple[int, float]:
    """Whole file in memory, then silero's VADIterator window by window, the engine's parameters.
    Returns (spans, speech seconds)."""
    import soundfile as sf
    import torch
    from silero_vad import VADIterator

    from mediafarm.tasks.families.vad.engines import SILERO_WINDOW

    audio, rate = sf.read(str(path), dtype="float32")
    assert rate == RATE and audio.ndim == 1
    wav = torch.from_numpy(audio)
    iterator = VADIterator(
        model,
        threshold=PARAMS["threshold"],
        sampling_rate=RATE,
        min_silence_duration_ms=PARAMS["min_silence_ms"],
        speech_pad_ms=PARAMS["speech_pad_ms"],
    )
    spans: list[tuple[int, int]] = []
    start: int | None = None
    with torch.inference_mode():
        for i in range(0, wav.numel(), SILERO_WINDOW):
            window = wav[i : i + SILERO_WINDOW]
            if window.numel() < SILERO_WINDOW:
                window = torch.nn.functional.pad(window, (0, SILERO_WINDOW - window.numel()))
            event = iterator(window)
            if not event:
                continue
            if "start" in event:
                start = int(event["start"])
            if "end" in event and start is not None:
                spans.append((start, min(int(event["end"]), wav.numel())))
                start = None
    iterator.reset_states()
    if start is not None:
        spans.append((start, wav.numel()))
    return len(spans), sum(e - s for s, e in spans) / RATE


def child(variant: str, path: Path) -> None:
    """Measure one variant on one file in this (fresh) process; print one JSON line."""
    t0 = time.perf_counter()
    if variant == "baseline":  # the engine imports no torch; silero's own iterator does
        import torch  # noqa: F401  (imported here so import time is not counted as load time)
        from silero_vad import load_silero_vad

    from mediafarm.tasks.families.vad import engines as vad
    from mediafarm.tasks.families.vad.spec import SileroParams, VadRequest
    from mediafarm.tasks.runtime.context import EngineContext

    t1 = time.perf_counter()
    # Each variant's own model: the engine's loader (sequence ONNX model, one thread), or silero's
    # streaming ONNX model (one thread, as its loader sets).
    model = vad.silero_model() if variant == "ours" else load_silero_vad(onnx=True)
    t2 = time.perf_counter()
    rss_loaded = _status_kib("VmRSS")
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t3 = time.perf_counter()
    if variant == "ours":
        result = vad.silero(EngineContext.local(), VadRequest(media=str(path)), SileroParams(**PARAMS))
        spans, speech, duration = len(result.spans), sum(s.end - s.start for s in result.spans), result.duration
    else:
        spans, speech = _baseline(path, model)
        import soundfile as sf

        duration = sf.info(str(path)).frames / RATE
    t4 = time.perf_counter()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    out = {
        "variant": variant,
        "import_s": t1 - t0,
        "load_s": t2 - t1,
        "vad_s": t4 - t3,
        "vad_cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
        "audio_s": duration,
        "rtf": (t4 - t3) / duration,
        "spans": spans,
        "speech_s": speech,
        "rss_after_load_kib": rss_loaded,
        "peak_rss_kib": _status_kib("VmHWM"),
        "ru_maxrss_kib": cpu1.ru_maxrss,
        "torch_imported": "torch" in sys.modules,
    }
    print(json.dumps(out))


# ---------------------------------------------------------------- parent: inputs, runs, report
def ensure_input(workdir: Path, seconds: int) -> Path:
    """The generated WAV for ``seconds``, reused when a complete one is already there."""
    import soundfile as sf

    from tests.support.speech import write_long_track

    path = workdir / f"speech_{seconds}s.wav"
    if path.exists() and sf.info(str(path)).frames == seconds * RATE:
        print(f"reusing {path}", flush=True)
        return path
    tmp = path.with_suffix(".partial.wav")
    t = time.perf_counter()
    write_long_track(tmp, seconds)
    tmp.rename(path)
    print(f"generated {path} ({path.stat().st_size / 2**20:.1f} MiB, {time.perf_counter() - t:.1f} s)", flush=True)
    return path


def measure(variant: str, path: Path) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.vad_memory", "--child", variant, str(path)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {variant} {path.name} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["child_wall_s"] = time.perf_counter() - t
    return result


def median_cell(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("peak_rss_kib", "rss_after_load_kib", "rtf", "vad_s", "vad_cpu_s", "load_s", "import_s")
    cell = {k: statistics.median(r[k] for r in runs) for k in keys}
    cell["peak_rss_mib"] = cell["peak_rss_kib"] / 1024
    cell["rss_after_load_mib"] = cell["rss_after_load_kib"] / 1024
    cell.update(runs=len(runs), spans=sorted({r["spans"] for r in runs}), audio_s=runs[0]["audio_s"])
    return cell


def report(cells: dict[int, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    head = f"{'input':>8} {'variant':>9} {'runs':>4} {'peak RSS MiB':>13} {'RSS@load MiB':>13} {'RTF':>8} {'load s':>7} {'spans':>6}"
    print("\n" + head + "\n" + "-" * len(head))
    for seconds, by_variant in cells.items():
        for variant, c in by_variant.items():
            spans = ",".join(str(s) for s in c["spans"])
            print(
                f"{f'{seconds / 60:g} min':>8} {variant:>9} {c['runs']:>4} {c['peak_rss_mib']:>13.1f} "
                f"{c['rss_after_load_mib']:>13.1f} {c['rtf']:>8.5f} {c['load_s']:>7.3f} {spans:>6}"
            )
    lengths = sorted(cells)
    short, long_ = lengths[0], lengths[-1]
    ours_short, ours_long = cells[short]["ours"]["peak_rss_kib"], cells[long_]["ours"]["peak_rss_kib"]
    ratio = ours_long / ours_short
    worst_len = max(lengths, key=lambda s: cells[s]["ours"]["rtf"])
    worst_rtf = cells[worst_len]["ours"]["rtf"]
    checks = {
        "rss_ratio": {"long_s": long_, "short_s": short, "ratio": ratio, "target": RSS_TARGET, "pass": ratio <= RSS_TARGET},
        "rtf": {"worst_rtf": worst_rtf, "at_s": worst_len, "target": RTF_TARGET, "pass": worst_rtf <= RTF_TARGET},
    }
    print(
        f"\nours peak RSS {long_}s / {short}s = {ratio:.4f} (target <= {RSS_TARGET}): "
        f"{'PASS' if checks['rss_ratio']['pass'] else 'FAIL'}"
    )
    print(
        f"ours worst median RTF = {worst_rtf:.5f} at {worst_len}s (target <= {RTF_TARGET}): "
        f"{'PASS' if checks['rtf']['pass'] else 'FAIL'}"
    )
    return checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="600,5820,21600", help="input lengths in seconds, comma-separated")
    ap.add_argument("--runs", type=int, default=3, help="runs per cell (median reported)")
    ap.add_argument("--runs-long", type=int, default=None, help=f"runs per cell for lengths > {LONG_SECONDS} s")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mediafarm-vad-bench",
                    help="where generated WAVs live (kept and reused; 6 h is ~660 MiB)")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    lengths = [int(s) for s in args.lengths.split(",")]
    variants = ("ours",) if args.skip_baseline else VARIANTS
    args.workdir.mkdir(parents=True, exist_ok=True)
    inputs = {s: ensure_input(args.workdir, s) for s in lengths}
    raw: dict[int, dict[str, list[dict[str, Any]]]] = {s: {v: [] for v in variants} for s in lengths}
    started = time.time()
    for seconds in lengths:
        n = args.runs_long if (args.runs_long and seconds > LONG_SECONDS) else args.runs
        for i in range(n):  # variants interleaved so drift on a shared machine hits both alike
            for variant in variants:
                r = measure(variant, inputs[seconds])
                raw[seconds][variant].append(r)
                print(f"{seconds}s {variant} run {i + 1}/{n}: peak {r['peak_rss_kib'] / 1024:.1f} MiB, "
                      f"RTF {r['rtf']:.5f}, {r['spans']} spans, child {r['child_wall_s']:.1f} s", flush=True)
    cells = {s: {v: median_cell(runs) for v, runs in by_v.items()} for s, by_v in raw.items()}
    checks = report(cells)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": " ".join([".venv/bin/python", "-m", "bench.vad_memory", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "elapsed_s": time.time() - started,
        "nproc": os.cpu_count(),
        "cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name")), platform.processor()),
        "python": platform.python_version(),
        "params": PARAMS,
    }
    RESULTS.write_text(json.dumps({"meta": meta, "cells": cells, "checks": checks, "runs": raw}, indent=2))
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
