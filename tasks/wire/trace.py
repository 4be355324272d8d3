"""A job's trace: where the farm's own time goes, step by step, and the Redis round trips of each step.

Both sides keep one. The producer's (``submit``) marks validation, routing, admission, the
idempotency key and the send; the worker's child marks its start, its bookkeeping before the
engine, the engine's start and end, and the attempt's record; the envelope carries the worker's
trace (``Envelope.trace``), so a producer that timed its own side has the whole job. A step's
round trips are those its own thread made on the farm's Redis client (:func:`counting_connection`,
which the result backend's pool uses), a new connection's handshake among them; the broker's
publish and the worker's fetch go through kombu's connections and are not counted here (a bench
counts every command server-side).

Times are wall-clock (``time.time``): the worker's first step is measured from the moment the
producer sent the message (its ``SENT_HEADER``), which on two hosts includes their clock skew.

Cheap enough to leave on: a mark is a clock read, a thread-local read and a list append (about
a microsecond); the envelope grows by a few hundred bytes.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

# The message header in which a producer says when it sent the job (epoch seconds, a float).
SENT_HEADER = "farm_sent"

_counts = threading.local()


def round_trips() -> int:
    """Round trips this thread has made to the farm's Redis so far (its commands and pipelines)."""
    return getattr(_counts, "n", 0)


def _counted(base: type) -> type:
    """``base`` (a redis-py connection class), counting each packed send as one round trip."""

    class Counted(base):  # type: ignore[misc, valid-type]
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            # One call per command, and one per pipeline or transaction however many it holds.
            _counts.n = getattr(_counts, "n", 0) + 1
            super().send_packed_command(command, check_health)

    Counted.__name__ = Counted.__qualname__ = f"Counted{base.__name__}"
    return Counted


_counting_classes: dict[type, type] = {}


def counting_connection(base: type) -> type:
    """The counting subclass of ``base`` (one per base, so pools compare their classes equal)."""
    if base not in _counting_classes:
        _counting_classes[base] = _counted(base)
    return _counting_classes[base]


@dataclass
class Trace:
    """Marks of one side of a job: ``(step, seconds since t0, round trips since the last mark)``.

    ``t0`` is when the side's first span began: the send for the worker's trace (when the producer
    said), the call for the producer's.
    """

    t0: float = field(default_factory=time.time)
    steps: list[tuple[str, float, int]] = field(default_factory=list)
    _trips: int = field(default_factory=round_trips, repr=False, compare=False)

    def mark(self, step: str) -> None:
        """The step named ``step`` ends now."""
        trips = round_trips()
        self.steps.append((step, time.time() - self.t0, trips - self._trips))
        self._trips = trips

    def spans(self) -> Iterator[tuple[str, float, int]]:
        """Each step with its own duration in seconds (from the mark before it, or t0) and round trips."""
        before = 0.0
        for step, at, trips in self.steps:
            yield step, at - before, trips
            before = at

    def to_json(self) -> dict[str, Any]:
        return {"t0": self.t0, "steps": [[s, round(at * 1000, 3), n] for s, at, n in self.steps]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Trace:
        """The trace a ``to_json`` wrote (times in ms there, seconds here)."""
        steps = [(str(s), float(ms) / 1000, int(n)) for s, ms, n in data.get("steps", [])]
        return cls(t0=float(data["t0"]), steps=steps, _trips=0)


# The worker child's trace of the job it runs now (one job a child at a time).
_current: ContextVar[Trace | None] = ContextVar("mediafarm_trace", default=None)


def begin(sent: Any = None) -> Trace:
    """Start this child's trace of a job from ``sent`` (the message's ``SENT_HEADER``), or from
    now where it has none or not a time; its first mark is ``child``: the job reached its child."""
    now = time.time()
    try:
        t0 = float(sent) if isinstance(sent, (int, float)) and not isinstance(sent, bool) else now
    except OverflowError:  # an integer too large for a float: no time a producer stamps
        t0 = now
    if not (math.isfinite(t0) and 0 < t0 <= now + 3600):  # a clock an hour ahead is skew; past that, not a time
        t0 = now
    trace = Trace(t0=t0)
    trace.mark("child")
    _current.set(trace)
    return trace


def mark(step: str) -> None:
    """Mark ``step`` in the running job's trace; nothing outside a job."""
    trace = _current.get()
    if trace is not None:
        trace.mark(step)


def end() -> Trace | None:
    """The running job's trace, which ends here; None outside a job."""
    trace = _current.get()
    _current.set(None)
    return trace
