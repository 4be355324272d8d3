"""The downgrade policy, in one place: which rung a job runs on, and what each failure does.

    resource failure (killed, oom, cuda_oom, timeout) → next rung, same job id
    stalled (silent past the stall timeout)           → same rung once; a second stall there → next rung
    rung unavailable on this pool                     → next rung, no attempt spent
    next rung is another pool's best, or not here     → moved to that pool's queue, no attempt spent (``routing``)
    no rung left runs on this worker at all           → sent back to be routed again, bounded (``runtime.reroute``)
    rung's breaker open, or memory pressure (new job) → next rung, no attempt spent (``runtime.breaker``)
    permanent failure (bad input)                     → FAILURE now, no retry
    cancelled by the producer                         → REVOKED now, no retry
    redelivered after a terminal outcome was recorded → that outcome again, nothing run, nothing appended
    transient failure / worker died under the job     → same rung, at most FARM_TRANSIENT_RETRIES times
    Redis error in the bookkeeping, outcome unwritten → same rung, bounded by Celery's max_retries
    anything else (a bug)                             → FAILURE now, no retry
    no rung left                                      → FAILURE, with the whole history

A job's rung is derived from its history, not from Celery's retry count, because a redelivery
after a whole-worker crash does not count as a retry but a same-rung transient retry does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mediafarm.config.ladders import Ladder, Rung
from mediafarm.tasks.producer.routing import Route
from mediafarm.tasks.runtime import attribution
from mediafarm.tasks.runtime.ladder_choice import answers_below, fallbacks, next_rung, owed_note
from mediafarm.tasks.runtime.oom_killer import lost_child_cause, snapshot
from mediafarm.tasks.runtime.reroute import Reroute, moved_attempt, rerouted_attempt
from mediafarm.tasks.runtime.rung_policies import Availability, RungPolicy, RungStep, Skip, decide
from mediafarm.tasks.wire import trace
from mediafarm.tasks.wire.errors import (
    Cancelled,
    EngineError,
    FarmError,
    NoRungLeft,
    PermanentFailure,
    ResourceFailure,
    RungUnavailable,
    StaleAttempt,
    TransientFailure,
    map_exceptions,
)
from mediafarm.tasks.wire.family import EngineSpec
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.records import ArtifactInfo, Attempt, Envelope, KillRecord, Outcome


def settle_open_attempts(
    attempts: list[Attempt],
    kill: KillRecord | None,
    retries: int,
    transient_budget: int,
    unwritten: Mapping[int, str] | None = None,
) -> list[int]:
    """Give an outcome to attempts that never finished; returns the indexes it changed.

    Evidence, strongest first: the word of the attempt's own delivery that it retried the job
    itself on a Redis error (``unwritten``: Celery retry count → the error), so the outcome it
    could not write is a transient failure; the watchdog's kill record for that child; Celery's
    retry count having moved on (otherwise it retries only a task whose child was lost; the
    kernel's OOM-kill counts then tell its OOM killer from an outside kill, ``tasks.runtime.oom_killer``);
    otherwise the message was redelivered because the worker itself died, which is not the job's
    fault, until it happens more than ``transient_budget`` times.
    """
    unwritten = unwritten or {}
    changed = []
    for i, att in enumerate(attempts):
        if att.outcome is not None:
            continue
        if att.retries in unwritten:
            # Its child was not lost: it sent the retry itself, Redis refusing the outcome's write.
            att.outcome = Outcome.TRANSIENT
            att.reason = f"{unwritten[att.retries]} as it ended; its outcome was not written, the same rung runs again"
        elif kill is not None and kill.is_about(att):
            att.outcome, att.reason = kill.outcome, kill.reason
            att.peak_rss_mb = kill.rss_mb
            att.duration = round(kill.at - att.started, 3)
            if att.outcome == Outcome.STALLED:
                attribution.judge(att, "stalled_again" if repeated_stall(attempts, i) else "stalled")
            elif (cause := attribution.killed_by_watchdog(kill)) is not None:
                attribution.judge(att, cause)
        elif retries > att.retries:
            # The kernel's OOM killer or an outside kill: told apart by the OOM-kill counts.
            att.outcome, att.reason = lost_child_cause(att.oom_counts)
            attribution.judge(att, attribution.lost_child(att.outcome, att.reason))
        else:
            # A drained attempt was handed back on purpose: no sign of a worker that keeps dying.
            lost_before = sum(1 for a in attempts[:i] if a.outcome == Outcome.WORKER_LOST and a.cause != "drained")
            if lost_before >= transient_budget:
                att.outcome = Outcome.KILLED
                att.reason = f"its worker died {lost_before + 1} times while running this job"
                attribution.judge(att, "worker_died")
            else:
                att.outcome, att.reason = Outcome.WORKER_LOST, "the worker process died; job redelivered"
                attribution.judge(att, "worker_lost")
        changed.append(i)
    return changed


# Outcomes that end a job for good: a redelivered message after one of them runs nothing.
TERMINAL_OUTCOMES = frozenset({Outcome.REJECTED, Outcome.CANCELLED, Outcome.ERROR})


def recorded_end(attempt: Attempt) -> FarmError:
    """The failure a job ends with when its newest attempt already recorded a terminal outcome."""
    reason = f"{attempt.reason} (recorded by attempt {attempt.rung} before its message came back)"
    end: FarmError
    if attempt.outcome == Outcome.REJECTED:
        end = PermanentFailure(reason)
    elif attempt.outcome == Outcome.CANCELLED:
        end = Cancelled(reason)
    else:
        end = EngineError(f"{attempt.rung}: {reason}")
    end.rung = attempt.rung
    return end


def current_rung(attempts: list[Attempt]) -> int:
    """Rungs already lost to resource failures, repeated stalls, or skipped as unavailable (each
    rung once: a rung skipped by choice and tried again before the end, ``tasks.runtime.ladder_choice``,
    is still one)."""
    passed = {a.rung_index for a in attempts if a.outcome is not None and a.outcome.moves_down}
    return len(passed | {a.rung_index for i, a in enumerate(attempts) if repeated_stall(attempts, i)})


def repeated_stall(attempts: list[Attempt], index: int) -> bool:
    """Is attempt ``index`` a stall of a rung that already stalled once for this job? A first stall
    may be the child's bad luck (a lock, a hung read): the rung runs again, nothing counted. A second
    is the rung's: the job moves down and the rung's breaker counts it."""
    attempt = attempts[index]
    if attempt.outcome != Outcome.STALLED:
        return False
    return sum(1 for a in attempts[:index] if a.outcome == Outcome.STALLED and a.rung_index == attempt.rung_index) == 1


def same_rung_retries(attempts: list[Attempt]) -> int:
    return sum(1 for a in attempts if a.outcome == Outcome.TRANSIENT)


@dataclass(frozen=True)
class RetryRequest:
    """The job must run again (on the next rung, or the same one); raised through Celery's retry.
    ``queue``: where the retry goes; None: the queue this delivery came from."""

    reason: str
    exc: Exception
    queue: str | None = None


def _peak_rss_reset() -> None:
    # Linux >= 4.0: writing 5 resets VmHWM, so the next read is this attempt's peak alone.
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _peak_rss_mb() -> float | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


class _Running:
    """One attempt from its start record to its outcome."""

    def __init__(self, log: AttemptLog, attempt: Attempt, result_key: str, stale_after: float) -> None:
        self.log, self.attempt, self.result_key, self.stale_after = log, attempt, result_key, stale_after
        self.pending = log.append_behind(attempt, result_key)
        _peak_rss_reset()
        self.t0 = time.monotonic()

    def finish(self, outcome: Outcome, reason: str = "") -> None:
        attempt = self.attempt
        attempt.outcome, attempt.reason = outcome, reason
        attempt.duration = round(time.monotonic() - self.t0, 3)
        attempt.peak_rss_mb = _peak_rss_mb()
        if self.pending.succeeded_before():  # whatever this attempt's outcome: it has no record
            raise StaleAttempt(f"job already succeeded elsewhere before pid {attempt.pid} began it; writing nothing")
        if outcome == Outcome.OK and time.time() - attempt.started < self.stale_after:
            # Completed in the envelope; the record's reply is read only to free the connection,
            # and a Redis error here must not throw away a finished result. No other worker can
            # hold this job yet: Redis hands an unacked job to another only after the visibility
            # timeout, so the check below is needed (and paid for) only by attempts that long.
            self.pending.settle_quietly()
        elif not self.log.finish(self.pending.index(), attempt, self.result_key):
            raise StaleAttempt(
                f"attempt {attempt.rung} of pid {attempt.pid} was settled elsewhere (this process was paused "
                "or cut off while the job went on); writing nothing"
            )


def _told(running: _Running, policies: Sequence[RungPolicy], note: str) -> Callable[..., None]:
    """``running.finish`` that also adds ``note`` to the reason and tells the policies the outcome."""

    def finish(outcome: Outcome, reason: str = "") -> None:
        try:
            running.finish(outcome, f"{reason}; {note}" if reason and note else reason or note)
        except StaleAttempt:
            if running.attempt.counted:  # its time or memory ran across a pause: not the rung's doing
                attribution.judge(running.attempt, "settled_elsewhere")
            raise
        finally:  # written or not (StaleAttempt, a Redis error), the rung ran: a probe must end
            for policy in policies:
                policy.after(running.attempt)

    return finish


# What the family adapter does for one rung: given the rung, its index in the ladder and the index
# of the attempt in the history, run the engine and return the output (JSON) and the artifacts.
RunRung = Callable[[Rung, int, int], tuple[dict[str, Any], tuple[ArtifactInfo, ...]]]


@dataclass(frozen=True)
class LadderRun:
    """One delivery of a job, as :func:`run_ladder` needs it.

    Attributes:
        job_id: The job (Celery task id), the same on every rung.
        ladder: The ladder the job runs.
        engines: The family's engines, by the names its rungs use.
        log: The job's attempt history.
        retries: Celery's retry count of this delivery (``request.retries``).
        worker: The worker's node name, recorded in each attempt.
        transient_budget: Same-rung retries allowed (``FARM_TRANSIENT_RETRIES``).
        fresh: The first delivery of a job never retried, so it has no history to read. This
            saves the common path a Redis round trip.
        result_key: Where the job's SUCCESS is stored: every conditional write checks it.
        stale_after: Seconds after which a success is checked like any other outcome (half the
            visibility timeout; before it no other worker can have been handed the job).
        unwritten: Celery retry counts of earlier deliveries that retried the job themselves on a
            Redis error, each with that error (``FarmTask`` carries them in the retry's headers):
            such a delivery's attempt may still be open, its outcome unwritten, and it is settled
            as a transient failure (same rung), not as a lost child (next rung).
        policies: Asked in order before each rung, told each attempt's end (``tasks.runtime.rung_policies``):
            whether this pool can run the rung, its language, its breaker, the job's checkpoint.
            The default checks only that this pool can run the rung (weights not looked for).
        reroute: Asked, before anything runs, with the rung the job is at and its history: where to
            send a job back that no rung it has left can run on this worker (``tasks.runtime.reroute.sender``),
            None to run it here, or NoRungLeft. None: such a job's rungs are marked unavailable one
            by one, as ever.
        move: Asked, before anything runs, with the rung the job is at and its history: another
            pool's queue to send it to (``tasks.producer.routing.move``), or None to run it here. None: it
            runs here (a job routed to this pool at submit, on its first delivery).
        route: Why the job was sent to this pool's queue (``tasks.producer.routing.choose``), kept in its
            first attempt; empty if it was not routed.
        recorded: Told, as each attempt's record is sent, how to read the cancel flag as that
            record found it (``JobChannel.attempt_began``): the engine's first cancel check reads
            it there, not in a round trip of its own.
    """

    job_id: str
    ladder: Ladder
    engines: Mapping[str, EngineSpec]
    log: AttemptLog
    retries: int = 0
    worker: str = ""
    transient_budget: int = 2
    fresh: bool = False
    result_key: str = ""
    stale_after: float = 0.0
    unwritten: Mapping[int, str] = field(default_factory=dict)
    policies: Sequence[RungPolicy] = (Availability(),)
    reroute: Callable[[int, list[Attempt]], Reroute | None] | None = None
    move: Callable[[int, list[Attempt]], Route | None] | None = None
    route: str = ""
    recorded: Callable[[Callable[[], bool]], None] | None = None


def run_ladder(job: LadderRun, run_rung: RunRung) -> Envelope | RetryRequest:
    """Run the job on its current rung. Returns the result envelope, or a RetryRequest.

    A successful attempt is completed in the result envelope (a round trip saved): storing the
    SUCCESS makes the log the envelope's attempts in the same step (``tasks.result_backend``).

    Every outcome but a quick success is written conditionally (``AttemptLog.finish``): a process
    whose attempt was settled elsewhere, that is no longer the newest, or whose job already has a
    stored SUCCESS raises StaleAttempt and writes nothing.
    """
    log, ladder, retries, worker, result_key = job.log, job.ladder, job.retries, job.worker, job.result_key
    attempts: list[Attempt] = []
    if not job.fresh:
        attempts, kill = log.read()
        changed = settle_open_attempts(attempts, kill, retries, job.transient_budget, job.unwritten)
        settled = [log.settle(i, attempts[i], result_key) for i in changed]
        for i, written in zip(changed, settled, strict=True):
            if written:  # a killed child's rung failed: its breaker counts it (once: the settler's)
                for policy in job.policies:
                    policy.after(attempts[i])
        if not all(settled):  # an owner finished its attempt meanwhile: take the history as it is now
            attempts, _ = log.read()
        if kill is not None:
            log.clear_kill()  # used, or stale: either way it must not judge a later attempt
        if attempts and attempts[-1].outcome in TERMINAL_OUTCOMES:
            # The job's end is already recorded: its child was killed (or its worker lost)
            # after writing the outcome but before Celery stored it, and the message came back.
            # Running the same input on the same rung again would only repeat the outcome.
            raise recorded_end(attempts[-1])
    index = current_rung(attempts)
    first = not attempts  # the job's first record keeps why it was routed where it runs
    if job.move is not None and index < len(ladder.rungs) and (moved := job.move(index, attempts)) is not None:
        at = next((i for i, r in enumerate(ladder.rungs) if r.name == moved.rung and i >= index), index)
        attempts.append(moved_attempt(at, moved.rung, moved.reason, retries, worker))
        if first:
            attempts[-1].route = job.route
        if log.append(attempts[-1], result_key) < 0:
            raise StaleAttempt("job already succeeded elsewhere before this worker could move it")
        return RetryRequest(moved.reason, RungUnavailable(moved.reason), queue=moved.queue)
    if job.reroute is not None and (sent := job.reroute(index, attempts)) is not None:  # or NoRungLeft
        at = min(index, len(ladder.rungs) - 1)
        attempts.append(rerouted_attempt(at, ladder.rungs[at].name, sent.reason, retries, worker))
        if first:
            attempts[-1].route = job.route
        if log.append(attempts[-1], result_key) < 0:
            raise StaleAttempt("job already succeeded elsewhere before this worker could send it back")
        return RetryRequest(sent.reason, RungUnavailable(sent.reason), queue=sent.queue)
    fallback = fallbacks(ladder, job.engines)
    # index: rungs passed; at: the rung to run now, index itself or a rung skipped by choice
    # earlier that is owed one try before a fallback or the end (tasks.runtime.ladder_choice).
    while (at := next_rung(index, attempts, fallback)) is not None:
        rung, owed = ladder.rungs[at], at < index
        step = RungStep(rung, at, job.engines[rung.engine], attempts, owed, answers_below(at, fallback))
        decided = decide(job.policies, step)
        if isinstance(decided, Skip):
            attempts.append(Attempt(at, rung.name, decided.outcome, decided.reason, retries, worker=worker,
                                    route=job.route if not attempts else ""))  # fmt: skip
            if log.append(attempts[-1], result_key) < 0:
                raise StaleAttempt(f"job already succeeded elsewhere before this run reached rung {rung.name}")
            index += 0 if owed else 1
            continue
        note = "; ".join(n for n in (owed_note(attempts, at) if owed else "", decided.note) if n)
        attempt = Attempt(at, rung.name, retries=retries, worker=worker, oom_counts=snapshot(),
                          route=job.route if not attempts else "")  # fmt: skip
        for policy in job.policies:
            policy.starting(rung, attempt)
        running = _Running(log, attempt, result_key, job.stale_after)
        if job.recorded is not None:
            job.recorded(running.pending.cancelled)
        attempts.append(running.attempt)
        finish = _told(running, job.policies, note)
        trace.mark("attempt")  # the rung decided by the policies, its attempt's record sent
        try:
            with map_exceptions():
                output, artifacts = run_rung(rung, at, len(attempts) - 1)
        except ResourceFailure as exc:
            attribution.judge(running.attempt, attribution.raised(exc.outcome))
            finish(exc.outcome, str(exc))
            after = next_rung(index if owed else index + 1, attempts, fallback)
            if after is None:
                break
            return RetryRequest(f"{rung.name}: {exc.outcome}; next rung {ladder.rungs[after].name}", exc)
        except RungUnavailable as exc:
            finish(Outcome.UNAVAILABLE, str(exc))
            index += 0 if owed else 1
            continue
        except PermanentFailure as exc:
            finish(Outcome.REJECTED, f"{type(exc).__name__}: {exc}")
            exc.rung = rung.name
            raise
        except Cancelled as exc:
            finish(Outcome.CANCELLED, str(exc))
            exc.rung = rung.name
            raise
        except TransientFailure as exc:
            finish(Outcome.TRANSIENT, str(exc))
            if same_rung_retries(attempts) > job.transient_budget:
                raise
            return RetryRequest(f"{rung.name}: transient failure, same rung", exc)
        except Exception as exc:
            finish(Outcome.ERROR, f"{type(exc).__name__}: {exc}")
            # A bug or an unforeseen failure in the engine: no retry, but not "bad input" either.
            raise EngineError(f"{rung.name}: {type(exc).__name__}: {exc}") from exc
        if running.pending.cancelled():
            # Cancelled while queued (a revoke lives only in the memory of the workers that were
            # up) and run by an engine that never checks: the producer asked for it not to finish.
            reason = "cancelled by its producer before it ran; the output is discarded"
            finish(Outcome.CANCELLED, reason)
            cancelled = Cancelled(f"job {job.job_id} was {reason}")
            cancelled.rung = rung.name
            raise cancelled
        finish(Outcome.OK)
        trace.mark("recorded")  # the output checked, the attempt's end written or (quick) settled
        return Envelope(job.job_id, ladder.family, rung.name, at, output, tuple(attempts), artifacts)
    tried = ", ".join(f"{a.rung}={a.outcome}" for a in attempts)
    raise NoRungLeft(f"no rung of the {ladder.name} ladder is left to run ({tried})")
