"""A toy job family declared only here, to prove the seam: one spec, engines, nothing outside this folder.

``FARM_FAMILY_MODULES=tests.support.toy`` (tests/conftest.py) is all it takes for the farm to
route, run, downgrade and render it; no file of the farm names it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from rich.table import Table

from mediafarm.tasks.kit import EngineSpec, FamilySpec, Params, PermanentFailure, Request, TimeLimits, rung

ENGINES = "tests.support.toy.engines"


class ToyRejected(PermanentFailure):
    """The toy family's own bad-input failure (the producer never imports this module's engines)."""


class ToyRequest(Request):
    """Attributes: text (words to count), fail_after (the streaming engine runs out of memory after
    that many words), forbidden (a word the family rejects as bad input), write_pause (seconds
    between the two halves of words.txt), word_pause (seconds the streaming engine waits before each
    word after the first, checking for a cancel: a job that streams for as long as a test needs)."""

    text: str = Field(min_length=1, max_length=10_000)
    fail_after: int | None = Field(None, ge=0)
    write_pause: float = Field(0.0, ge=0, le=30)
    word_pause: float = Field(0.0, ge=0, le=5)


class ToyResult(BaseModel):
    """Attributes: words (counted), engine (which engine counted them)."""

    model_config = ConfigDict(frozen=True)

    words: list[str]
    engine: str


class CountParams(Params):
    upper: bool = False


def summary(result: ToyResult) -> str:
    return f"{len(result.words)} words by {result.engine}"


def render(result: ToyResult) -> Table:
    table = Table("#", "word")
    for i, word in enumerate(result.words, 1):
        table.add_row(str(i), word)
    return table


FAMILY = FamilySpec(
    name="toy",
    task_name="farm.toy.count",
    description="Test-only: counts words, streaming first, plain below",
    request=ToyRequest,
    result=ToyResult,
    engines={
        "stream": EngineSpec(f"{ENGINES}:stream_words", CountParams),
        "plain": EngineSpec(f"{ENGINES}:count_words", CountParams),
    },
    ladder=(rung("streaming", "stream", upper=True), rung("plain", "plain")),
    limits=TimeLimits(soft=60, hard=90),
    cli_argument="text",
    summary=summary,
    render=render,
    cli="tests.support.toy.commands:commands",
)
