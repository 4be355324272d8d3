"""The subtitle-render family: a finished subtitle job's words, cued again by other rules.

A subtitle job records the words it heard, with their times, and the cue rules it applied, in its
``subtitles.json``; changing the line width or the cue length needs no recogniser, only this
cheap job (milliseconds of CPU): ``farm submit subtitle-render JOB_ID -p rules='{"max_line_chars": 32}'``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from mediafarm.tasks.families.subtitle.records import CueRules
from mediafarm.tasks.families.subtitle.spec import WRITING, TimingReport
from mediafarm.tasks.kit import CommaList, EngineSpec, FamilySpec, NoParams, Request, TimeLimits, rung


class RenderRequest(Request):
    """Attributes: source (the id of a finished subtitle job), rules (the new cue rules),
    formats (which files to write)."""

    source: str = Field(min_length=1, max_length=200)
    rules: CueRules = Field(default_factory=CueRules)
    formats: Annotated[list[Literal["vtt", "srt"]], CommaList] = Field(
        default_factory=lambda: ["vtt", "srt"], min_length=1
    )


class RenderResult(BaseModel):
    """Attributes: source, cues (written), rules (applied), timing (the same checks as the
    subtitle job's), files (format → artifact name)."""

    model_config = ConfigDict(frozen=True)

    source: str
    cues: int
    rules: CueRules
    timing: TimingReport
    files: dict[str, str]


def summary(result: RenderResult) -> str:
    return (f"{result.cues} cues from job {result.source}, lines <= {result.rules.max_line_chars} chars, "
            f"<= {result.rules.max_cue_seconds:g} s; {len(result.timing.rule_violations)} rule violations")  # fmt: skip


FAMILY = FamilySpec(
    name="subtitle-render",
    task_name="farm.subtitle.render",
    description="Cue a finished subtitle job's words again with other rules (no recognition)",
    request=RenderRequest,
    result=RenderResult,
    engines={
        "render": EngineSpec(
            "mediafarm.tasks.families.subtitle_render.engines:render", NoParams, needs=WRITING, extra="subtitle"
        )
    },
    ladder=(rung("render", "render"),),
    limits=TimeLimits(soft=300, hard=330, stall=320),
    cli_argument="source",
    summary=summary,
)
