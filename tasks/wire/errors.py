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
    ├── Overloaded               raised by submit: the farm refused the job (queue full, memory
    │                            pressure); nothing was sent, try again after ``retry_after`` s
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
from collections.abc import Iterator, Sequence
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from mediafarm.tasks.wire.records import Outcome


class FarmError(Exception):
    """Root of every error the farm raises on purpose.

    Attributes:
        rung: Worker side: the name of the rung whose attempt ended the job this way, set by the
            ladder as it passes a terminal failure on (``tasks.runtime.downgrade.run_ladder``); None when
            the job ended before any rung ran. Read by the worker's log line, never sent.
    """

    rung: str | None = None


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
    """The job's fields do not fit the family's request schema (unknown, missing or mistyped).

    Attributes: ``request`` (the family whose request names the fields, "" when no field is at
    fault) and ``problems`` (``(field, problem)`` pairs, what the message says), so a route can
    name the fields in its own words without reading the message back. Both are lost when the
    error crosses Celery; the message is not.
    """

    def __init__(self, message: str, request: str = "", problems: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.request, self.problems = request, problems

    @classmethod
    def of_fields(cls, request: str, problems: Sequence[tuple[str, str]]) -> InvalidRequest:
        """``<request> request: <field>: <problem>; ...`` for each of ``problems``."""
        words = "; ".join(f"{field}: {problem}" for field, problem in problems)
        return cls(f"{request} request: {words}", request, tuple(problems))


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


class Overloaded(FarmError):
    """The farm refused a job at submit (``tasks.producer.admission``): nothing of it was sent or written.

    Attributes: ``retry_after`` (seconds to wait before trying again), ``family``, ``reason``
    (``depth``: its family's queues are at their limit; ``tenant``: the caller's own limit;
    ``pressure``: a pool that would run it is short of memory). The message says which, in words.
    """

    def __init__(self, message: str, retry_after: float = 5.0, family: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.family = family
        self.reason = reason


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


# How foreign libraries word an allocation that failed, lower-cased: torch ("CUDA out of memory"),
# CTranslate2 ("CUDA failed with error out of memory", std::bad_alloc), the CUDA driver
# (CUDA_ERROR_OUT_OF_MEMORY), cuBLAS/cuDNN (..._STATUS_ALLOC_FAILED), onnxruntime's arena ("Failed
# to allocate memory for requested buffer"), torch on CPU and the C library ("can't allocate memory",
# strerror(ENOMEM) "Cannot allocate memory").
_OUT_OF_MEMORY_WORDS = (
    "out of memory",
    "out_of_memory",
    "bad_alloc",
    "alloc_failed",
    "failed to allocate memory",
    "can't allocate memory",
    "cannot allocate memory",
)
# Words that put the failed allocation on a GPU.
_GPU_WORDS = ("cuda", "cublas", "cudnn")


def memory_outcome(exc: BaseException, device: str | None = None) -> Outcome | None:
    """Which memory ``exc`` says ran out: ``Outcome.CUDA_OOM``, ``Outcome.OOM``, or None when it is
    not an allocation failure.

    The one place the farm recognises running out of memory: ``MemoryError`` (pybind11 turns a C++
    ``std::bad_alloc`` into one), torch's ``OutOfMemoryError`` (matched by name, so that this module
    never imports torch), an ``OSError`` with ``ENOMEM`` (PyAV's "couldn't allocate AVFormatContext"),
    and any other exception whose message says an allocation failed (``_OUT_OF_MEMORY_WORDS``).

    Args:
        exc: The exception an engine or a library raised.
        device: Where the failing work ran (``"cuda"``, ``"cuda:0"``, ``"cpu"``), when the caller
            knows: a message that names no GPU is GPU memory on a CUDA device. None: the message alone
            decides.
    """
    if isinstance(exc, MemoryError):
        return Outcome.OOM
    if type(exc).__name__ == "OutOfMemoryError" and type(exc).__module__.startswith("torch"):
        return Outcome.CUDA_OOM
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return Outcome.OOM
    message = str(exc).lower()
    if not any(words in message for words in _OUT_OF_MEMORY_WORDS):
        return None
    on_gpu = any(words in message for words in _GPU_WORDS) or (device or "").startswith("cuda")
    return Outcome.CUDA_OOM if on_gpu else Outcome.OOM


def memory_failure(exc: BaseException, device: str | None = None, source: str = "") -> ResourceFailure | None:
    """``exc`` as the ResourceFailure it stands for when it says memory ran out (:func:`memory_outcome`),
    else None. ``source`` (a library, a model) starts the message."""
    outcome = memory_outcome(exc, device)
    if outcome is None:
        return None
    text = str(exc)
    if isinstance(exc, MemoryError):
        reason = f"MemoryError: {text or 'allocation failed'}"
    elif isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        # The "couldn't allocate AVFormatContext" of the TTS story: FFmpeg itself ran out.
        reason = f"FFmpeg/OS could not allocate memory: {exc}"
    elif outcome is Outcome.CUDA_OOM:
        reason = f"CUDA out of memory: {text[:300]}"
    else:
        reason = f"out of memory: {type(exc).__name__}: {text[:300]}"
    return ResourceFailure(f"{source}: {reason}" if source else reason, outcome=outcome)


def raise_if_out_of_memory(exc: BaseException, device: str | None = None, source: str = "") -> None:
    """Raise :func:`memory_failure` of ``exc`` if it says memory ran out; return otherwise.

    For an engine that catches a library's exceptions itself (a model load that fails as
    RungUnavailable otherwise) and must still move the job down on an allocation failure.
    """
    failure = memory_failure(exc, device, source)
    if failure is not None:
        if failure.outcome is Outcome.CUDA_OOM:
            _empty_cuda_cache()
        # `from None`: a chained traceback keeps alive the frames that hold the allocation that
        # failed, and the job's next rung may run in this same child.
        raise failure from None


def _is_third_party_import(exc: ImportError) -> bool:
    # A package of the pool's (missing, or installed but broken: a torchvision that does not load
    # beside torch) is the pool's lack; a farm module that does not import is a bug.
    return not (exc.name or "").startswith("mediafarm")


@contextlib.contextmanager
def map_exceptions() -> Iterator[None]:
    """Translate foreign exceptions raised inside an engine into the farm's tree.

    A ``MemoryError`` must never escape a task: Celery treats it as unrecoverable and shuts the
    whole worker down (measured with 5.7.0). Every allocation failure becomes a ResourceFailure
    (:func:`memory_outcome`); a package that does not import is RungUnavailable, as a missing
    ``EngineSpec.needs`` is before the attempt.
    """
    try:
        yield
    except FarmError:
        raise
    except SoftTimeLimitExceeded as exc:
        raise ResourceFailure(f"soft time limit exceeded ({exc})", outcome=Outcome.TIMEOUT) from exc
    except ImportError as exc:
        if _is_third_party_import(exc):
            raise RungUnavailable(f"package {exc.name or '?'!r} cannot be imported on this pool: {exc}") from exc
        raise
    except Exception as exc:  # MemoryError included
        raise_if_out_of_memory(exc)
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
