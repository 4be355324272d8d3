"""YOLO behind the motion gate vs YOLO on every frame, on a generated, mostly static 720p video.

Run from the repository root::

    /work/venv214/bin/python bench/yolo.py --seconds 180 --short 30

Inputs (made once under ``--workdir``): a 1280x720, 15 fps, H.264 (GOP ``--gop``, default 250) video of
a still scene in which a dark rectangle moves during a few short spans (``--seconds`` long, and a
``--short`` one with the same pattern), and a random-weight YOLO11n from ultralytics' yaml with COCO
names, saved as ``.pt`` and exported to ONNX at 640 (the production size). Random weights detect
nothing: the comparison is of cost and of which frames reach the model, not of detections.

Every measurement runs in a fresh child process (this script with ``--child``), so its peak RSS
(VmHWM) is its own. Variants, all through :func:`mediafarm.tasks.families.yolo.engines.detect`
(the production code) with the ``yolo-nano`` rung's parameters (ONNX, CPU, 1 s stride):

* ``gated``: the motion gate decides (the default).
* ``every``: ``prefilter=False``, every frame at the stride goes to the model.
* ``crop``: the gate, and the model sees a crop around the motion from 1280-wide frames.
* ``motion``: the ``motion`` rung alone: decode + gate, no model (the floor).
* ``runtimes``: ms per call of the same weights on torch (``.pt``, letterboxed to 384x640) and
  onnxruntime (exported at 640x640 and at 384x640), 20 interleaved calls each on a 640x360 frame.

Results go to ``bench/results/yolo.json``. The machine is shared; ratios are what count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "yolo.json"
WIDTH, HEIGHT, FPS, GOP = 1280, 720, 15, 250
STRIDE = 1.0
SPAN_SECONDS = 8.0


def moving_spans(seconds: float) -> list[tuple[float, float]]:
    """Three short movements spread over the video (about 10-15 % of a 3-minute one)."""
    return [(round(seconds * f, 1), round(seconds * f + SPAN_SECONDS, 1)) for f in (0.2, 0.5, 0.8)]


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise KeyError("VmHWM")


# ---------------------------------------------------------------- child: one measurement
def child(variant: str, video: Path, models: Path) -> dict[str, Any]:
    from mediafarm.tasks.context import EngineContext
    from mediafarm.tasks.families.yolo import engines
    from mediafarm.tasks.families.yolo.spec import DetectParams, MotionParams, YoloRequest

    ctx = EngineContext.local(models_dir=models)
    request = YoloRequest(media=str(video), stride=STRIDE)
    if variant == "runtimes":
        return _runtimes(models)
    examined: list[float] = []
    original = engines._examine

    def record(detector: Any, frame: Any, *args: Any, **kwargs: Any) -> None:
        examined.append(frame.t)
        original(detector, frame, *args, **kwargs)

    engines._examine = record
    started = time.perf_counter()
    if variant == "motion":
        result = engines.motion(ctx, request, MotionParams())
        load = 0.0
    else:
        params = {"gated": {}, "every": {"prefilter": False}, "crop": {"crop": True, "frame_width": 1280}}[variant]
        load_started = time.perf_counter()
        engines.load_detector(models / "yolo11n.onnx", "cpu")  # loaded once per child, as in a pool
        load = time.perf_counter() - load_started
        started = time.perf_counter()
        result = engines.detect(ctx, request, DetectParams(weights="yolo11n.onnx", **params))
    wall = time.perf_counter() - started
    return {"variant": variant, "wall_s": round(wall, 2), "load_s": round(load, 2),
            "frames": result.frames.model_dump(), "duration": result.duration, "examined_times": examined,
            "motion_spans": [d.model_dump(include={"start", "end"}) for d in result.detections.get("motion", [])],
            "peak_rss_mb": round(peak_rss_mb(), 1)}  # fmt: skip


def _runtimes(models: Path) -> dict[str, Any]:
    """ms per call of the same weights on torch and on onnxruntime (square and 16:9 exports),
    the calls interleaved so that a neighbour's load on the shared machine hits all alike."""
    import numpy as np

    from mediafarm.tasks.families.yolo.model import Detector, ultralytics_offline

    ultralytics = ultralytics_offline()
    image = np.random.default_rng(0).integers(0, 255, size=(360, 640, 3), dtype=np.uint8)
    contenders: dict[str, tuple[Detector, int | None]] = {}
    for name, weights, imgsz in (("torch 640 (rect 384x640)", "yolo11n.pt", 640),
                                 ("onnx 640x640", "yolo11n.onnx", None),
                                 ("onnx 384x640", "yolo11n-rect.onnx", None)):  # fmt: skip
        yolo = ultralytics.YOLO(str(models / weights), task="detect")
        contenders[name] = (Detector(yolo, weights=models / weights, device="cpu", label=name), imgsz)
    import torch

    torch.set_num_threads(os.cpu_count() or 1)  # onnxruntime takes every core by default: same for torch
    for _ in range(3):  # warm
        for detector, imgsz in contenders.values():
            detector.detect(image, classes=[0], conf=0.25, imgsz=imgsz)
    for detector, _ in contenders.values():
        detector.calls, detector.seconds = 0, 0.0
    for _ in range(20):
        for detector, imgsz in contenders.values():
            detector.detect(image, classes=[0], conf=0.25, imgsz=imgsz)
    return {"variant": "runtimes", "ms_per_frame": {name: d.ms_per_call() for name, (d, _) in contenders.items()}}


def run_child(variant: str, video: Path, models: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--child", variant, str(video), str(models)],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- parent
def ensure_inputs(workdir: Path, seconds: float, short: float, gop: int) -> tuple[Path, Path, Path]:
    from tests.support.yolo import build_random_yolo, make_video

    workdir.mkdir(parents=True, exist_ok=True)
    models = workdir / "models"
    build_random_yolo(models, workdir / "ultralytics", imgsz=640)
    if not (models / "yolo11n-rect.onnx").exists():  # the same weights exported for 16:9 frames
        shutil.copyfile(models / "yolo11n.pt", models / "yolo11n-rect.pt")
        export = "from ultralytics import YOLO; import sys; YOLO(sys.argv[1]).export(format='onnx', imgsz=[384, 640])"
        env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_AUTOINSTALL": "False",
               "YOLO_CONFIG_DIR": str(workdir / "ultralytics")}  # fmt: skip
        subprocess.run([sys.executable, "-c", export, str(models / "yolo11n-rect.pt")], env=env, check=True,
                       capture_output=True)  # fmt: skip
    videos = []
    for length in (seconds, short):
        path = workdir / f"static-{int(length)}s-720p-gop{gop}.mp4"
        if not path.exists():
            started = time.perf_counter()
            make_video(path, duration=length, moving=moving_spans(length), width=WIDTH, height=HEIGHT, fps=FPS,
                       gop=gop, preset="veryfast")  # fmt: skip
            print(f"made {path.name} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        videos.append(path)
    return videos[0], videos[1], models


def coverage(examined: list[float], spans: list[tuple[float, float]]) -> float:
    """Fraction of the stride slots inside the moving spans that reached the model."""
    slots = [s * STRIDE for s in range(int(spans[-1][1] / STRIDE) + 1)
             if any(a + STRIDE <= s * STRIDE <= b for a, b in spans)]  # fmt: skip
    seen = {round(t, 3) for t in examined}
    return sum(1 for s in slots if round(s, 3) in seen) / len(slots)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180.0, help="length of the long video")
    parser.add_argument("--short", type=float, default=30.0, help="length of the short video (peak RSS baseline)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mediafarm-bench-yolo"))
    parser.add_argument("--gop", type=int, default=GOP,
                        help="frames between keyframes; a camera's is 1-2 s (15-30 at 15 fps): with a GOP "
                             "no longer than the stride only keyframes are decoded")  # fmt: skip
    args = parser.parse_args()
    long, short, models = ensure_inputs(args.workdir, args.seconds, args.short, args.gop)
    spans = moving_spans(args.seconds)
    runs = {v: run_child(v, long, models) for v in ("motion", "gated", "every", "crop", "runtimes")}
    short_gated = run_child("gated", short, models)
    gated, every, crop, floor = runs["gated"], runs["every"], runs["crop"], runs["motion"]
    report = {
        "machine": f"{platform.node()} {os.cpu_count()} CPUs (shared), {platform.python_version()}",
        "video": {"seconds": args.seconds, "size": f"{WIDTH}x{HEIGHT}", "fps": FPS, "gop": args.gop, "moving": spans},
        "stride_s": STRIDE,
        "runs": {k: {kk: vv for kk, vv in v.items() if kk != "examined_times"} for k, v in runs.items()},
        "short": {kk: vv for kk, vv in short_gated.items() if kk != "examined_times"},
        "speed_ratio_every_over_gated": round(every["wall_s"] / gated["wall_s"], 2),
        "model_time_ratio_every_over_gated": round(
            every["frames"]["examined"] * every["frames"]["model_ms_per_frame"]
            / (gated["frames"]["examined"] * gated["frames"]["model_ms_per_frame"]), 2),
        "moving_slots_examined": {"gated": coverage(gated["examined_times"], spans),
                                  "every": coverage(every["examined_times"], spans),
                                  "crop": coverage(crop["examined_times"], spans)},
        "motion_rung_spans": floor["motion_spans"],
        "realtime_multiple": {k: round(args.seconds / v["wall_s"], 1) for k, v in runs.items() if "wall_s" in v},
        "model_ms_per_frame": runs["runtimes"]["ms_per_frame"],
        "peak_rss_long_over_short": round(gated["peak_rss_mb"] / short_gated["peak_rss_mb"], 3),
    }  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))))
    else:
        main()
