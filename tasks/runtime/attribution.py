"""Whose doing a failed attempt was: the one table that says which failures count against a rung.

A rung's breaker (``tasks.runtime.breaker``) opens on failures of that rung; a failure the rung did not
cause must not open it, or random kills from outside send every new job past the rungs that work
(found by an operator's chaos drill: 5 % outside kills opened the VAD breaker, and 40 % of the
good jobs ended on ``skip``). Each failed attempt is judged where its outcome is decided, with the
evidence at hand there, and its record says how (``Attempt.counted``, ``Attempt.cause``)::

    cause              outcome      counts  the evidence
    watchdog_cap       killed       yes     the farm's watchdog killed the child over the pool's RSS cap (kill record)
    hard_time_limit    timeout      yes     the farm's watchdog killed the child past the family's hard time limit
    kernel_oom         oom          yes     SIGKILLed with no watchdog record while the child's memory cgroup (or
                                            the kernel) counted an OOM kill (``tasks.runtime.oom_killer``)
    out_of_memory      oom          yes     the engine raised MemoryError or an allocator's out-of-memory error
    cuda_oom           cuda_oom     yes     the engine ran out of GPU memory
    time_limit         timeout      yes     the soft time limit fired inside the engine
    resource           any          yes     the engine raised ResourceFailure itself (its own judgement)
    stalled_again      stalled      yes     the watchdog killed it silent past the stall timeout, the second time on this
                                            rung for this job (``tasks.runtime.downgrade.repeated_stall``)
    stalled            stalled      no      the same, the first time: a child's bad luck (a lock, a hung read); the rung
                                            runs again
    outside_kill       killed       no      SIGKILLed, no watchdog record, and no OOM kill counted while it ran
    unknown_kill       killed       no      SIGKILLed, no watchdog record, no OOM-kill count to compare
    worker_died        killed       no      its worker died under it more often than the same-rung budget allows
    worker_lost        worker_lost  no      its worker died (or was paused past the handback grace or the visibility
                                            timeout, or lost its broker) while it ran: the job runs again on the same rung
    drained            worker_lost  no      its worker was drained (``farm drain``, SIGTERM) past the deadline: handed back
                                            (the drain's record, ``workers.drain``), the same rung runs again; not counted
                                            among the job's lost workers either
    settled_elsewhere  any          no      its process was paused or cut off while the job went on elsewhere: a limit
                                            that fired as it woke measured the pause, not the rung
    rerouted           rerouted     no      it reached a worker that can run none of its rungs left, and went back to be
                                            routed to one that can (``tasks.runtime.reroute``): nothing ran

A memory-pressure reading and an open breaker are no failures at all: the rung is skipped with no
attempt spent (``skipped``) and nothing is judged. A record without ``counted`` (written before this
table) is judged from its outcome and reason: a resource outcome counts unless its reason names an
outside or undecided kill or a dead worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from mediafarm.tasks.runtime.oom_killer import OUTSIDE_KILL, UNDECIDED
from mediafarm.tasks.wire.records import RESOURCE_OUTCOMES, Attempt, KillRecord, Outcome


@dataclass(frozen=True)
class Cause:
    """One row of the table. Attributes: name (as records keep it), counts (against the rung's
    breaker), words (why, for an operator)."""

    name: str
    counts: bool
    words: str


CAUSES = {
    c.name: c
    for c in (
        Cause("watchdog_cap", True, "the farm's watchdog killed it over the pool's RSS cap"),
        Cause("hard_time_limit", True, "the farm's watchdog killed it past the hard time limit"),
        Cause("kernel_oom", True, "the kernel OOM killer took it (an OOM kill counted while it ran)"),
        Cause("out_of_memory", True, "the engine ran out of memory (MemoryError)"),
        Cause("cuda_oom", True, "the engine ran out of GPU memory"),
        Cause("time_limit", True, "the soft time limit fired in the engine"),
        Cause("resource", True, "the engine reported a resource failure"),
        Cause("stalled_again", True, "silent past the stall timeout a second time on this rung"),
        Cause("stalled", False, "silent past the stall timeout once: the rung runs again, not counted"),
        Cause("outside_kill", False, "SIGKILLed from outside the farm: not the rung's doing"),
        Cause("unknown_kill", False, "SIGKILLed, cause unknown (no watchdog record, no OOM-kill count): not counted"),
        Cause("worker_died", False, "its worker died under it, repeatedly: not the rung's doing"),
        Cause("worker_lost", False, "its worker died, paused or lost its broker: not the rung's doing"),
        Cause("drained", False, "its worker was drained and the deadline passed: handed back, not the rung's doing"),
        Cause("settled_elsewhere", False, "its worker was paused or cut off while the job went on elsewhere"),
        Cause("rerouted", False, "it reached a worker that cannot run it and was sent back: nothing ran"),
        Cause("moved", False, "its next rung is another pool's, and it was sent to that pool's queue: nothing ran"),
    )
}

_RAISED = {Outcome.OOM: "out_of_memory", Outcome.CUDA_OOM: "cuda_oom", Outcome.TIMEOUT: "time_limit"}
# Outcomes of the records the worker's main process writes before it ends a child: the watchdog's,
# and the drain's handback (``workers.drain``), which alone writes ``worker_lost``.
_WATCHDOG = {Outcome.KILLED: "watchdog_cap", Outcome.TIMEOUT: "hard_time_limit", Outcome.WORKER_LOST: "drained"}


def judge(attempt: Attempt, cause: str) -> None:
    """Record on ``attempt`` whether its failure counts against its rung, by the table's ``cause``."""
    attempt.cause, attempt.counted = cause, CAUSES[cause].counts


def raised(outcome: Outcome) -> str:
    """The cause of a ResourceFailure the engine raised (mapped at ``errors.map_exceptions``)."""
    return _RAISED.get(outcome, "resource")


def killed_by_watchdog(kill: KillRecord) -> str | None:
    """The cause of a kill the farm recorded (its watchdog, or a drain handing the job back); None for
    a kill it made for another reason (not one of the table's: the caller judges it)."""
    return _WATCHDOG.get(kill.outcome)


def lost_child(outcome: Outcome, reason: str) -> str:
    """The cause of a child SIGKILLed without a watchdog record, from ``tasks.runtime.oom_killer.lost_child_cause``."""
    if outcome == Outcome.OOM:
        return "kernel_oom"
    return "outside_kill" if reason.startswith(OUTSIDE_KILL) else "unknown_kill"


def counts(attempt: Attempt) -> bool:
    """Does this ended attempt count against its rung's breaker?"""
    if attempt.counted is not None:
        return attempt.counted
    if attempt.outcome not in RESOURCE_OUTCOMES:
        return False
    # A record from before the table: its reason says what the settler knew.
    return not attempt.reason.startswith((OUTSIDE_KILL, UNDECIDED)) and "its worker died" not in attempt.reason


def words(attempt: Attempt) -> str:
    """Whether and why the attempt counted, in a few words ('' for one with nothing to judge)."""
    cause = CAUSES.get(attempt.cause)
    if attempt.counted is None or cause is None:
        return ""
    return f"{'counted' if attempt.counted else 'not counted'} against the rung: {cause.words}"
