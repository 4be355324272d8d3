"""The farm's one error tree, and the boundary that maps foreign exceptions into it.

::

    FarmError
    ├── ResourceFailure          the attempt ran out of something: move the job one rung down
    │     outcome = "oom" | "cuda_oom" | "timeout" | "killed"
    ├── RungUnavailable          this pool cannot run this rung (package, weights, GPU missing):
    │                            skip it without spending an attempt
    ├── PermanentFailure         bad input or invalid options: fail now, never retry, never downgrade
    │     ├── InvalidRequest     the job's fields do not fit its family's request schema (also a ValueError)
    │     ├── MediaNotFound
    │     ├── MediaOutsideRoots
    │     ├── UnreadableMedia
    │     └── ...                a family's own subclasses (they reach Celery as PermanentFailure)
    ├── Cancelled                the producer cancelled the job: fail now, never retry
    ├── TransientFailure         nobody's fault (broker hiccup): retry the same rung, a bounded number of times
    ├── StaleAttempt             worker side: the job went on elsewhere while this process was paused; stop quietly
    ├── NoRungLeft               raised in the worker when a job has failed on every rung
    ├── EngineError              an engine failed in a way nobody foresaw (a bug): fail, no retry
    └── JobFailed                raised by the client for a job that ended FAILURE; carries the history
          ├── JobRejected        it ended on a PermanentFailure
          ├── JobCancelled       it was cancelled
          └── LadderExhausted    it fell off the last rung

Every class takes a plain message so that Celery's JSON exception serialisation round-trips it.
What leaves a worker is always a class of this module (``wire_exception``): Celery rebuilds a
failure in the client from its module and class name, and a producer has this module imported
but not a family's, so a family's own ``PermanentFailure`` subclass is sent as
``PermanentFailure`` with its class name in the message, and the client sorts failures with
``issubclass``, never by name.
"""

from __future__ import annotations

import contextlib
import errno
import sys
from collections.abc import Iterator
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from mediafarm.tasks.records import Outcome


class FarmError(Exception):
    """Root of every error the farm raises on purpose."""


class ResourceFailure(FarmError):
    """The attempt ran out of memory, GPU memory or time: the job moves one rung down."""

    outcome = Outcome.OOM

    def __init__(self, message: str, outcome: Outcome | str | None = None) -> None:
        super().__init__(message)
        if outcome is not None:
            self.outcome = Outcome(outcome)


class RungUnavailable(FarmError):
    """This pool cannot run the rung at all (missing package, weights or GPU)."""


class PermanentFailure(FarmError):
    """Bad input or options: the job fails now and is never retried."""


class InvalidRequest(PermanentFailure, ValueError):
    """The job's fields do not fit the family's request schema (unknown, missing or mistyped)."""


class MediaNotFound(PermanentFailure):
    pass


class MediaOutsideRoots(PermanentFailure):
    pass


class UnreadableMedia(PermanentFailure):
    pass


class Cancelled(FarmError):
    """The producer cancelled the job (``JobHandle.cancel``); it ends now and is not retried."""


class TransientFailure(FarmError):
    """A failure that is nobody's fault; the same rung is retried a bounded number of times."""


class StaleAttempt(FarmError):
    """Worker side: this process's attempt was settled elsewhere while it was paused or cut off
    (another worker ran the job on). It writes nothing, stores nothing and is not retried."""


class NoRungLeft(FarmError):
    """Worker side: the job lost every rung of its ladder to resource failures."""


class EngineError(FarmError):
    """Worker side: an engine raised something outside the tree (a bug); the job fails, not retried."""


class JobFailed(FarmError):
    """A job ended FAILURE. Attributes: ``job_id``, ``reason``, ``attempts`` (the history)."""

    def __init__(self, job_id: str, reason: str, attempts: list[dict[str, Any]] | None = None) -> None:
        super().__init__(f"job {job_id} failed: {reason}")
        self.job_id = job_id
        self.reason = reason
        self.attempts = attempts or []


class JobRejected(JobFailed):
    """The job failed on bad input or invalid options; retrying it would fail the same way."""


class JobCancelled(JobFailed):
    """The job was cancelled before it finished."""


class LadderExhausted(JobFailed):
    """Every rung of the job's ladder failed for lack of resources."""


def wire_exception(exc: FarmError) -> FarmError:
    """``exc`` as a class the client is sure to have: one defined in this module.

    A family's ``class BadScript(PermanentFailure)`` would be rebuilt by Celery in a producer that
    never imported the family as a bare ``Exception`` subclass, and could not be sorted; it
    travels as its nearest base class from here, its own name kept in the message.
    """
    if type(exc).__module__ == __name__ or isinstance(exc, JobFailed):  # JobFailed: client side only
        return exc
    for base in type(exc).__mro__:
        if base.__module__ == __name__ and issubclass(base, FarmError):
            message = f"{type(exc).__name__}: {exc}"
            if issubclass(base, ResourceFailure):
                return base(message, outcome=getattr(exc, "outcome", None))
            return base(message)
    return exc  # pragma: no cover - FarmError itself is defined here


def _is_cuda_oom(exc: BaseException) -> bool:
    # Matched by name so that this module never imports torch.
    name = type(exc).__name__
    return name == "OutOfMemoryError" and type(exc).__module__.startswith("torch") or (
        isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)
    )


def _is_enomem(exc: BaseException) -> bool:
    # PyAV raises av.error.MemoryError (an OSError with errno ENOMEM) when FFmpeg cannot
    # allocate a context or a frame: the "couldn't allocate AVFormatContext" of the TTS story.
    return isinstance(exc, OSError) and exc.errno == errno.ENOMEM


@contextlib.contextmanager
def map_exceptions() -> Iterator[None]:
    """Translate foreign exceptions raised inside an engine into the farm's tree.

    A ``MemoryError`` must never escape a task: Celery treats it as unrecoverable and shuts the
    whole worker down (measured with 5.7.0).
    """
    # `from None` on the memory cases: a chained traceback keeps alive the frames that hold the
    # allocation that failed, and the job's next rung may run in this same child.
    try:
        yield
    except FarmError:
        raise
    except MemoryError as exc:
        raise ResourceFailure(f"MemoryError: {str(exc) or 'allocation failed'}", outcome=Outcome.OOM) from None
    except SoftTimeLimitExceeded as exc:
        raise ResourceFailure(f"soft time limit exceeded ({exc})", outcome=Outcome.TIMEOUT) from exc
    except Exception as exc:
        if _is_cuda_oom(exc):
            _empty_cuda_cache()
            raise ResourceFailure(f"CUDA out of memory: {str(exc)[:300]}", outcome=Outcome.CUDA_OOM) from None
        if _is_enomem(exc):
            raise ResourceFailure(f"FFmpeg/OS could not allocate memory: {exc}", outcome=Outcome.OOM) from exc
        if _is_redis_outage(exc):
            # The farm's own Redis calls inside an attempt (clearing the artifacts' partials, a
            # speaker lookup) on a connection that dropped: nobody's fault, the same rung again
            # (found by the chaos suite: a cut link failed two jobs as engine errors).
            raise TransientFailure(f"Redis unreachable during the attempt: {exc}") from exc
        raise


def _is_redis_outage(exc: BaseException) -> bool:
    redis_exceptions = sys.modules.get("redis.exceptions")
    return redis_exceptions is not None and isinstance(
        exc, (redis_exceptions.ConnectionError, redis_exceptions.TimeoutError)
    )


def _empty_cuda_cache() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
