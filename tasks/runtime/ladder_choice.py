"""Which rung a job runs next when some rungs are fallbacks and some were skipped by choice.

Two kinds of lower rung: a *cheaper answer* (webrtc below silero, espeak below Piper: a worse but
real result) and a *fallback* (VAD ``skip``, YOLO ``motion``: a stand-in that detects nothing;
``Rung.fallback``, ``EngineSpec.fallback``). The farm skips a rung by choice (``skipped``: its
breaker is open, or the pool is under memory pressure; ``tasks.runtime.breaker``) only to reach another
answer, never a stand-in:

    rung's breaker open, an answering rung below  → skip it (no attempt spent)
    rung's breaker open, only fallbacks below     → wait for its cool-down (bounded), then run it
    the job reaches a fallback, or its last rung  → first run, once each, the rungs it skipped by
      failed by resource                            choice (best first); then the fallback, or the end

So a good job ends on a fallback only when every answering rung above it failed for the job
itself (or cannot run on the pool: ``unavailable``), and no kill ends a job while a rung it
skipped could still run. ``tasks.runtime.downgrade.run_ladder`` asks :func:`next_rung` before each rung.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mediafarm.config.ladders import Ladder, Rung
from mediafarm.tasks.wire.family import EngineSpec
from mediafarm.tasks.wire.records import Attempt, Outcome

# Outcomes after which a skipped rung is still owed its one try: the try was cut short by no fault
# of the rung (the same rung runs again for those anyway).
_STILL_OWED = frozenset({Outcome.SKIPPED, Outcome.TRANSIENT, Outcome.WORKER_LOST, Outcome.REROUTED})


def is_fallback(rung: Rung, engines: Mapping[str, EngineSpec]) -> bool:
    """Does ``rung`` give only a stand-in? Its own declaration, else its engine's."""
    if rung.fallback is not None:
        return rung.fallback
    engine = engines.get(rung.engine)
    return bool(engine is not None and engine.fallback)


def fallbacks(ladder: Ladder, engines: Mapping[str, EngineSpec]) -> tuple[bool, ...]:
    """For each rung of ``ladder``: is it a fallback?"""
    return tuple(is_fallback(r, engines) for r in ladder.rungs)


def answers_below(index: int, fallback: Sequence[bool]) -> bool:
    """Is there a rung below ``index`` that gives a real answer (a place to skip to)?"""
    return not all(fallback[index + 1 :])


def owed(attempts: Sequence[Attempt], before: int) -> list[int]:
    """Rungs above ``before`` that the job skipped by choice and has not tried since, best first."""
    skipped = {a.rung_index for a in attempts if a.outcome == Outcome.SKIPPED and a.rung_index < before}
    tried = {a.rung_index for a in attempts if a.rung_index in skipped and a.outcome not in _STILL_OWED}
    return sorted(skipped - tried)


def next_rung(position: int, attempts: Sequence[Attempt], fallback: Sequence[bool]) -> int | None:
    """The rung to run now for a job at ``position`` (rungs passed, ``downgrade.current_rung``);
    None when nothing is left. An owed rung comes before a fallback and before the end."""
    if position < len(fallback) and not fallback[position]:
        return position
    back = owed(attempts, position)
    if back:
        return back[0]
    return position if position < len(fallback) else None


def owed_note(attempts: Sequence[Attempt], index: int) -> str:
    """What an attempt on an owed rung says beside its outcome."""
    why = next((a.reason for a in reversed(attempts) if a.rung_index == index and a.outcome == Outcome.SKIPPED), "")
    return f"tried once before a fallback or the end: it was skipped ({why}), and no rung after it answered"
