"""mediafarm: a Celery + Redis worker farm for media AI jobs with downgrade ladders.

What a producer needs, importable from here::

    from mediafarm import submit, JobRejected, LadderExhausted

    job = submit("vad", media="/media/cam/2026-11-29.mp4")
    envelope = job.wait(timeout=600, on_progress=print)

The names are resolved on first use (PEP 562), so ``import mediafarm.config.settings`` and the
``farm`` CLI do not build the Celery app before they have set up the environment it reads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "submit": "mediafarm.tasks.producer.client",
    "handle": "mediafarm.tasks.producer.client",
    "JobHandle": "mediafarm.tasks.producer.handles",
    "PipelineHandle": "mediafarm.tasks.producer.handles",
    "known_families": "mediafarm.tasks.producer.client",
    "FarmError": "mediafarm.tasks.wire.errors",
    "JobFailed": "mediafarm.tasks.wire.errors",
    "JobRejected": "mediafarm.tasks.wire.errors",
    "JobCancelled": "mediafarm.tasks.wire.errors",
    "LadderExhausted": "mediafarm.tasks.wire.errors",
    "InvalidRequest": "mediafarm.tasks.wire.errors",
    "Overloaded": "mediafarm.tasks.wire.errors",
    "PermanentFailure": "mediafarm.tasks.wire.errors",
    "Envelope": "mediafarm.tasks.wire.records",
    "Attempt": "mediafarm.tasks.wire.records",
    "ArtifactInfo": "mediafarm.tasks.wire.records",
    "Progress": "mediafarm.tasks.wire.records",
    "Outcome": "mediafarm.tasks.wire.records",
    # The TTS family's producer API, listed because producers import it from here. The table is
    # static so that a name resolves without importing every family; a new family's helpers are
    # imported from its own package (tasks/kit/__init__.py, "Root exports").
    "register_speaker": "mediafarm.tasks.families.tts.speakers",
    "list_speakers": "mediafarm.tasks.families.tts.speakers",
    "remove_speaker": "mediafarm.tasks.families.tts.speakers",
}
__all__ = [
    "ArtifactInfo",
    "Attempt",
    "Envelope",
    "FarmError",
    "InvalidRequest",
    "JobCancelled",
    "JobFailed",
    "JobHandle",
    "JobRejected",
    "LadderExhausted",
    "Outcome",
    "Overloaded",
    "PermanentFailure",
    "PipelineHandle",
    "Progress",
    "handle",
    "known_families",
    "list_speakers",
    "register_speaker",
    "remove_speaker",
    "submit",
]

if TYPE_CHECKING:
    from mediafarm.tasks.families.tts.speakers import list_speakers, register_speaker, remove_speaker
    from mediafarm.tasks.producer.client import handle, known_families, submit
    from mediafarm.tasks.producer.handles import JobHandle, PipelineHandle
    from mediafarm.tasks.wire.errors import (
        FarmError,
        InvalidRequest,
        JobCancelled,
        JobFailed,
        JobRejected,
        LadderExhausted,
        Overloaded,
        PermanentFailure,
    )
    from mediafarm.tasks.wire.records import ArtifactInfo, Attempt, Envelope, Outcome, Progress


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mediafarm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
