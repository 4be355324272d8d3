"""What leaves a worker is a class of tasks/errors.py; foreign exceptions map into the farm's tree."""

from __future__ import annotations

import errno

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from mediafarm.tasks import errors
from mediafarm.tasks.errors import (
    Cancelled,
    InvalidRequest,
    MediaNotFound,
    PermanentFailure,
    ResourceFailure,
    RungUnavailable,
    TransientFailure,
    map_exceptions,
    wire_exception,
)
from mediafarm.tasks.records import Outcome


class BadScript(PermanentFailure):
    """A family's own failure, defined outside tasks/errors.py."""


class BadField(InvalidRequest):
    pass


def test_foreign_permanent_failure_travels_as_permanent_failure_with_its_name() -> None:
    wired = wire_exception(BadScript("line 3 is empty"))
    assert type(wired) is PermanentFailure
    assert str(wired) == "BadScript: line 3 is empty"


def test_foreign_subclass_travels_as_its_nearest_base_from_errors() -> None:
    wired = wire_exception(BadField("voice: unknown"))
    assert type(wired) is InvalidRequest
    assert "BadField" in str(wired) and "voice: unknown" in str(wired)


@pytest.mark.parametrize(
    "exc",
    [
        PermanentFailure("p"),
        InvalidRequest("i"),
        MediaNotFound("m"),
        ResourceFailure("r", Outcome.CUDA_OOM),
        RungUnavailable("u"),
        Cancelled("c"),
        TransientFailure("t"),
    ],
)
def test_classes_of_errors_module_come_back_unchanged(exc: errors.FarmError) -> None:
    assert type(exc).__module__ == errors.__name__
    assert wire_exception(exc) is exc


def _mapped(exc: BaseException) -> BaseException:
    """What map_exceptions turns ``exc`` into (the exception that leaves the block)."""
    with pytest.raises(BaseException) as info:
        with map_exceptions():
            raise exc
    return info.value


def test_memory_error_becomes_oom_without_a_chained_cause() -> None:
    mapped = _mapped(MemoryError("cannot allocate 2 GiB"))
    assert type(mapped) is ResourceFailure
    assert mapped.outcome is Outcome.OOM
    assert "cannot allocate 2 GiB" in str(mapped)
    # No traceback chain keeps the frames that hold the failed allocation alive.
    assert mapped.__cause__ is None and mapped.__suppress_context__


def test_memory_error_without_a_message_still_says_what_failed() -> None:
    assert str(_mapped(MemoryError())) == "MemoryError: allocation failed"


def test_a_familys_resource_failure_keeps_its_outcome_on_the_wire() -> None:
    class TooSlow(ResourceFailure):
        outcome = Outcome.TIMEOUT

    wired = errors.wire_exception(TooSlow("decoder stalled"))
    assert type(wired) is ResourceFailure and wired.outcome is Outcome.TIMEOUT
    assert str(wired) == "TooSlow: decoder stalled"


def test_os_error_with_enomem_becomes_oom() -> None:
    mapped = _mapped(OSError(errno.ENOMEM, "couldn't allocate AVFormatContext"))
    assert type(mapped) is ResourceFailure and mapped.outcome is Outcome.OOM


def test_other_os_errors_pass_through() -> None:
    original = OSError(errno.ENOENT, "no such file")
    assert _mapped(original) is original


def test_cuda_out_of_memory_runtime_error_becomes_cuda_oom_without_a_cause() -> None:
    mapped = _mapped(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    assert type(mapped) is ResourceFailure and mapped.outcome is Outcome.CUDA_OOM
    assert mapped.__cause__ is None


def test_soft_time_limit_becomes_timeout() -> None:
    mapped = _mapped(SoftTimeLimitExceeded())
    assert type(mapped) is ResourceFailure and mapped.outcome is Outcome.TIMEOUT


@pytest.mark.parametrize("exc", [ValueError("bad"), RuntimeError("plain runtime error"), KeyError("k")])
def test_other_exceptions_pass_through_unchanged(exc: Exception) -> None:
    assert _mapped(exc) is exc


def test_farm_errors_pass_through_unchanged() -> None:
    original = ResourceFailure("already mapped", Outcome.KILLED)
    mapped = _mapped(original)
    assert mapped is original and mapped.outcome is Outcome.KILLED



def test_a_dropped_redis_connection_during_an_attempt_is_transient_not_an_engine_bug() -> None:
    import redis

    for exc in (redis.exceptions.ConnectionError("Connection reset by peer"), redis.exceptions.TimeoutError("slow")):
        mapped = _mapped(exc)
        assert isinstance(mapped, errors.TransientFailure) and "Redis unreachable" in str(mapped)
    other = redis.exceptions.ResponseError("WRONGTYPE")  # a bug, not an outage: passes through
    assert _mapped(other) is other
