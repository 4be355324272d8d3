"""What one delivery of a job asks before it starts a rung, and tells after an attempt ends.

The rung's breaker (``tasks.runtime.breaker``: skip, probe, or run despite an open breaker when nothing
below answers, ``tasks.runtime.ladder_choice``) and the ladder's memory-pressure step-down
(``config.ladder_policy``), for ``tasks.runtime.downgrade.run_ladder``; and, as each attempt ends, its
count against the rung (``tasks.runtime.attribution``) and the pool's failure tally.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from mediafarm.config.ladder_policy import LadderPolicy
from mediafarm.config.ladders import Ladder
from mediafarm.tasks.runtime import attribution, failure_tally
from mediafarm.tasks.runtime.breaker import OPEN, PROBE, RUN, SKIP, Breakers, BreakerState
from mediafarm.tasks.wire.records import RESOURCE_OUTCOMES, Attempt, Outcome

log = logging.getLogger("mediafarm.breaker")

# A reading of the pool's memory pressure: None when there is none, else what it is in words.
PressureReading = Callable[[], str | None]


class RungGuard:
    """What one delivery of a job asks before it starts a rung, and tells after an attempt ends.

    Built per delivery (``tasks.runtime.base``) and handed to ``tasks.runtime.downgrade.run_ladder``. ``breakers``
    None: no breaker (Redis not the result backend, or tests of the ladder alone).
    """

    def __init__(
        self,
        ladder: Ladder,
        policy: LadderPolicy,
        job_id: str,
        breakers: Breakers | None,
        probe_s: float,
        pressure: PressureReading | None = None,
        max_wait_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.ladder, self.policy, self.job_id = ladder, policy, job_id
        self.name = ladder.identity
        self.breakers = breakers if policy.breaker.enabled else None
        self.probe_s = probe_s
        self.pressure = pressure if policy.step_down_under_pressure else None
        # The longest a job waits for an open breaker's cool-down when nothing below answers
        # (also at most the cool-down itself); ``tasks.runtime.base`` bounds it by the soft time limit.
        self.max_wait_s, self.sleep = max_wait_s, sleep
        self.probing: set[int] = set()
        self.notes: dict[int, str] = {}

    def skip(self, index: int, attempts: Sequence[Attempt], answers_below: bool | None = None) -> str | None:
        """Why the job must not run rung ``index`` now (it moves on, no attempt spent), or None.

        ``answers_below``: a rung below gives a real answer (``tasks.runtime.ladder_choice``); None: any
        rung below counts. Without one the rung is never skipped: an open breaker's cool-down is
        waited for (bounded), then the rung runs. May leave a note for the attempt (:meth:`note`):
        it is the breaker's probe, or it runs though its breaker is open."""
        if answers_below is None:
            answers_below = index < len(self.ladder) - 1
        if answers_below and self.pressure is not None and all(a.outcome == Outcome.UNAVAILABLE for a in attempts):
            # A new job (nothing run or skipped by choice yet): one rung lower, once.
            reading = self._pressure()
            if reading:
                return f"{reading}; the ladder steps down under pressure (a new job starts one rung lower)"
        verdict, state = self._decide(index)
        if verdict == SKIP and state is not None:
            if answers_below:
                return state.reason()
            self._run_despite(index, state, "no rung below it gives an answer")
        return None

    def owed(self, index: int) -> None:
        """Rung ``index``, skipped earlier by choice, runs now whatever its breaker says: the job has
        no other rung left that answers (``tasks.runtime.ladder_choice``). Waits for the cool-down as
        :meth:`skip` does; leaves a note if its breaker is still open."""
        verdict, state = self._decide(index)
        if verdict == SKIP and state is not None:
            self._run_despite(index, state, "the job has no other rung left that answers")

    def _decide(self, index: int) -> tuple[str, BreakerState | None]:
        """The breaker's verdict on rung ``index`` (RUN when there is no breaker or it is unreadable);
        notes a probe."""
        if self.breakers is None:
            return RUN, None
        rung = self.ladder.rungs[index].name
        try:
            verdict, state = self.breakers.decide(
                self.name, rung, self.job_id, self.probe_s, self.policy.breaker.refresh_s
            )
        except Exception as exc:  # noqa: BLE001 - a breaker must never fail or hold up a job
            log.warning("breaker of %s/%s unreadable (%s); the rung runs", self.name, rung, exc)
            return RUN, None
        if verdict == PROBE and state is not None:
            self.probing.add(index)
            self.notes[index] = f"the breaker's probe ({state.reason()})"
        return verdict, state

    def _run_despite(self, index: int, state: BreakerState, why: str) -> None:
        """The rung must run though its breaker is open: wait for the cool-down's end (bounded),
        ask again (the job may claim the probe), and note what happened."""
        assert self.breakers is not None
        wait = max(0.0, min(state.until - self.breakers.clock(), self.policy.breaker.cooldown_s, self.max_wait_s))
        if state.state == OPEN and wait > 0:
            self.sleep(wait)
            verdict, after = self._decide(index)
            waited = f"waited {wait:.1f} s for its cool-down"
            if verdict == PROBE:
                self.notes[index] = f"{self.notes[index]}; {waited}: {why}"
                return
            if verdict == RUN:
                self.notes[index] = f"{waited}, its breaker closed meanwhile: {why}"
                return
            state = after or state
            self.notes[index] = f"{state.reason()}; run anyway, {waited}: {why}"
            return
        self.notes[index] = f"{state.reason()}; run anyway: {why}"

    def _pressure(self) -> str | None:
        try:
            return self.pressure() if self.pressure is not None else None
        except Exception as exc:  # noqa: BLE001 - no reading: no step-down
            log.warning("memory-pressure reading failed (%s); the job starts on its usual rung", exc)
            return None

    def note(self, index: int) -> str:
        """What the attempt on rung ``index`` should say beside its outcome ('' for nothing)."""
        return self.notes.get(index, "")

    def ended(self, attempt: Attempt) -> None:
        """An attempt's outcome is written (by this delivery, or settled from an earlier one's
        evidence): count a failure the rung caused (``tasks.runtime.attribution``), end a probe."""
        if self.breakers is None or attempt.outcome is None:
            return
        rung = attempt.rung
        try:
            if attempt.counted is not None:
                failure_tally.add(self.breakers.client, self.breakers.pool, self.name, attempt)
            if attribution.counts(attempt):
                self.breakers.failed(self.name, rung, self.policy.breaker, attempt, self.job_id)
            elif attempt.outcome in RESOURCE_OUTCOMES:
                # Not the rung's doing (an outside kill): if it was this job's probe (claimed by
                # this delivery or, for a killed child, by the one before), the next job probes.
                self.breakers.probe_ended(self.name, rung, self.job_id, succeeded=False)
            elif attempt.rung_index in self.probing and attempt.outcome not in (
                Outcome.TRANSIENT, Outcome.WORKER_LOST, Outcome.STALLED
            ):
                # A transient failure or a first stall keeps the claim: the same job runs the rung again.
                self.breakers.probe_ended(self.name, rung, self.job_id, attempt.outcome == Outcome.OK)
        except Exception as exc:  # noqa: BLE001 - the count is lost, the job is not
            log.warning("breaker of %s/%s not updated (%s)", self.name, rung, exc)
