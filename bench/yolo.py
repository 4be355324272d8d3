"""YOLO behind the motion gate vs YOLO on every frame, on a generated, mostly static 720p video.

Run from the repository root::

    .venv/bin/python -m bench.yolo --seconds 180 --short 30

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

Two separate modes (each replaces the run above; flags not given keep it as it was):

* ``--rss-1080p LONG,SHORT`` (e.g. ``7200,600``): peak RSS of a gated ``yolo-nano`` job on a
  1920x1080 video of ``LONG`` seconds against one of ``SHORT`` seconds, each in a fresh child (its
  own ``VmHWM``). The videos are the same still scene and moving rectangle, at ``--rss-fps``
  (default 5) with a 1 s GOP (a camera's), x264 ``ultrafast``: 2 h of 1080p is made in minutes and
  kept under ``--workdir`` for the next run. Results: ``bench/results/yolo-rss-1080p.json``.
* ``--sizes n,s,l``: ms per frame of random-weight YOLO11 nano / small / large (ultralytics' own
  yaml: the true compute per frame, no download) on torch (``.pt``, ``imgsz=640``: letterboxed to
  384x640) and onnxruntime (exported at 640x640, the farm's CPU rung, and at 384x640), on a 640x360
  frame (the farm's ``frame_width``); torch on 1 thread (what ultralytics sets on this machine) and on
  every core (as onnxruntime); one fresh child per size, ``--frames`` calls each in round-robin
  blocks after 3 warm-up calls, median. Results: ``bench/results/yolo-sizes.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "yolo.json"
RESULTS_RSS_1080P = ROOT / "bench" / "results" / "yolo-rss-1080p.json"
RESULTS_SIZES = ROOT / "bench" / "results" / "yolo-sizes.json"
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
    from mediafarm.tasks.families.yolo import engines
    from mediafarm.tasks.families.yolo.spec import DetectParams, MotionParams, YoloRequest
    from mediafarm.tasks.runtime.context import EngineContext

    ctx = EngineContext.local(models_dir=models)
    request = YoloRequest(media=str(video), stride=STRIDE)
    if variant == "runtimes":
        return _runtimes(models)
    if variant.startswith("threads-"):  # threads-<T>-<frames>
        _, threads, frames = variant.split("-")
        return _onnx_threads(models, int(threads), int(frames))
    if variant.startswith("size-"):  # size-<n|s|l>-<frames>
        _, size, frames = variant.split("-")
        return _model_size(models, size, int(frames))
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


def timing_frame() -> Any:
    """The frame every model timing uses: 640x360 BGR (the farm's frame_width on 16:9 video), random pixels."""
    import numpy as np

    return np.random.default_rng(0).integers(0, 255, size=(360, 640, 3), dtype=np.uint8)


def _runtimes(models: Path) -> dict[str, Any]:
    """ms per call of the same weights on torch and on onnxruntime (square and 16:9 exports),
    the calls interleaved so that a neighbour's load on the shared machine hits all alike."""

    from mediafarm.tasks.families.yolo.model import Detector, ultralytics_offline

    ultralytics = ultralytics_offline()
    image = timing_frame()
    contenders: dict[str, tuple[Detector, int | None]] = {}
    for name, weights, imgsz in (("torch 640 (rect 384x640)", "yolo11n.pt", 640),
                                 ("onnx 640x640", "yolo11n.onnx", None),
                                 ("onnx 384x640", "yolo11n-rect.onnx", None)):  # fmt: skip
        yolo = ultralytics.YOLO(str(models / weights), task="detect")
        contenders[name] = (Detector(yolo, weights=models / weights, device="cpu", label=name), imgsz)
    import torch

    # onnxruntime takes every core by default: same for torch, meant here. But ultralytics' predictor
    # setup (the first call of each model below) resets it to min(8, cpu_count - 1): on 2 cores torch
    # runs on 1 thread in this comparison (the --sizes mode measures both thread counts).
    torch.set_num_threads(os.cpu_count() or 1)
    for _ in range(3):  # warm
        for detector, imgsz in contenders.values():
            detector.detect(image, classes=[0], conf=0.25, imgsz=imgsz)
    for detector, _ in contenders.values():
        detector.calls, detector.seconds = 0, 0.0
    for _ in range(20):
        for detector, imgsz in contenders.values():
            detector.detect(image, classes=[0], conf=0.25, imgsz=imgsz)
    return {"variant": "runtimes", "ms_per_frame": {name: d.ms_per_call() for name, (d, _) in contenders.items()}}


def _onnx_threads(models: Path, threads: int, frames: int) -> dict[str, Any]:
    """``frames`` calls of the nano ONNX rung loaded as a pool child loads it, with ``threads``
    onnxruntime threads; the wall time of the calls alone (after 3 warm-up calls)."""

    from mediafarm.tasks.families.yolo.model import load_detector

    image = timing_frame()
    detector = load_detector(models / "yolo11n.onnx", "cpu", threads=threads)
    for _ in range(3):
        detector.detect(image, classes=[0], conf=0.25, imgsz=None)
    started = time.perf_counter()
    for _ in range(frames):
        detector.detect(image, classes=[0], conf=0.25, imgsz=None)
    return {"variant": f"threads-{threads}", "frames": frames, "calls_s": time.perf_counter() - started}


def onnx_children(workdir: Path, children: int, frames: int, rounds: int) -> None:
    """Frames/s of ``children`` processes running the nano ONNX rung at once, each with one
    onnxruntime thread (the farm's default) or with one per core (onnxruntime's own default, what
    ultralytics gave every child before), the two settings alternating round by round."""
    models = ensure_models(workdir)
    cores = os.cpu_count() or 1
    rates: dict[str, list[float]] = {"1 thread each": [], f"{cores} threads each": []}
    for _ in range(rounds):
        for label, threads in (("1 thread each", 1), (f"{cores} threads each", cores)):
            started = time.perf_counter()
            procs = [subprocess.Popen([sys.executable, "-m", "bench.yolo", "--child", f"threads-{threads}-{frames}", str(models),
                                       str(models)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
                     for _ in range(children)]  # fmt: skip
            outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
            # Aggregate rate over the calls alone (each child's load and warm-up excluded).
            rates[label].append(round(children * frames / max(o["calls_s"] for o in outs), 2))
            print(f"{label}: {rates[label][-1]} frames/s ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    medians = {k: statistics.median(v) for k, v in rates.items()}
    report = {"machine": f"{platform.node()} {cores} CPUs (shared), {platform.python_version()}",
              "children": children, "frames_per_child": frames, "frames_per_s": rates, "median": medians,
              "ratio_1_thread_over_default": round(medians["1 thread each"] / medians[f"{cores} threads each"], 3)}
    write(RESULTS.with_name("yolo-onnx-threads.json"), report)
    print(json.dumps(report, indent=2))


def _model_size(models: Path, size: str, frames: int) -> dict[str, Any]:
    """ms per frame of one model size on torch and onnxruntime (640x640 and 384x640 exports), the
    calls in short round-robin blocks, each call timed alone, the median reported (after 3 warm-up
    calls each).

    onnxruntime runs with its default, one intra-op thread per core. torch runs twice: on one thread
    (what ultralytics leaves: setting up a CPU predictor calls ``torch.set_num_threads(min(8,
    cpu_count - 1))``) and on one per core, the same cores as onnxruntime.
    """

    from mediafarm.tasks.families.yolo.model import Detector, ultralytics_offline

    ultralytics = ultralytics_offline()
    import torch

    cores = os.cpu_count() or 1
    image = timing_frame()
    detectors: dict[str, Detector] = {}
    loads: dict[str, float] = {}
    for runtime, weights in (("torch", f"yolo11{size}.pt"), ("onnx 640x640", f"yolo11{size}.onnx"),
                             ("onnx 384x640", f"yolo11{size}-rect.onnx")):  # fmt: skip
        started = time.perf_counter()
        yolo = ultralytics.YOLO(str(models / weights), task="detect")
        detectors[runtime] = Detector(yolo, weights=models / weights, device="cpu", label=runtime)
        for _ in range(3):  # warm: the first calls open the session, fuse the layers, size the arenas
            detectors[runtime].detect(image, classes=[0], conf=0.25, imgsz=640 if runtime == "torch" else None)
        loads[runtime] = round(time.perf_counter() - started, 2)
    ultralytics_threads = torch.get_num_threads()  # what ultralytics set up, whatever was asked before
    # label -> (detector, imgsz, torch threads)
    contenders: dict[str, tuple[Detector, int | None, int | None]] = {
        "torch 640 (rect 384x640), 1 thread": (detectors["torch"], 640, 1),
        f"torch 640 (rect 384x640), {cores} threads": (detectors["torch"], 640, cores),
        "onnx 640x640": (detectors["onnx 640x640"], None, None),
        "onnx 384x640": (detectors["onnx 384x640"], None, None),
    }
    torch.set_num_threads(cores)
    detectors["torch"].detect(image, classes=[0], conf=0.25, imgsz=640)  # warm the other thread count too
    times: dict[str, list[float]] = {name: [] for name in contenders}
    # Round robin in short blocks, so a neighbour's load hits all alike: each block starts with an
    # untimed call (the previous runtime's worker threads may still be spinning), then 2 timed ones.
    for _ in range(-(-frames // 2)):
        for name, (detector, imgsz, threads) in contenders.items():
            if threads is not None:
                torch.set_num_threads(threads)
            detector.detect(image, classes=[0], conf=0.25, imgsz=imgsz)
            for _ in range(2):
                started = time.perf_counter()
                detector.detect(image, classes=[0], conf=0.25, imgsz=imgsz)
                times[name].append(1000 * (time.perf_counter() - started))
    torch_model = detectors["torch"].yolo.model
    try:
        from ultralytics.utils.torch_utils import get_flops

        gflops = round(get_flops(torch_model, imgsz=640), 1) or None
    except Exception:  # noqa: BLE001 - informative only
        gflops = None
    return {"variant": f"size-{size}", "model": f"yolo11{size}", "frames": frames,
            "params_m": round(sum(p.numel() for p in torch_model.parameters()) / 1e6, 2), "gflops_640": gflops,
            "torch_threads_after_ultralytics_setup": ultralytics_threads, "load_and_warm_s": loads,
            "ms_per_frame_median": {k: round(statistics.median(v), 1) for k, v in times.items()},
            "ms_per_frame_min": {k: round(min(v), 1) for k, v in times.items()},
            "ms_per_frame_max": {k: round(max(v), 1) for k, v in times.items()},
            "peak_rss_mb": round(peak_rss_mb(), 1)}  # fmt: skip


def run_child(variant: str, video: Path, models: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "bench.yolo", "--child", variant, str(video), str(models)],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- parent
_BUILD_SIZE = """
import sys
from pathlib import Path
from ultralytics import YOLO
from ultralytics.utils import ROOT, YAML, SETTINGS
SETTINGS.update(sync=False)
target, size = Path(sys.argv[1]), sys.argv[2]
model = YOLO(f"yolo11{size}.yaml")  # random weights, ultralytics' own architecture for this size
model.model.names = YAML.load(ROOT / "cfg" / "datasets" / "coco.yaml")["names"]
model.save(str(target / f"yolo11{size}.pt"))
YOLO(str(target / f"yolo11{size}.pt")).export(format="onnx", imgsz=640)
"""


def ensure_models(workdir: Path, size: str = "n") -> Path:
    """Random-weight ``yolo11{size}.pt``, its ONNX export at 640 (``yolo11{size}.onnx``) and at
    384x640 (``yolo11{size}-rect.onnx``) under ``workdir/models``; built once. Nano through
    :func:`tests.support.yolo.build_random_yolo`, as the tests build it."""
    from tests.support.yolo import build_random_yolo

    models = (workdir / "models").resolve()
    models.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_AUTOINSTALL": "False",
           "YOLO_CONFIG_DIR": str((workdir / "ultralytics").resolve())}  # fmt: skip
    if size == "n":
        build_random_yolo(models, workdir / "ultralytics", imgsz=640)
    elif not (models / f"yolo11{size}.onnx").exists():
        subprocess.run([sys.executable, "-c", _BUILD_SIZE, str(models), size], cwd=models, env=env, check=True,
                       capture_output=True)  # fmt: skip
    if not (models / f"yolo11{size}-rect.onnx").exists():  # the same weights exported for 16:9 frames
        shutil.copyfile(models / f"yolo11{size}.pt", models / f"yolo11{size}-rect.pt")
        export = "from ultralytics import YOLO; import sys; YOLO(sys.argv[1]).export(format='onnx', imgsz=[384, 640])"
        subprocess.run([sys.executable, "-c", export, str(models / f"yolo11{size}-rect.pt")], cwd=models, env=env,
                       check=True, capture_output=True)  # fmt: skip
    return models


def ensure_inputs(workdir: Path, seconds: float, short: float, gop: int) -> tuple[Path, Path, Path]:
    from tests.support.yolo import make_video

    workdir.mkdir(parents=True, exist_ok=True)
    models = ensure_models(workdir, "n")
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


def write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


def rss_1080p(workdir: Path, long_s: float, short_s: float, fps: int) -> None:
    """Peak RSS of the gated yolo-nano job (the production engine, in a fresh child each) on a long
    and a short 1080p video: same scene, same pattern of three 8 s movements, 1 s GOP."""
    from tests.support.yolo import make_video

    workdir.mkdir(parents=True, exist_ok=True)
    models = ensure_models(workdir, "n")
    made: dict[str, float] = {}
    videos = {}
    for length in (short_s, long_s):
        path = workdir / f"static-{int(length)}s-1080p-{fps}fps-gop{fps}-ultrafast.mp4"
        if not path.exists():  # kept under --workdir: the next run reuses it
            started = time.perf_counter()
            make_video(path.with_suffix(".part.mp4"), duration=length, moving=moving_spans(length), width=1920,
                       height=1080, fps=fps, gop=fps, preset="ultrafast").rename(path)  # fmt: skip
            made[path.name] = round(time.perf_counter() - started, 1)
            print(f"made {path.name} in {made[path.name]:.0f} s", file=sys.stderr)
        videos[length] = path
    runs = {}
    for length in (short_s, long_s):  # one fresh child each: VmHWM is that job's alone
        run = run_child("gated", videos[length], models)
        run["moving_slots_examined"] = coverage(run.pop("examined_times"), moving_spans(length))
        run["x_real_time"] = round(run["duration"] / run["wall_s"], 1)
        runs[f"{int(length)}s"] = run
        print(f"{int(length)} s: peak RSS {run['peak_rss_mb']} MB, {run['wall_s']} s", file=sys.stderr)
    long_run, short_run = runs[f"{int(long_s)}s"], runs[f"{int(short_s)}s"]
    write(RESULTS_RSS_1080P, {
        "machine": f"{platform.node()} {os.cpu_count()} CPUs (shared), {platform.python_version()}",
        "video": {"size": "1920x1080", "fps": fps, "gop": fps, "preset": "ultrafast", "lengths_s": [long_s, short_s],
                  "bytes": {p.name: p.stat().st_size for p in videos.values()}},
        "generation_s": made, "stride_s": STRIDE, "runs": runs,
        "peak_rss_long_over_short": round(long_run["peak_rss_mb"] / short_run["peak_rss_mb"], 3),
    })  # fmt: skip


def model_sizes(workdir: Path, sizes: list[str], frames: int) -> None:
    """ms per frame per model size and runtime, one fresh child per size."""
    workdir.mkdir(parents=True, exist_ok=True)
    results = {}
    for size in sizes:
        started = time.perf_counter()
        models = ensure_models(workdir, size)
        print(f"yolo11{size}: weights ready in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        results[f"yolo11{size}"] = run_child(f"size-{size}-{frames}", models, models)
        print(f"yolo11{size}: {results[f'yolo11{size}']['ms_per_frame_median']}", file=sys.stderr)
    write(RESULTS_SIZES, {"machine": f"{platform.node()} {os.cpu_count()} CPUs (shared), {platform.python_version()}",
                          "frame": "640x360 BGR (random pixels)", "sizes": results})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180.0, help="length of the long video")
    parser.add_argument("--short", type=float, default=30.0, help="length of the short video (peak RSS baseline)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mediafarm-bench-yolo"))
    parser.add_argument("--gop", type=int, default=GOP,
                        help="frames between keyframes; a camera's is 1-2 s (15-30 at 15 fps): with a GOP "
                             "no longer than the stride only keyframes are decoded")  # fmt: skip
    parser.add_argument("--rss-1080p", metavar="LONG,SHORT",
                        help="only this: peak RSS of a gated yolo-nano job on LONG vs SHORT seconds of 1080p "
                             "(e.g. 7200,600), each in a fresh child")  # fmt: skip
    parser.add_argument("--rss-fps", type=int, default=5, help="frame rate of the 1080p videos (GOP: 1 s)")
    parser.add_argument("--sizes", metavar="n,s,l", help="only this: ms/frame per model size, torch vs ONNX")
    parser.add_argument("--frames", type=int, default=10,
                        help="timed calls per model and runtime (--sizes; rounded up to even)")
    parser.add_argument("--children", type=int,
                        help="only this: frames/s of N children running the nano ONNX rung at once, one "
                             "onnxruntime thread each vs one per core each")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5, help="rounds of --children (median reported)")
    args = parser.parse_args()
    if args.children:
        return onnx_children(args.workdir, args.children, args.frames, args.rounds)
    if args.rss_1080p:
        long_s, short_s = (float(x) for x in args.rss_1080p.split(","))
        return rss_1080p(args.workdir, long_s, short_s, args.rss_fps)
    if args.sizes:
        return model_sizes(args.workdir, args.sizes.split(","), args.frames)
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
