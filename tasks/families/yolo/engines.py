"""YOLO engines: ``engine(ctx, request, params) -> YoloResult``.

``detect``: decode at the stride (``frames``), let the motion gate pick frames (``motion``), run the
model on them, whole or cropped around the motion (``model``), and join hits into intervals
(``tracks``). ``motion``: the gate alone, its motion spans reported as the class ``motion``,
flagged. Both stream: memory does not grow with the video's length. Progress follows the decode
position; cancellation is checked once per sampled frame. Both keep checkpoints between two
samples and go on from one (``resume``). Callable without a broker:
``detect(EngineContext.local(models_dir=...), YoloRequest(media=...), DetectParams(weights=...))``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from mediafarm.tasks.families.yolo.frames import SLOT_TOLERANCE, Sample, VideoSamples, crop_around
from mediafarm.tasks.families.yolo.model import Detector, load_detector
from mediafarm.tasks.families.yolo.motion import Gated, MotionDetector, MotionGate, Region
from mediafarm.tasks.families.yolo.resume import Carried, drop_kept, keep, made, take_over
from mediafarm.tasks.families.yolo.spec import (
    MOTION_CLASS,
    DetectParams,
    FrameCounters,
    MotionParams,
    YoloRequest,
    YoloResult,
)
from mediafarm.tasks.families.yolo.tracks import Box, IntervalBuilder
from mediafarm.tasks.kit import EngineContext

# What the `motion` rung reports as its model (no model ran).
MOTION_LABEL = "motion prefilter"


def detect(ctx: EngineContext, request: YoloRequest, params: DetectParams) -> YoloResult:
    """YOLO on the frames the motion gate lets through (every sampled frame with ``prefilter=False``)."""
    detector = load_detector(ctx.model_path(params.weights), ctx.device, params.threads)
    class_ids = detector.class_ids(request.classes)
    stride = request.stride or params.stride_s
    tracks = IntervalBuilder(request.classes, stride=stride, join_s=params.join_s)
    path = Path(request.media)
    with VideoSamples(path, stride=stride, grey_width=params.motion_width, image_width=params.frame_width) as video:
        gate: MotionGate[Sample] = _gate(params, stride)
        motion = _motion(params)
        carried = take_over(ctx, video, motion, tracks)
        if ctx.resume is not None and carried.models:
            gate.restore({**(carried.gate or {"until": None, "first": False}), "skipped": carried.skipped})
        for sample, region in _scan(ctx, video, motion, carried, stage=f"yolo {params.weights}"):
            passed = gate.offer(sample.t, sample, region) if params.prefilter else [Gated(sample.t, sample, region)]
            for frame in passed:
                _examine(detector, frame, class_ids, params, tracks, source=(video.width, video.height))
            if ctx.checkpoint_due():
                keep(ctx, video, motion, tracks, held=gate.held(), gate=gate.state(), skipped=gate.skipped,
                     examined=carried.examined + detector.calls, model_seconds=carried.model_seconds + detector.seconds,
                     models={**carried.models, ctx.rung: detector.label})  # fmt: skip
        gate.finish()
        drop_kept(ctx)
        duration = video.duration or video.position
        calls, seconds = carried.examined + detector.calls, carried.model_seconds + detector.seconds
        counters = FrameCounters(decoded=video.decoded, sampled=video.sampled, examined=calls,
                                 keyframes_only=video.keyframes_only, skipped=gate.skipped,
                                 model_ms_per_frame=round(1000 * seconds / calls, 2) if calls else None)  # fmt: skip
        return _result(ctx, carried, tracks, counters, video, duration, stride, detector.label, crop=params.crop)


def motion(ctx: EngineContext, request: YoloRequest, params: MotionParams) -> YoloResult:
    """The motion gate alone: spans where the picture changed, as the class ``motion``, flagged."""
    stride = request.stride or params.stride_s
    tracks = IntervalBuilder([MOTION_CLASS], stride=stride, join_s=params.join_s)
    with VideoSamples(Path(request.media), stride=stride, grey_width=params.motion_width, image_width=None) as video:
        motion = _motion(params)
        carried = take_over(ctx, video, motion, tracks)
        moving, sampled_before = 0, video.sampled
        for sample, region in _scan(ctx, video, motion, carried, stage="motion"):
            if region is not None:
                moving += 1
                # The change happened since the previous sample: that is where the span starts.
                since = max(0.0, sample.t - stride)
                tracks.add(MOTION_CLASS, since, region.area, _region_box(region, video.width, video.height))
            if ctx.checkpoint_due():
                keep(ctx, video, motion, tracks, held=[], gate=None,
                     skipped=carried.skipped + video.sampled - sampled_before - moving, examined=carried.examined,
                     model_seconds=carried.model_seconds, moving=carried.moving + moving,
                     models={**carried.models, ctx.rung: MOTION_LABEL})  # fmt: skip
        drop_kept(ctx)
        duration = video.duration or video.position
        examined = carried.examined  # by a model rung, before this one took over
        counters = FrameCounters(decoded=video.decoded, sampled=video.sampled, examined=examined,
                                 skipped=carried.skipped + video.sampled - sampled_before - moving,
                                 keyframes_only=video.keyframes_only,
                                 model_ms_per_frame=round(1000 * carried.model_seconds / examined, 2) if examined else None,
                                 )  # fmt: skip
        return _result(ctx, carried, tracks, counters, video, duration, stride, MOTION_LABEL)


def _result(
    ctx: EngineContext,
    carried: Carried,
    tracks: IntervalBuilder,
    counters: FrameCounters,
    video: VideoSamples,
    duration: float,
    stride: float,
    model: str,
    *,
    crop: bool = False,
) -> YoloResult:
    parts = made(ctx, carried, round(duration, 3), model)
    models = list(dict.fromkeys(p.model for p in parts))
    return YoloResult(detections=tracks.finish(duration), frames=counters, duration=round(duration, 3),
                      width=video.width, height=video.height, stride=stride, model=" then ".join(models), crop=crop,
                      motion_only=models == [MOTION_LABEL], made=parts)  # fmt: skip


def _gate(params: MotionParams, stride: float) -> MotionGate[Sample]:
    return MotionGate(stride=stride, margin_before=params.margin_before_s, margin_after=params.margin_after_s)


def _motion(params: MotionParams) -> MotionDetector:
    return MotionDetector(alpha=params.motion_alpha, threshold=params.motion_threshold, min_area=params.motion_min_area)


def _scan(
    ctx: EngineContext, video: VideoSamples, motion: MotionDetector, carried: Carried | None = None, *, stage: str
) -> Iterator[tuple[Sample, Region | None]]:
    """Each sampled frame with its motion region, reporting progress and checking for cancel.
    After a resume: run-in samples only teach the motion gate; samples it held at the checkpoint
    come again as judged then (no motion), the learnt state having seen them already."""
    replay_to = carried.replay_to if carried is not None else -1.0
    for sample in video:
        if sample.run_in:
            motion.update(sample.grey)
            continue
        replayed = sample.t <= replay_to + SLOT_TOLERANCE
        yield sample, None if replayed else motion.update(sample.grey)
        fraction = video.position / video.duration if video.duration else None
        ctx.progress(fraction, stage=stage, media_seconds=video.position)
        ctx.check_cancelled()


def _examine(
    detector: Detector,
    frame: Gated[Sample],
    class_ids: list[int],
    params: DetectParams,
    tracks: IntervalBuilder,
    *,
    source: tuple[int, int],
) -> None:
    """One model call on a frame (or its crop); its best hit per class goes into ``tracks``."""
    image, dx, dy = frame.item.image, 0, 0
    sx, sy = source[0] / image.shape[1], source[1] / image.shape[0]
    if params.crop and frame.region is not None:
        image, dx, dy = crop_around(image, frame.region, min_side=params.crop_min)
    best: dict[int, tuple[float, Box]] = {}
    for hit in detector.detect(image, classes=class_ids, conf=params.conf, imgsz=params.imgsz):
        if hit.confidence > best.get(hit.cls, (-1.0,))[0]:
            x1, y1, x2, y2 = hit.box
            # Back to the source frame: undo the crop, then the early downscale.
            best[hit.cls] = (hit.confidence, ((x1 + dx) * sx, (y1 + dy) * sy, (x2 + dx) * sx, (y2 + dy) * sy))
    for cls, (confidence, box) in best.items():
        tracks.add(detector.names[cls], frame.t, confidence, box)


def _region_box(region: Region, width: int, height: int) -> Box:
    return (region.x1 * width, region.y1 * height, region.x2 * width, region.y2 * height)
