"""What leaves a worker is a class of tasks/wire/errors.py; foreign exceptions map into the farm's tree."""

from __future__ import annotations

import errno

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from mediafarm.tasks.wire import errors
from mediafarm.tasks.wire.errors import (
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
from mediafarm.tasks.wire.records import Outcome


class BadScript(PermanentFailure):
    """A family's own failure, defined outside tasks/wire/errors.py."""


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


# --- out of memory, recognised in one place ---------------------------------------------------

# What each library raises when an allocation fails (messages as the libraries word them).
FOREIGN_OUT_OF_MEMORY = [
    (MemoryError("cannot allocate 2 GiB"), Outcome.OOM),
    (OSError(errno.ENOMEM, "couldn't allocate AVFormatContext"), Outcome.OOM),
    (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.79 GiB total)"), Outcome.CUDA_OOM),
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), Outcome.CUDA_OOM),
    (RuntimeError("CUDA driver error: CUDA_ERROR_OUT_OF_MEMORY"), Outcome.CUDA_OOM),
    (
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to "
            "allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)"
        ),
        Outcome.OOM,
    ),
    # CTranslate2
    (RuntimeError("CUDA failed with error out of memory"), Outcome.CUDA_OOM),
    (RuntimeError("std::bad_alloc"), Outcome.OOM),
    # onnxruntime (its RuntimeException is no RuntimeError: any exception's message counts)
    (
        Exception(
            "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running Conv node. "
            "Status Message: bfc_arena.cc:376 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool) "
            "Failed to allocate memory for requested buffer of size 1073741824"
        ),
        Outcome.OOM,
    ),
    (Exception("[ONNXRuntimeError] : 6 : CUDA failure 2: out of memory ; GPU=0 ; cuda_allocator.cc"), Outcome.CUDA_OOM),
]


@pytest.mark.parametrize(("exc", "outcome"), FOREIGN_OUT_OF_MEMORY, ids=lambda v: str(v)[:40])
def test_each_foreign_allocation_failure_is_recognised_as_its_memory(exc: BaseException, outcome: Outcome) -> None:
    assert errors.memory_outcome(exc) is outcome


@pytest.mark.parametrize(("exc", "outcome"), FOREIGN_OUT_OF_MEMORY, ids=lambda v: str(v)[:40])
def test_map_exceptions_moves_every_allocation_failure_down_without_a_cause(
    exc: BaseException, outcome: Outcome
) -> None:
    mapped = _mapped(exc)
    assert type(mapped) is ResourceFailure and mapped.outcome is outcome
    assert mapped.__cause__ is None and mapped.__suppress_context__


def test_torchs_own_out_of_memory_error_is_cuda_oom() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed: its OutOfMemoryError cannot be built")
    exc = torch.cuda.OutOfMemoryError("Tried to allocate 2.00 GiB")
    assert errors.memory_outcome(exc) is Outcome.CUDA_OOM
    assert _mapped(exc).outcome is Outcome.CUDA_OOM


def test_the_device_puts_an_allocation_failure_that_names_none_on_the_gpu() -> None:
    bad_alloc = RuntimeError("std::bad_alloc")  # CTranslate2 loading onto a GPU
    assert errors.memory_outcome(bad_alloc, device="cuda") is Outcome.CUDA_OOM
    assert errors.memory_outcome(bad_alloc, device="cuda:1") is Outcome.CUDA_OOM
    assert errors.memory_outcome(bad_alloc, device="cpu") is Outcome.OOM
    # A message that names CUDA is GPU memory whatever the caller says.
    assert errors.memory_outcome(RuntimeError("CUDA failed with error out of memory"), device="cpu") is Outcome.CUDA_OOM


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("plain runtime error"),
        RuntimeError("CUDA error: device-side assert triggered"),
        ValueError("bad"),
        OSError(errno.ENOENT, "no such file"),
        KeyError("memory"),
    ],
)
def test_other_failures_are_not_out_of_memory(exc: BaseException) -> None:
    assert errors.memory_outcome(exc) is None
    assert errors.memory_outcome(exc, device="cuda") is None
    assert errors.memory_failure(exc) is None
    errors.raise_if_out_of_memory(exc, "cuda", "lib")  # returns: nothing to raise
    assert _mapped(exc) is exc  # an engine error, as before


def test_a_familys_check_names_its_source_and_raises_without_a_cause() -> None:
    with pytest.raises(ResourceFailure) as info:
        try:
            raise RuntimeError("std::bad_alloc")
        except RuntimeError as exc:
            errors.raise_if_out_of_memory(exc, "cuda", "CTranslate2")
    assert info.value.outcome is Outcome.CUDA_OOM
    assert str(info.value) == "CTranslate2: CUDA out of memory: std::bad_alloc"
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_a_host_allocation_failure_says_which_exception_it_was() -> None:
    failure = errors.memory_failure(RuntimeError("std::bad_alloc"), source="ChatTTS")
    assert failure is not None and failure.outcome is Outcome.OOM
    assert str(failure) == "ChatTTS: out of memory: RuntimeError: std::bad_alloc"


# --- packages that do not import --------------------------------------------------------------


def test_a_package_that_does_not_import_makes_the_rung_unavailable() -> None:
    mapped = _mapped(ModuleNotFoundError("No module named 'torchvision'", name="torchvision"))
    assert type(mapped) is RungUnavailable
    assert "'torchvision'" in str(mapped) and "cannot be imported on this pool" in str(mapped)
    broken = _mapped(ImportError("libcudart.so.12: cannot open shared object file"))  # no name: a library
    assert type(broken) is RungUnavailable


def test_a_farm_module_that_does_not_import_is_a_bug_not_a_missing_package() -> None:
    original = ImportError("cannot import name 'nope'", name="mediafarm.tasks.families.vad.engines")
    assert _mapped(original) is original
