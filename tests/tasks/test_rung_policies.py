"""Rung policies (``tasks.runtime.rung_policies``) through ``run_ladder``: a new concern is one class."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from mediafarm.config.ladders import Ladder, Rung, rung
from mediafarm.tasks.runtime.base import Resuming
from mediafarm.tasks.runtime.downgrade import LadderRun, run_ladder
from mediafarm.tasks.runtime.rung_policies import (
    RUN,
    Availability,
    Breaker,
    Decision,
    Language,
    Run,
    RungPolicy,
    RungStep,
    Skip,
    decide,
)
from mediafarm.tasks.wire.family import EngineSpec
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.records import Attempt, Outcome

LADDER = Ladder("lad", "lad", (rung("big", "e"), rung("small", "e")))
ENGINES = {"e": EngineSpec("x:y")}


class NoBig(RungPolicy):
    """Skips the big rung; hears every outcome."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.heard: list[tuple[str, str | None]] = []

    def before(self, step: RungStep) -> Decision:
        self.asked.append(step.rung.name)
        return Skip("too big for today", Outcome.SKIPPED) if step.rung.name == "big" else RUN

    def after(self, attempt: Attempt) -> None:
        self.heard.append((attempt.rung, attempt.outcome))


class Noted(RungPolicy):
    """Runs every rung with a note, and stamps the attempt's record before it is written."""

    def __init__(self, note: str) -> None:
        self.note, self.asked = note, 0

    def before(self, step: RungStep) -> Decision:
        self.asked += 1
        return Run(self.note)

    def starting(self, rung_: Rung, attempt: Attempt) -> None:
        attempt.resumed_from = {"rung": rung_.name}


def test_a_policy_skips_a_rung_notes_the_one_that_runs_and_hears_its_outcome(log: AttemptLog) -> None:
    no_big, noted = NoBig(), Noted("a note")
    job = LadderRun(log.job_id, LADDER, ENGINES, log, worker="cpu@a", fresh=True,
                    policies=(Availability(), no_big, noted, Noted("")))  # fmt: skip
    envelope = run_ladder(job, lambda rung_, index, attempt: ({}, ()))
    assert envelope.rung == "small"
    attempts, _ = log.read()
    assert [(a.rung, a.outcome, a.reason) for a in attempts] == [
        ("big", Outcome.SKIPPED, "too big for today"), ("small", Outcome.OK, "a note")
    ]  # fmt: skip
    assert attempts[1].resumed_from == {"rung": "small"}
    # A skip ends the asking: the policies after it never heard of the big rung.
    assert no_big.asked == ["big", "small"] and noted.asked == 1
    assert no_big.heard == [("small", Outcome.OK)]


def test_the_first_skip_wins_and_the_notes_of_runs_are_joined_in_order() -> None:
    step = RungStep(LADDER.rungs[0], 0, ENGINES["e"], [], owed=False, answers_below=True)
    first = Skip("first", Outcome.UNAVAILABLE)

    class Says(RungPolicy):
        def __init__(self, decision: Decision) -> None:
            self.decision = decision

        def before(self, step: Any) -> Decision:
            return self.decision

    assert decide([Says(Run("a")), Says(first), Says(Skip("second", Outcome.SKIPPED))], step) is first
    assert decide([Says(Run("a")), Says(RUN), Says(Run("b"))], step) == Run("a; b")
    assert decide([], step) == RUN


@pytest.mark.parametrize("policy", [Availability, Language, Breaker, Resuming])
def test_the_farm_s_policies_keep_the_hooks_signatures(policy: type[RungPolicy]) -> None:
    # Found by the integration suite: Resuming's own ``ended()`` (the checkpoint removed for good)
    # once shared a name with the hook every attempt's end calls.
    for hook in ("before", "starting", "after"):
        ours, base = inspect.signature(getattr(policy, hook)), inspect.signature(getattr(RungPolicy, hook))
        assert list(ours.parameters) == list(base.parameters), f"{policy.__name__}.{hook}"
