"""The yolo rows of ``bench/peers.py``: a ``yolo`` job against ultralytics' own ``predict``.

Inputs (:data:`VIDEOS`, made with ``tests.support.yolo.make_video``, ``--seconds`` each, 10 fps
H.264): the tests' still scene with a dark rectangle that moves during three short spans (640x360,
x264's default GOP), the same rectangle moving the whole time, short moves between spans of
random-noise frames (the motion gate sees change everywhere), and a camera-like 1280x720 with a
keyframe every second (the farm then decodes only the keyframes).

The model is the tests' random-weight YOLO11n (``tests.support.yolo.build_random_yolo``: ultralytics'
own yaml, COCO names, exported to ONNX at 320 px; no weights can be downloaded here), loaded by
the farm's own offline import (``model.ultralytics_offline``) on both sides. Random weights detect
nothing: every contender's detections are empty and agree trivially. What the comparison shows is
which frames reached the model: a contender that looks at fewer frames is faster by answering less.

Farm: a ``yolo`` job on the default ladder (the GPU rungs are unavailable on a CPU pool; the
``yolo-nano`` rung: ONNX, 1 s stride, conf 0.25, motion gate on, class ``person``). Peers, in this
process, each on its own ``YOLO`` whose ONNX session is reopened with one intra-op thread after
the warm-up (ultralytics opens it with one per core and passes no session options; the farm's
child does the same reopening), ``conf`` and ``classes`` as the rung's:

* ``ultralytics predict every frame``: ``model.predict(video, stream=True)`` (OpenCV decodes).
* ``ultralytics predict vid_stride``: the same with ``vid_stride`` = the rung's stride in frames
  (10 at 10 fps), the frames the farm samples.
* ``farm engine in-process``: the job's engine (``engines.detect``) called here, which shows what
  the job adds around it.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

FPS = 10
RUNG = "yolo-nano"


@dataclass(frozen=True)
class Video:
    """One generated input: ``kind`` names its pattern; ``fps`` and ``frames`` as written."""

    kind: str
    path: Path
    width: int
    height: int
    fps: int
    frames: int

    @property
    def name(self) -> str:
        return self.path.stem


def moves(seconds: float) -> list[tuple[float, float]]:
    """Three movements of 3 s spread over the video (20 %, 50 %, 80 % in)."""
    return [(round(seconds * f, 1), round(seconds * f + 3.0, 1)) for f in (0.2, 0.5, 0.8)]


# kind -> make_video's arguments, given the length in seconds.
VIDEOS: dict[str, Callable[[float], dict[str, Any]]] = {
    "short-moves": lambda s: {"width": 640, "height": 360, "moving": moves(s)},
    "always-moving": lambda s: {"width": 640, "height": 360, "moving": [(0.0, s)]},
    "noisy": lambda s: {"width": 640, "height": 360, "moving": moves(s),
                        "noisy": [(round(s * 0.35, 1), round(s * 0.45, 1)), (round(s * 0.65, 1), round(s * 0.7, 1))]},
    "camera-720p-gop1s": lambda s: {"width": 1280, "height": 720, "moving": moves(s), "gop": FPS,
                                    "preset": "ultrafast"},
}  # fmt: skip


def make_inputs(workdir: Path, seconds: float) -> list[Video]:
    """Every kind of :data:`VIDEOS`, ``seconds`` long, made once under ``workdir`` and reused."""
    from tests.support.yolo import make_video

    videos = []
    for kind, options in VIDEOS.items():
        opts = options(seconds)
        path = workdir / f"yolo-{kind}-{seconds:g}s.mp4"
        if not path.exists():
            partial = path.with_name(f"partial-{path.name}")
            make_video(partial, duration=seconds, fps=FPS, **opts)
            partial.rename(path)
        videos.append(Video(kind, path, opts["width"], opts["height"], FPS, int(seconds * FPS)))
    return videos


@dataclass(frozen=True)
class Seen:
    """What one contender answered: frames the model ran on, frames with a hit of the class, and
    the hits joined into intervals ``(start, end)`` seconds, as the job reports them."""

    model_frames: int
    hit_frames: int
    intervals: list[tuple[float, float]]


def seen_of_result(output: dict[str, Any], name: str = "person") -> Seen:
    """A YoloResult (as JSON) as :class:`Seen`."""
    found = output["detections"].get(name, [])
    return Seen(output["frames"]["examined"], sum(d["frames"] for d in found), [(d["start"], d["end"]) for d in found])


def seen_of_hits(model_frames: int, hits: list[tuple[float, float]], *, step: float, join_s: float,
                 duration: float) -> Seen:  # fmt: skip
    """Per-frame hits ``(t, confidence)`` of a bare ``predict`` joined as the job joins its own
    (``tracks.IntervalBuilder``: a frame stands for ``step`` seconds, hits ``join_s`` apart merge)."""
    from mediafarm.tasks.families.yolo.tracks import IntervalBuilder

    tracks = IntervalBuilder(["person"], stride=step, join_s=join_s)
    for t, confidence in hits:
        tracks.add("person", t, confidence, (0.0, 0.0, 0.0, 0.0))
    found = tracks.finish(duration)["person"]
    return Seen(model_frames, len(hits), [(d.start, d.end) for d in found])


def compare(ours: Seen, theirs: Seen) -> dict[str, Any]:
    """Frames the model saw and what was found, the job's against a peer's."""
    same_count = len(ours.intervals) == len(theirs.intervals)
    worst = max((abs(a - b) for o, t in zip(ours.intervals, theirs.intervals) for a, b in zip(o, t)), default=0.0)
    return {"model_frames": ours.model_frames, "peer_model_frames": theirs.model_frames,
            "hit_frames": ours.hit_frames, "peer_hit_frames": theirs.hit_frames,
            "intervals": len(ours.intervals), "peer_intervals": len(theirs.intervals), "same_count": same_count,
            "max_boundary_ms": round(worst * 1000, 1) if same_count else None}  # fmt: skip


def yolo_bench(args: argparse.Namespace, workdir: Path) -> Any:
    """The :class:`bench.peers.FamilyBench` of the yolo family."""
    import onnxruntime

    from bench.peers import Contender, FamilyBench, farm_worker, process_tree_cpu
    from mediafarm.tasks.families.yolo import engines
    from mediafarm.tasks.families.yolo.model import ultralytics_offline
    from mediafarm.tasks.families.yolo.spec import FAMILY, DetectParams, YoloRequest
    from mediafarm.tasks.runtime.context import EngineContext
    from tests.support.yolo import build_random_yolo

    models = workdir / "models"
    _, onnx = build_random_yolo(models, workdir / "ultralytics-build")
    rung = next(r for r in FAMILY.ladder if r.name == RUNG)
    params = DetectParams(**rung.params)
    inputs = make_inputs(workdir, args.seconds)
    ultralytics = ultralytics_offline()  # the farm's own import: no network, before any YOLO
    person = [0]  # COCO's class 0; the job's default class

    def bare(vid_stride: int) -> Callable[[Video], Seen]:
        yolo = ultralytics.YOLO(str(onnx), task="detect")
        state = {"threads_set": False}

        def run(video: Video) -> Seen:
            hits, frames = [], 0
            for i, result in enumerate(yolo.predict(str(video.path), stream=True, conf=params.conf, classes=person,
                                                    vid_stride=vid_stride, verbose=False, save=False)):  # fmt: skip
                frames += 1
                if result.boxes is not None and len(result.boxes):
                    hits.append((i * vid_stride / video.fps, float(result.boxes.conf.max())))
            if not state["threads_set"]:
                # The session exists only after the first call: reopen it on one thread, once.
                backend = yolo.predictor.model.backend
                options = onnxruntime.SessionOptions()
                options.intra_op_num_threads, options.inter_op_num_threads = params.threads, 1
                backend.session = onnxruntime.InferenceSession(str(onnx), options, providers=["CPUExecutionProvider"])
                state["threads_set"] = True
            step = vid_stride / video.fps
            return seen_of_hits(frames, hits, step=step, join_s=params.join_s, duration=video.frames / video.fps)

        return run

    def engine(video: Video) -> Seen:
        ctx = EngineContext.local(models_dir=models, storage_dir=workdir / "local-storage")
        result = engines.detect(ctx, YoloRequest(media=str(video.path)), params)
        return seen_of_result(result.model_dump(mode="json"))

    @contextlib.contextmanager
    def job() -> Iterator[Contender]:
        with farm_worker(workdir, "yolo") as worker:
            from mediafarm.tasks.producer.client import submit

            def run(video: Video) -> Seen:
                envelope = submit("yolo", media=str(video.path)).wait(timeout=600)
                assert envelope["rung"] == RUNG, envelope["rung"]
                return seen_of_result(envelope["output"])

            yield Contender("farm yolo job", run, cpu=process_tree_cpu(worker))

    stride_frames = max(1, round(params.stride_s * FPS))
    return FamilyBench(
        name="yolo",
        inputs=inputs,
        farm=job,
        peers=[
            Contender("ultralytics predict every frame", bare(1)),
            Contender(f"ultralytics predict vid_stride={stride_frames}", bare(stride_frames)),
            Contender("farm engine in-process", engine),
        ],
        compare=compare,
        describe=lambda v: f"{v.name} ({v.width}x{v.height}, {v.frames} frames)",
        meta={
            "rung": rung.name, "params": dict(rung.params), "weights": "random YOLO11n (tests.support.yolo), ONNX 320",
            "ultralytics": version("ultralytics"), "onnxruntime": version("onnxruntime"), "av": version("av"),
            "opencv": version("opencv-python") if _installed("opencv-python") else version("opencv-python-headless"),
            "seconds": args.seconds, "fps": FPS,
        },  # fmt: skip
    )


def _installed(name: str) -> bool:
    try:
        version(name)
    except Exception:  # noqa: BLE001 - PackageNotFoundError
        return False
    return True
