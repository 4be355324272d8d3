"""The camera filter: keep only the spans of a recording where someone is heard or seen.

``submit("camfilter", media=...)`` (or ``farm submit camfilter VIDEO``) sends a pipeline
(``tasks.wire.plan``): a VAD job and a YOLO job on the same video, in parallel, each its own farm
job with its own ladder and history (``<id>.vad``, ``<id>.yolo``), then, once both have ended, the
cut ``farm.camfilter.cut`` under the pipeline's own id: it merges the speech and detection spans
into clips (``plan``) and cuts them into its artifact folder (``cut``). A VAD killed on every
rung ends on its ``skip`` rung and the clips come from YOLO alone; a video without an audio track
is answered ``no_audio`` by the VAD stage; a YOLO that ends on ``motion`` gives motion clips. The
result says which, with every stage's attempts: the story's hand-run ``--skip-vad`` retry,
automatic and recorded.

Imported by every farm process, producers included: nothing heavy here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from rich.table import Table

from mediafarm.tasks.families.camfilter.plan import ClipRules
from mediafarm.tasks.kit import (
    CommaList,
    EngineSpec,
    FamilySpec,
    MediaPath,
    Params,
    Part,
    Plan,
    Request,
    TimeLimits,
    rung,
    rung_named,
)

ENGINES = "mediafarm.tasks.families.camfilter.engines"
ClassName = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class CamfilterRequest(Request):
    """Attributes: media (the recording, inside FARM_MEDIA_ROOTS), classes (what the YOLO stage
    looks for; default ``person``), rules (how spans become clips: ``plan.ClipRules``), stride
    (the YOLO stage's seconds between frames; default its rung's), vad_ladder / yolo_ladder
    (declared ladders for the two stages; default their families')."""

    media: MediaPath
    classes: Annotated[list[ClassName], CommaList] = Field(default_factory=lambda: ["person"], min_length=1)
    rules: ClipRules = Field(default_factory=ClipRules)
    stride: float | None = Field(None, gt=0, le=60)
    vad_ladder: str | None = None
    yolo_ladder: str | None = None

    def as_pipeline(self, job_id: str) -> Plan:
        """VAD ∥ YOLO on the media, then the cut under ``job_id`` (which reads both by id)."""
        media = str(self.media)
        vad: dict[str, Any] = {"media": media, "if_no_audio": "empty"}
        yolo: dict[str, Any] = {"media": media, "classes": list(self.classes)}
        if self.vad_ladder:
            vad["ladder"] = self.vad_ladder
        if self.yolo_ladder:
            yolo["ladder"] = self.yolo_ladder
        if self.stride:
            yolo["stride"] = self.stride
        own = self.model_dump(mode="json", exclude_unset=True)
        return Plan(
            parts=(Part("vad", stage_job_id(job_id, "vad"), vad, label="VAD"),
                   Part("yolo", stage_job_id(job_id, "yolo"), yolo, label="YOLO")),
            then=Part("camfilter", job_id, own, label="clips"),
            parts_stage="detect", then_stage="cut",
        )  # fmt: skip


def stage_job_id(job_id: str, stage: str) -> str:
    """The id of a pipeline's stage job: derived, so a resubmitted pipeline finds its stages."""
    return f"{job_id}.{stage}"


class ClipOut(BaseModel):
    """A clip written. Attributes: file (artifact name), start, end (seconds of the source it
    holds: ``start`` is its first frame, the first at or after the planned start, or the keyframe
    on it), reasons (``speech``, a class name, or ``motion`` when YOLO ended on its motion rung),
    method (``copy``, ``smart``, ``editlist`` or ``reencode``: ``cut``), reason (why not a cheaper
    method; empty when nothing stood in the way), reencoded (seconds of it encoded again), frames
    (decoded again after writing, their times checked against the source's)."""

    model_config = ConfigDict(frozen=True)

    file: str
    start: float
    end: float
    reasons: list[str]
    method: str
    frames: int
    reason: str = ""
    reencoded: float = 0.0


class StageOut(BaseModel):
    """One stage of the pipeline as the cut saw it. Attributes: job_id, rung (the name of the rung
    that answered), flags (``vad_skipped``, ``no_audio``, ``motion_only`` as the stage reported
    them; ``motion_part``: a YOLO job that resumed on its motion rung, motion spans after the
    join), attempts (its whole history); variant: the rung's name again, as the release before
    called it (written for one release)."""

    job_id: str
    rung: str
    flags: list[str] = Field(default_factory=list)
    attempts: list[dict[str, Any]] = Field(default_factory=list)
    variant: str = ""

    _from_release_before = model_validator(mode="before")(rung_named)


class CamfilterResult(BaseModel):
    """Attributes: clips (in order), duration (of the source, seconds), kept (seconds in clips),
    speech_spans, detection_spans (how many each stage found), stages (``vad``, ``yolo``)."""

    clips: list[ClipOut] = Field(default_factory=list)
    duration: float = 0.0
    kept: float = 0.0
    speech_spans: int = 0
    detection_spans: int = 0
    stages: dict[str, StageOut] = Field(default_factory=dict)


class CutParams(Params):
    """Attributes: mode (``auto``: each clip copied, smart-cut or edit-listed where its codec and
    container allow, re-encoded otherwise; ``reencode``: every clip re-encoded, H.264 + AAC)."""

    mode: Literal["auto", "reencode"] = "auto"


def summary(result: CamfilterResult) -> str:
    flags = sorted({f for stage in result.stages.values() for f in stage.flags})
    note = f"  [yellow]({', '.join(flags)})[/]" if flags else ""
    return (f"{len(result.clips)} clips, {result.kept:.1f} s kept of {result.duration:.1f} s  "
            f"({result.speech_spans} speech, {result.detection_spans} detection spans){note}")  # fmt: skip


def render(result: CamfilterResult) -> Table | str:
    if not result.clips:
        return "nothing seen or heard: no clips"
    table = Table("#", "start (s)", "end (s)", "why", "file", "cut")
    for i, clip in enumerate(result.clips, 1):
        how = f"{clip.method} ({clip.reencoded:.1f} s re-encoded)" if clip.method == "smart" else clip.method
        table.add_row(str(i), f"{clip.start:.2f}", f"{clip.end:.2f}", "+".join(clip.reasons), clip.file, how)
    return table


FAMILY = FamilySpec(
    name="camfilter",
    task_name="farm.camfilter.cut",
    description="Clips of a recording where someone is heard or seen (VAD ∥ YOLO, then cut)",
    request=CamfilterRequest,
    result=CamfilterResult,
    engines={"cut": EngineSpec(f"{ENGINES}:cut", CutParams, needs=("av",), extra="media")},
    ladder=(
        rung("smart", "cut", mode="auto"),
        # A cut killed or out of memory mid-copy tries again re-encoding every clip.
        rung("reencode", "cut", mode="reencode"),
    ),
    # Cutting streams packets, and decodes only a clip's first GOP (a smart cut) or its own frames
    # (a re-encode).
    limits=TimeLimits(soft=3600, hard=3700, stall=600),
    cli_argument="media",
    summary=summary,
    render=render,
)
