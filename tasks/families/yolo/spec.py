"""What a YOLO job takes and returns, its engines, its default ladder and how the CLI shows it.

Imported by every farm process, producers included: nothing heavy here (the engines import PyAV,
numpy and ultralytics in the pool child).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator
from rich.table import Table

from mediafarm.tasks.kit import (
    CommaList,
    EngineSpec,
    FamilySpec,
    Made,
    MediaPath,
    Params,
    Request,
    ResultMetric,
    Resume,
    Span,
    TimeLimits,
    rung,
)

ENGINES = "mediafarm.tasks.families.yolo.engines"
# The class the `motion` rung reports its spans under (no model ran, so no real class).
MOTION_CLASS = "motion"

ClassName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=64)]


class YoloRequest(Request):
    """Attributes: media (a video FFmpeg reads, or an image, inside FARM_MEDIA_ROOTS), classes
    (model class names to report; checked against the model's own names when the job runs),
    stride (seconds between the frames looked at; default: the rung's ``stride_s``), ladder (a
    declared ladder of the yolo family, ``[ladders.NAME] family = "yolo"``; default: the family's)."""

    media: MediaPath
    classes: Annotated[list[ClassName], CommaList] = Field(default_factory=lambda: ["person"], min_length=1)
    stride: float | None = Field(None, gt=0, le=60)
    ladder: str | None = None

    @field_validator("classes")
    @classmethod
    def _unique(cls, classes: list[str]) -> list[str]:
        return list(dict.fromkeys(classes))


class Detection(BaseModel):
    """One interval in which a class was seen.

    Attributes:
        start: Seconds from the start of the media (the first frame it was seen in).
        end: Seconds; the last frame it was seen in plus one stride (what that frame stands for).
        peak_confidence: The highest confidence in the interval (for ``motion``: the largest
            fraction of pixels that changed).
        box: ``[x1, y1, x2, y2]`` in source pixels, of the detection at the peak.
        frames: Frames it was seen in.
    """

    model_config = ConfigDict(frozen=True)

    start: float
    end: float
    peak_confidence: float
    box: tuple[float, float, float, float]
    frames: int

    def span(self) -> Span:
        """The interval as the farm's :class:`Span`, for merging with other jobs' spans."""
        return Span(self.start, self.end)


class FrameCounters(BaseModel):
    """What the motion gate saved (the counters Frigate publishes for its own).

    Attributes:
        decoded: Frames FFmpeg decoded: all of them, or only the keyframes (``keyframes_only``).
        sampled: Frames at the stride, downscaled and given to the motion gate.
        examined: Frames (or crops) sent to the model.
        skipped: Sampled frames the gate kept from the model (no motion nearby).
        model_ms_per_frame: Mean wall time of one model call, pre- and post-processing included;
            None when the model never ran.
        keyframes_only: The video's keyframes are at most a stride apart, so only they were
            decoded (a camera's GOP of 1-2 s and a stride of 1-2 s: most of the decode saved).
    """

    decoded: int = 0
    sampled: int = 0
    examined: int = 0
    skipped: int = 0
    model_ms_per_frame: float | None = None
    keyframes_only: bool = False


@dataclass(frozen=True)
class MadeWithModel(Made):
    """A stretch ``[start, end)`` of the video, the rung whose attempt looked at it, and its model."""

    model: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "model": self.model}


class YoloResult(BaseModel):
    """Detections in one video or image.

    Attributes:
        detections: Class name → its intervals, sorted; every requested class has a key. The
            ``motion`` rung reports the class ``motion`` alone.
        frames: The motion gate's counters.
        duration: Seconds of video decoded (0 for an image).
        width, height: Source frame size in pixels (the boxes' coordinates).
        stride: Seconds between the frames looked at.
        model: The model, its runtime and versions (``motion prefilter`` on the last rung).
        crop: True when the model saw crops around the motion, not whole frames.
        motion_only: True on the ``motion`` rung: spans of motion, no model ran; a pipeline
            must not read them as people.
        made: Which rung made which stretch of the video, in order: one part when the job ran
            on one rung; more when it resumed from a checkpoint on another (a kill moves a job
            down its ladder). Each stretch's detections are its rung's; an interval that spans
            a join is one interval. A part made by the ``motion`` rung reports the class
            ``motion`` for its stretch (``motion_only`` only when it made the whole video).
    """

    model_config = ConfigDict(frozen=True)

    detections: dict[str, list[Detection]] = Field(default_factory=dict)
    frames: FrameCounters = Field(default_factory=FrameCounters)
    duration: float = 0.0
    width: int = 0
    height: int = 0
    stride: float = 0.0
    model: str = ""
    crop: bool = False
    motion_only: bool = False
    made: list[MadeWithModel] = Field(default_factory=list)

    def spans(self, name: str) -> list[Span]:
        """The intervals of class ``name`` as spans (empty when it was not asked for or not seen)."""
        return [d.span() for d in self.detections.get(name, [])]


class MotionParams(Params):
    """The motion gate (and the ``motion`` rung).

    Attributes:
        stride_s: Seconds between the frames looked at (a job's ``stride`` overrides it).
        motion_width: Width of the grey frames compared (height keeps the aspect).
        motion_alpha: How fast the background learns a frame (running average weight): small
            values keep a slow walker visible, large ones forget a parked car sooner.
        motion_threshold: Grey-level difference from the background that counts as a change.
        motion_min_area: Fraction of the pixels that must change for a frame to count as motion.
        margin_before_s, margin_after_s: Frames this close before or after motion go to the
            model too (someone standing still just before or after moving).
        join_s: Intervals of one class closer than this merge.
    """

    stride_s: float = Field(0.5, gt=0, le=60)
    motion_width: int = Field(160, ge=32, le=640)
    motion_alpha: float = Field(0.05, gt=0, le=1)
    motion_threshold: int = Field(25, ge=1, le=255)
    motion_min_area: float = Field(0.002, gt=0, le=1)
    margin_before_s: float = Field(1.0, ge=0, le=30)
    margin_after_s: float = Field(2.0, ge=0, le=60)
    join_s: float = Field(1.0, ge=0, le=60)


class DetectParams(MotionParams):
    """A YOLO rung: the motion gate's parameters plus the model's.

    Attributes:
        weights: File under FARM_MODELS_DIR: ``.pt`` (torch; GPU rungs) or ``.onnx`` (exported,
            run by ultralytics through onnxruntime; CPU rungs). Absent: the rung is unavailable.
        imgsz: Model input size for ``.pt``; an export runs at the size it was exported with.
        conf: Minimum confidence of a detection.
        frame_width: Width frames are downscaled to as soon as they are decoded; the model sees
            these, or crops of them.
        crop: Run the model on a crop around the motion instead of the whole frame (Frigate's
            design: a small far person fills more of the model's input). Margin frames, which
            have no motion of their own, go whole.
        crop_min: Smallest crop side in pixels (the model's input size is a good value: a
            smaller crop would only be upscaled).
        prefilter: False sends every frame at the stride to the model (the baseline the gate is
            measured against).
        threads: Intra-op threads on CPU, torch's or onnxruntime's (a pool runs one child per core).
    """

    weights: str = Field(pattern=r"^[^/].*\.(pt|onnx)$")
    imgsz: int | None = Field(None, ge=32, le=2048, multiple_of=32)
    conf: float = Field(0.25, gt=0, lt=1)
    frame_width: int = Field(640, ge=64, le=3840)
    crop: bool = False
    crop_min: int = Field(320, ge=32, le=3840)
    prefilter: bool = True
    threads: int = Field(1, ge=1, le=64)


def summary(result: YoloResult) -> str:
    f = result.frames
    ms = f" model {f.model_ms_per_frame:.1f} ms/frame" if f.model_ms_per_frame is not None else ""
    flag = "  [yellow](motion only: no model ran)[/]" if result.motion_only else ""
    return (f"model {result.model}  duration {result.duration:.1f} s  frames decoded {f.decoded}, "
            f"examined {f.examined}, skipped {f.skipped}{ms}{flag}")  # fmt: skip


def render(result: YoloResult) -> Table | str:
    rows = [(name, d) for name, found in result.detections.items() for d in found]
    if not rows:
        return f"nothing found ({', '.join(result.detections) or 'no classes'})"
    table = Table("class", "start (s)", "end (s)", "peak conf", "box [x1, y1, x2, y2]", "frames")
    for name, d in sorted(rows, key=lambda row: (row[1].start, row[0])):
        box = ", ".join(f"{v:.0f}" for v in d.box)
        table.add_row(name, f"{d.start:.2f}", f"{d.end:.2f}", f"{d.peak_confidence:.2f}", f"[{box}]", str(d.frames))
    return table


def _probe(request: YoloRequest) -> None:
    # Imported here: PyAV is a pool child's package, and this module is every producer's.
    from mediafarm.tasks.kit.media import probe_video

    probe_video(request.media)


# What the motion gate saved, per finished job (Frigate publishes the same): mediafarm_frames_total
# by fate and mediafarm_model_ms_per_frame, served by every worker (docs/operating.md).
FRAME_METRICS = (
    *(ResultMetric.counter("frames_total", f"frames.{fate}", "Video frames of finished jobs, by what became of them",
                           fate=fate) for fate in ("decoded", "examined", "skipped")),
    ResultMetric.histogram("model_ms_per_frame", "frames.model_ms_per_frame",
                           "Mean model time per examined frame, one observation per finished job",
                           buckets=(5, 10, 25, 50, 100, 250, 500, 1000, 2500)),
)  # fmt: skip


FAMILY = FamilySpec(
    name="yolo",
    task_name="farm.yolo.detect",
    description="Object detection intervals (default: person) in a video or image; YOLO behind a motion gate",
    probe=_probe,
    request=YoloRequest,
    result=YoloResult,
    engines={
        # torch: ultralytics imports it whatever the weights (and .pt rungs run on it).
        "detect": EngineSpec(
            f"{ENGINES}:detect", DetectParams, needs=("ultralytics", "torch", "av", "numpy"), extra="yolo",
            weights="weights",
        ),
        # No model, no detections: motion spans only. A fallback, never a cheaper answer (tasks.runtime.ladder_choice).
        "motion": EngineSpec(f"{ENGINES}:motion", MotionParams, needs=("av", "numpy"), extra="yolo", fallback=True),
    },
    ladder=(
        # GPU rungs: torch weights, the pool's GPU memory fraction applied; a CUDA OOM moves down.
        rung("yolo-large", "detect", device="cuda", weights="yolo11l.pt", imgsz=640, stride_s=0.5),
        rung("yolo-small", "detect", device="cuda", weights="yolo11s.pt", imgsz=640, stride_s=0.5),
        # ONNX Runtime on CPU, on the rung's own threads (torch and ONNX measured side by side, and
        # the threads a pool child takes: docs/benchmarks/yolo.md).
        rung("yolo-nano", "detect", weights="yolo11n.onnx", stride_s=1.0),
        # No model: motion spans, flagged, so a YOLO that keeps getting killed still yields something.
        rung("motion", "motion", stride_s=0.5),
    ),
    # One attempt; under FARM_VISIBILITY_TIMEOUT (7200). Decoding is the floor, and nano on every
    # sampled frame adds about as much again: hours of video fit on 2 cores with room to spare
    # (measured: docs/benchmarks/yolo.md).
    limits=TimeLimits(soft=5400, hard=5600, stall=300),
    # Checkpoints (resume.py): the motion gate's state is kept bit for bit, so the same rung goes
    # on as if never stopped; a lower rung (a smaller model, or motion alone) makes the rest, and
    # the result's `made` says which rung made which stretch.
    resume=Resume(
        unit="seconds",
        rule="from the last examined sample, the motion gate's state kept; on any rung (`made` says which made what)",
    ),
    cli_argument="media",
    ladder_field="ladder",
    summary=summary,
    render=render,
    metrics=FRAME_METRICS,
)
