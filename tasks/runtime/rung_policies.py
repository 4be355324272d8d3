"""Rung policies: what :func:`tasks.runtime.downgrade.run_ladder` asks before each rung and tells after each attempt.

Each concern that may keep a rung from running, or that wants to hear how an attempt ended, is one
class with the hooks of :class:`RungPolicy` (dramatiq's middleware: a base of no-op hooks, one
class a concern, an explicit default list). ``run_ladder`` walks the rungs; the policies decide::

    before(step)              → Run(note) | Skip(reason, outcome): asked in list order before a rung;
                                the first Skip wins (later policies are not asked), its reason and
                                outcome recorded, no attempt spent; every Run's note goes on the attempt
    starting(rung, attempt)   → fill the attempt's record before it is written (what it resumes from)
    after(attempt)            → the attempt's outcome is written, by this delivery or settled from an
                                earlier one's evidence (a breaker counts it, a probe ends)

The farm's list (``tasks.runtime.base``): :class:`Availability` (this pool can run the rung: packages, GPU,
weights), :class:`Language` (the rung handles the job's language), :class:`Breaker` (the rung's
circuit breaker and the memory-pressure step-down, ``tasks.runtime.rung_guard``) and the job's checkpoint
(``tasks.runtime.base.Resuming``). Availability comes first: a rung that cannot run here is unavailable,
never skipped by a breaker. A delivery's routes (``move``, ``reroute``) decide where the whole job
goes before any rung, so they are not rung policies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mediafarm.config.ladders import Rung
from mediafarm.tasks.runtime.rung_guard import RungGuard
from mediafarm.tasks.wire.family import EngineSpec
from mediafarm.tasks.wire.records import Attempt, Outcome


@dataclass(frozen=True)
class RungStep:
    """The rung the ladder is about to run, as a policy sees it.

    Attributes:
        rung: The rung.
        index: Its index in the ladder.
        engine: The family's engine the rung runs.
        attempts: The job's history so far (read only).
        owed: The rung was skipped earlier by choice and is owed one try now, nothing else being
            left that answers (``tasks.runtime.ladder_choice``).
        answers_below: A rung below it gives a real answer (a place to skip to).
    """

    rung: Rung
    index: int
    engine: EngineSpec
    attempts: Sequence[Attempt]
    owed: bool
    answers_below: bool


@dataclass(frozen=True)
class Run:
    """Run the rung; ``note``: what the attempt says beside its outcome ('' for nothing)."""

    note: str = ""


@dataclass(frozen=True)
class Skip:
    """Do not run the rung: recorded with ``outcome`` and ``reason``, no attempt spent."""

    reason: str
    outcome: Outcome


Decision = Run | Skip
RUN = Run()


class RungPolicy:
    """One concern of the ladder's walk; every hook does nothing unless a policy overrides it."""

    def before(self, step: RungStep) -> Decision:
        return RUN

    def starting(self, rung: Rung, attempt: Attempt) -> None:
        return None

    def after(self, attempt: Attempt) -> None:
        return None


class Availability(RungPolicy):
    """A rung this pool cannot run at all (a package missing, no GPU, its weights absent from
    ``models_dir``; None: weights not checked) is unavailable: no attempt spent."""

    def __init__(self, models_dir: Path | None = None) -> None:
        self.models_dir = models_dir

    def before(self, step: RungStep) -> Decision:
        why_not = step.engine.unavailable(step.rung, self.models_dir)
        return Skip(why_not, Outcome.UNAVAILABLE) if why_not else RUN


class Language(RungPolicy):
    """A rung that cannot handle the job's language (``tasks.wire.languages.LanguageCheck.why_not``) is
    unavailable for this job: no attempt spent."""

    def __init__(self, why_not: Callable[[Rung], str | None]) -> None:
        self.why_not = why_not

    def before(self, step: RungStep) -> Decision:
        why_not = self.why_not(step.rung)
        return Skip(why_not, Outcome.UNAVAILABLE) if why_not else RUN


class Breaker(RungPolicy):
    """The rung's circuit breaker and the memory-pressure step-down (``tasks.runtime.rung_guard``): a rung
    skipped by it is ``skipped`` (by choice, owed a try later); each written outcome is counted
    against its rung by its cause (``tasks.runtime.attribution``)."""

    def __init__(self, guard: RungGuard) -> None:
        self.guard = guard

    def before(self, step: RungStep) -> Decision:
        if step.owed:  # run, whatever its breaker says: nothing else left answers
            self.guard.owed(step.index)
        elif skipped := self.guard.skip(step.index, step.attempts, step.answers_below):
            return Skip(skipped, Outcome.SKIPPED)
        return Run(self.guard.note(step.index))

    def after(self, attempt: Attempt) -> None:
        self.guard.ended(attempt)


def decide(policies: Sequence[RungPolicy], step: RungStep) -> Decision:
    """The first Skip of ``policies`` for ``step``, or a Run with the notes of all, in order."""
    notes = []
    for policy in policies:
        decision = policy.before(step)
        if isinstance(decision, Skip):
            return decision
        notes.append(decision.note)
    return Run("; ".join(n for n in notes if n))
