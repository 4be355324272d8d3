"""Resuming YOLO jobs from checkpoints (issue #19): a long job cut at 50 % and at 90 %, total time
to the result with resume against without, what keeping checkpoints costs a run never cut, and how
close a motion gate rebuilt from a run-in comes to one that never stopped. The YOLO part of
``bench/resume.py`` (its TTS part is there, subtitles and VAD in ``bench/resume_media.py``), in a
module of its own so the families' benchmarks are edited apart; the same method.

Run from the repository root::

    nice .venv/bin/python -m bench.resume_yolo --seconds 300 --runs 3

The engine is the real one (``yolo.engines.detect``, the ``yolo-nano`` rung's ONNX model: a
random-weight YOLO11n exported at 320, as the tests build it, which costs what a trained one does)
through ``EngineContext`` with the real checkpoint seam (``tasks.wire.checkpoint``: store, writer, the
folder cleared between attempts but for the checkpoint, its files restored), at the farm's default
interval (5 s) unless ``--interval`` says otherwise, in one process, side by side, medians of
``--runs``. The video: ``tests.support.yolo.make_video``'s still scene, 320x180 at 10 fps, in
which a rectangle moves half the time (20 s of every 40), ``--seconds`` long, stride 0.5 s.

A cut stops the attempt once it has decoded past the cut's share of the video: what a SIGKILL
there leaves is the last checkpoint, up to an interval older. "With resume" is the cut attempt
plus one resumed from the checkpoint; "without" is the cut attempt plus a whole run (what the farm
did before). Overhead: an uncut run keeping checkpoints against one keeping none, alternated, the
median of the runs' ratios. The model is loaded once, before any timing.

Run-in (``run_in``): the gate's learnt state kept in a checkpoint is exact; this measures the
alternative the issue named, a fresh gate fed ``R`` seconds of samples before the resume point
(the middle of the video), against the gate that ran from the start: the largest difference in
the background (grey levels) at the point, and the samples after it whose motion verdict differs.
Results go to ``bench/results/resume_yolo.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
STRIDE = 0.5


class Cut(BaseException):
    """The attempt ends here, as a SIGKILL ends it: nothing in the engine catches it."""


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def _attempt(job: dict[str, Any], *, cut: float | None = None, keep: bool = True) -> dict[str, Any]:
    """One attempt of the job from its last checkpoint, cut once it has decoded past ``cut`` of the video."""
    from mediafarm.tasks.families.yolo import engines
    from mediafarm.tasks.wire.checkpoint import CheckpointWriter

    ctx, store = job["ctx"], job["store"]
    ctx.artifacts.clear()
    resume = store.load() if keep else None
    if resume is not None:
        store.restore(resume)
    ctx.resume = resume
    ctx.checkpoints = CheckpointWriter(store, "seconds", ctx.rung, job["interval"], resume) if keep else None
    ctx.__dict__.pop("progress", None)  # an earlier cut attempt's, on the same context
    if cut is not None:
        def progress(fraction: float | None = None, **_: Any) -> None:
            if fraction is not None and fraction >= cut:
                raise Cut

        ctx.progress = progress
    keeping = [0.0]  # seconds inside the checkpoint writes (the gate's file, the manifest)
    write = engines.keep

    def timed(*args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        write(*args, **kwargs)
        keeping[0] += time.perf_counter() - start

    engines.keep = timed
    t0 = time.perf_counter()
    try:
        result = engines.detect(ctx, job["request"], job["params"])
    except Cut:
        return {"s": time.perf_counter() - t0}
    finally:
        engines.keep = write
    return {"s": time.perf_counter() - t0, "from_s": resume.position if resume else 0.0, "keep_s": keeping[0],
            "examined": result.frames.examined, "writes": ctx.checkpoints.writes if keep else 0}  # fmt: skip


def run_in(video: Path, seconds: list[float]) -> dict[str, Any]:
    """The gate rebuilt from ``R`` s of samples before the middle of ``video`` against the gate
    that never stopped (``yolo.motion.MotionDetector`` at the rung's defaults)."""
    import numpy as np

    from mediafarm.tasks.families.yolo.frames import VideoSamples
    from mediafarm.tasks.families.yolo.motion import MotionDetector
    from mediafarm.tasks.families.yolo.spec import MotionParams

    params = MotionParams()

    def gate() -> MotionDetector:
        return MotionDetector(alpha=params.motion_alpha, threshold=params.motion_threshold,
                              min_area=params.motion_min_area)  # fmt: skip

    with VideoSamples(video, stride=STRIDE, grey_width=params.motion_width, image_width=None) as samples:
        greys = [(s.t, s.grey) for s in samples]
    point = greys[len(greys) // 2][0]
    whole, at_point, verdicts = gate(), None, []
    for t, grey in greys:
        if t >= point and at_point is None:
            at_point = whole.arrays()["background"].copy()
        verdicts.append(whole.update(grey) is not None)
    report: dict[str, Any] = {"point_s": point, "samples_after": sum(1 for t, _ in greys if t >= point)}
    for length in seconds:
        fresh = gate()
        differ = 0
        for (t, grey), verdict in zip(greys, verdicts, strict=True):
            if t < point - length:
                continue
            if t >= point and report.setdefault(f"{length:g}", {}).get("max_background_diff") is None:
                diff = float(np.abs(fresh.arrays()["background"] - at_point).max())
                report[f"{length:g}"]["max_background_diff"] = round(diff, 3)
            moving = fresh.update(grey) is not None
            differ += t >= point and moving != verdict
        report[f"{length:g}"]["verdicts_differing_after"] = differ
    return report


def yolo(args: argparse.Namespace) -> dict[str, Any]:
    from mediafarm.tasks.families.yolo.spec import DetectParams, YoloRequest
    from mediafarm.tasks.runtime.context import EngineContext
    from mediafarm.tasks.wire.checkpoint import store_for
    from tests.support.yolo import build_random_yolo, make_video

    report: dict[str, Any] = {"video_s": args.seconds, "stride_s": STRIDE, "runs": args.runs,
                              "interval_s": args.interval}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-resume-yolo-") as tmp:
        models = Path(tmp) / "models"
        build_random_yolo(models, Path(tmp) / "ultralytics")
        moving = [(start, start + 20.0) for start in range(10, int(args.seconds) - 20, 40)]
        video = make_video(Path(tmp) / "long.mp4", duration=args.seconds, moving=moving)
        request = YoloRequest(media=str(video), stride=STRIDE)
        params = DetectParams(weights="yolo11n.onnx")
        count = iter(range(10**6))

        def job() -> dict[str, Any]:
            local = EngineContext.local(storage_dir=Path(tmp) / "storage", models_dir=models, job_id=f"j{next(count)}")
            ctx = EngineContext(local.job_id, 0, 0, "yolo-nano", "cpu", local.artifacts, models)
            return {"ctx": ctx, "store": store_for(ctx.artifacts, "yolo", request.model_dump(mode="json")),
                    "request": request, "params": params, "interval": args.interval}  # fmt: skip

        _attempt(job(), cut=0.02)  # loads the model, warms the caches
        plain: list[float] = []
        keeping: list[dict[str, Any]] = []
        cuts: dict[str, dict[str, list[float]]] = {f"{c:.0%}": {"cut": [], "resumed": [], "from_s": []}
                                                   for c in args.cuts}  # fmt: skip
        for _ in range(args.runs):
            keeping.append(_attempt(job()))
            plain.append(_attempt(job(), keep=False)["s"])
            for share in args.cuts:
                cut_job = job()
                runs = cuts[f"{share:.0%}"]
                runs["cut"].append(_attempt(cut_job, cut=share)["s"])
                resumed = _attempt(cut_job)
                runs["resumed"].append(resumed["s"])
                runs["from_s"].append(resumed["from_s"])
        full = _median(plain)
        report["full_run_s"] = full
        report["full_run_keeping_checkpoints_s"] = _median([k["s"] for k in keeping])
        report["examined"] = keeping[0]["examined"]
        report["checkpoint_writes"] = keeping[0]["writes"]
        report["overhead_pct"] = round(100 * (statistics.median(
            k["s"] / p for k, p in zip(keeping, plain, strict=True)) - 1), 2)  # fmt: skip
        # The writes' own share of a run keeping them: what the A/B ratio measures, without the
        # noise of a shared machine (two runs differ by more than the writes take).
        report["writes_pct_of_run"] = round(100 * statistics.median(k["keep_s"] / k["s"] for k in keeping), 3)
        report["write_ms"] = round(1000 * statistics.median(k["keep_s"] / max(1, k["writes"]) for k in keeping), 2)
        report["cuts"] = {}
        for share, runs in cuts.items():
            cut, resumed = _median(runs["cut"]), _median(runs["resumed"])
            report["cuts"][share] = {
                "cut_attempt_s": cut, "resumed_attempt_s": resumed, "resumed_from_s": runs["from_s"],
                "total_with_resume_s": round(cut + resumed, 3), "total_without_resume_s": round(cut + full, 3),
                "after_cut_pct_of_full_run": round(100 * resumed / full, 1),
            }  # fmt: skip
        report["run_in"] = run_in(video, args.run_in)
        report["raw"] = {"plain_s": plain, "keeping": keeping, "cuts": cuts}
    return report


def show(report: dict[str, Any]) -> None:
    print(f"yolo-nano (ONNX, 320): {report['video_s']:g} s of video at {report['stride_s']} s stride, "
          f"{report['examined']} frames examined, medians of {report['runs']}, checkpoints every "
          f"{report['interval_s']:g} s")  # fmt: skip
    print(f"  full run {report['full_run_s']:.2f} s; keeping checkpoints {report['full_run_keeping_checkpoints_s']:.2f}"
          f" s ({report['checkpoint_writes']} writes): overhead {report['overhead_pct']:+.2f} %")  # fmt: skip
    print(f"  the writes themselves: {report['write_ms']:.1f} ms each, {report['writes_pct_of_run']:.3f} % of a run")
    for share, r in report["cuts"].items():
        print(f"  cut at {share}: with resume {r['total_with_resume_s']:.2f} s, without {r['total_without_resume_s']:.2f}"
              f" s; after the cut {r['resumed_attempt_s']:.2f} s = {r['after_cut_pct_of_full_run']} % of a full run")
    ri = report["run_in"]
    for key, r in ri.items():
        if isinstance(r, dict):
            print(f"  run-in of {key} s before {ri['point_s']:g} s: background off by up to "
                  f"{r['max_background_diff']:.3f} grey levels, {r['verdicts_differing_after']} of "
                  f"{ri['samples_after']} motion verdicts after it differ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="length of the video")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cuts", type=float, nargs="+", default=[0.5, 0.9], help="shares of the job to cut at")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between checkpoints at most")
    parser.add_argument("--run-in", type=float, nargs="+", default=[10.0, 30.0, 60.0], help="run-in lengths, seconds")
    args = parser.parse_args()
    report = yolo(args)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "resume_yolo.json").write_text(json.dumps(report, indent=1))
    show(report)


if __name__ == "__main__":
    main()
