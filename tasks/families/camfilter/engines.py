"""The cam-filter's cut: read the VAD and YOLO stages' results, plan the clips, cut them.

Runs as the fan-in job of the pipeline (``spec``): both stages have ended when it starts. Every
clip is written atomically into the job's artifact folder (``clips/clip_0001.mp4`` ...) and
decoded again before it counts; ``clips.json`` lists them with the stages' histories. A rung that
is killed part-way starts clean (the farm clears the folder between attempts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mediafarm.tasks.families.camfilter.cut import check_clip, choose_cut, clip_suffix, cut_clip, keyframe_times
from mediafarm.tasks.families.camfilter.plan import Clip, plan_clips
from mediafarm.tasks.families.camfilter.spec import CamfilterRequest, CamfilterResult, ClipOut, CutParams, StageOut
from mediafarm.tasks.families.vad.spec import VadResult
from mediafarm.tasks.families.yolo.spec import MOTION_CLASS, YoloResult
from mediafarm.tasks.kit import EngineContext, PermanentFailure, Span

CLIPS = "clips"


def cut(ctx: EngineContext, request: CamfilterRequest, params: CutParams) -> CamfilterResult:
    stages = {c.part.family: c.envelope for c in ctx.collect()}
    if set(stages) != {"vad", "yolo"}:
        raise PermanentFailure(f"camfilter {ctx.job_id}: its plan has stages {sorted(stages)}, not vad and yolo")
    vad = VadResult.model_validate(stages["vad"]["output"])
    yolo = YoloResult.model_validate(stages["yolo"]["output"])
    spans = _spans_by_reason(vad, yolo, request.classes)
    duration = yolo.duration or vad.duration
    clips = plan_clips(spans, duration, request.rules)
    source = Path(request.media)
    keyframes = keyframe_times(source) if clips else []
    written = [_cut_one(ctx, source, i, clip, keyframes, params, len(clips)) for i, clip in enumerate(clips, 1)]
    result = CamfilterResult(
        clips=written, duration=round(duration, 3), kept=round(sum(c.end - c.start for c in written), 3),
        speech_spans=len(spans.get("speech", [])),
        detection_spans=sum(len(v) for k, v in spans.items() if k != "speech"),
        stages={"vad": _stage(stages["vad"], vad), "yolo": _stage(stages["yolo"], yolo)},
    )  # fmt: skip
    with ctx.artifacts.open("clips.json", "w") as fh:
        json.dump(result.model_dump(mode="json"), fh, indent=2)
    return result


def _spans_by_reason(vad: VadResult, yolo: YoloResult, classes: list[str]) -> dict[str, list[Span]]:
    spans: dict[str, list[Span]] = {"speech": list(vad.spans)}
    if yolo.motion_only:
        # YOLO ended on its motion rung: motion stands in for the classes, and says so.
        spans[MOTION_CLASS] = yolo.spans(MOTION_CLASS)
    else:
        for name in classes:
            spans[name] = yolo.spans(name)
    return spans


def _cut_one(ctx: EngineContext, source: Path, number: int, clip: Clip, keyframes: list[float],
             params: CutParams, total: int) -> ClipOut:  # fmt: skip
    ctx.check_cancelled()
    method, _ = choose_cut(clip.start, keyframes, params.max_lead)
    name = f"{CLIPS}/clip_{number:04d}{clip_suffix(method, source)}"
    with ctx.artifacts.writing(name) as temp:
        made = cut_clip(source, clip.start, clip.end, temp, keyframes, params.max_lead)
        frames, _ = check_clip(temp)  # a clip that does not decode fails the rung, not the viewer
    ctx.progress(number / total, stage=f"clip {number}/{total}", media_seconds=clip.end)
    return ClipOut(file=name, start=round(made.start, 3), end=round(made.end, 3), reasons=list(clip.reasons),
                   method=made.method, frames=frames)  # fmt: skip


def _stage(envelope: dict[str, Any], output: VadResult | YoloResult) -> StageOut:
    flags = [name for name in ("vad_skipped", "no_audio", "motion_only") if getattr(output, name, False)]
    return StageOut(job_id=envelope["job_id"], variant=envelope.get("variant", ""), flags=flags,
                    attempts=list(envelope.get("attempts") or []))  # fmt: skip
