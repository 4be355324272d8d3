"""The cam-filter's cut: read the VAD and YOLO stages' results, plan the clips, cut them.

Runs as the fan-in job of the pipeline (``spec``): both stages have ended when it starts. Every
clip is written atomically into the job's artifact folder (``clips/clip_0001.mp4`` ...), cut as
cheaply as its codec allows (``cut``), and decoded again and compared with the source before it
counts (``check``); ``clips.json`` lists them with the stages' histories. A rung that
is killed part-way starts clean (the farm clears the folder between attempts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mediafarm.tasks.families.camfilter.check import ClipMismatch, verify_clip
from mediafarm.tasks.families.camfilter.cut import JoinFailed, Mode, choose_cut, clip_suffix, cut_clip
from mediafarm.tasks.families.camfilter.plan import Clip, plan_clips
from mediafarm.tasks.families.camfilter.source import Source, probe_source
from mediafarm.tasks.families.camfilter.spec import CamfilterRequest, CamfilterResult, ClipOut, CutParams, StageOut
from mediafarm.tasks.families.vad.spec import VadResult
from mediafarm.tasks.families.yolo.spec import MOTION_CLASS, YoloResult
from mediafarm.tasks.kit import EngineContext, PermanentFailure, Span, UnreadableMedia

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
    source = probe_source(Path(request.media)) if clips else None
    written = [_cut_one(ctx, source, i, clip, params.mode, len(clips)) for i, clip in enumerate(clips, 1)]
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
        return spans
    for name in classes:
        spans[name] = yolo.spans(name)
    if yolo.spans(MOTION_CLASS):
        # A YOLO job that resumed on its motion rung: motion stands in for the classes after the join.
        spans[MOTION_CLASS] = yolo.spans(MOTION_CLASS)
    return spans


def _cut_one(ctx: EngineContext, source: Source | None, number: int, clip: Clip, mode: Mode, total: int) -> ClipOut:
    assert source is not None
    ctx.check_cancelled()
    try:
        out = _write(ctx, source, number, clip, mode)
    except (ClipMismatch, JoinFailed) as exc:
        if mode == "reencode":
            raise UnreadableMedia(f"clip {number} ({clip.start:.3f}-{clip.end:.3f} s) fails its check: {exc}") from exc
        # A cut that joined badly (an odd camera stream) is made again the slow, sure way, and says why.
        out = _write(ctx, source, number, clip, "reencode", reason=f"the {choose_cut(clip.start, source)[0]} "
                     f"cut failed its check: {exc}")  # fmt: skip
    ctx.progress(number / total, stage=f"clip {number}/{total}", media_seconds=clip.end)
    return out


def _write(ctx: EngineContext, source: Source, number: int, clip: Clip, mode: Mode, reason: str = "") -> ClipOut:
    method, _ = choose_cut(clip.start, source, mode)
    name = f"{CLIPS}/clip_{number:04d}{clip_suffix(method, source.path)}"
    with ctx.artifacts.writing(name) as temp:
        made = cut_clip(source, clip.start, clip.end, temp, mode)
        # Decoded again, and its frames compared with the source's, before it counts.
        checked = verify_clip(made.path, source, made.start, made.end, made.method)
    return ClipOut(file=name, start=round(made.start, 3), end=round(made.end, 3), reasons=list(clip.reasons),
                   method=made.method, reason=reason or made.reason, reencoded=made.reencoded,
                   frames=checked.frames)  # fmt: skip


def _stage(envelope: dict[str, Any], output: VadResult | YoloResult) -> StageOut:
    flags = [name for name in ("vad_skipped", "no_audio", "motion_only") if getattr(output, name, False)]
    if isinstance(output, YoloResult) and not output.motion_only and output.spans(MOTION_CLASS):
        flags.append("motion_part")  # resumed on the motion rung: motion clips after the join
    rung = envelope.get("rung", "")
    return StageOut(job_id=envelope["job_id"], rung=rung, variant=rung, flags=flags,
                    attempts=list(envelope.get("attempts") or []))  # fmt: skip
