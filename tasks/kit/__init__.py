"""The family kit: everything a job family may import from the farm, in one place.

A family (``tasks/families/<name>/``, or an operator's module named in ``FARM_FAMILY_MODULES``)
imports the farm from here and nowhere else; ``tests/test_family_kit.py`` reads every family's
imports and fails on any other module of the farm. The kit only re-exports: each name is defined
where the farm uses it, so a family and the farm never disagree about what a name means.

Two modules, by weight:

- ``mediafarm.tasks.kit`` (this one) is light: the spec classes, ladders and limits, the engine's
  context, errors, records, the pipeline plan, artifacts, keys. Spec modules import it, and every
  farm process imports the specs, producers included (``tests/test_producer_import.py``): nothing
  here loads PyAV, numpy or torch.
- ``mediafarm.tasks.kit.media`` holds the media helpers (decoding, stream checks, the input
  probes), which import PyAV and numpy: engines import it, in the pool child, and a spec only
  inside its ``probe`` function.

Rules a family follows:

- **Other families.** A family may import another family's modules
  (``mediafarm.tasks.families.<other>...``): its spec for requests and results it builds on (the
  dialogue's lines are TTS jobs, the camera filter reads VAD and YOLO results), its engines where
  it runs them in-process (subtitle runs the VAD itself). Never the registry
  (``mediafarm.tasks.registry``): the registry finds families, not the other way round.
- **Producer-side calls.** A family's functions that run outside a worker (its CLI commands, a
  helper a producer calls, as the TTS speaker store's) reach the farm's Redis through
  :func:`farm_redis`; an engine uses ``ctx.redis``. No family module imports the app or the client.
- **Own keys.** A family names its Redis keys with :func:`family_key`, under the farm's prefix in a
  space of its own; ``tasks/wire/keys.py`` holds only the farm's keys.
- **Own commands and metrics.** ``FamilySpec.cli`` names a Typer app of the family's commands, which
  ``farm`` mounts under its name (``farm speakers``); ``FamilySpec.metrics`` lists the numbers of its
  result the workers count (:class:`ResultMetric`: YOLO's frame counters). Neither edits a shared file.
- **Root exports.** ``mediafarm/__init__.py`` keeps a static table of what ``from mediafarm import``
  offers: it must resolve a name without importing every family (a producer's ``import mediafarm``
  stays light, type checkers read the table). The TTS speaker functions stay listed there because
  producers import them so; a new family's producer helpers are imported from its own package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mediafarm.config.ladders import Ladder, Rung, rung
from mediafarm.config.limits import TimeLimits
from mediafarm.config.settings import FarmSettings, get_settings
from mediafarm.tasks.media.intervals import Span, merge_spans
from mediafarm.tasks.wire.artifacts import ArtifactStore, sha256_of
from mediafarm.tasks.wire.checkpoint import Checkpoint, Made, Resume, made_until
from mediafarm.tasks.wire.errors import (
    Cancelled,
    FarmError,
    InvalidRequest,
    MediaNotFound,
    PermanentFailure,
    RungUnavailable,
    TransientFailure,
    UnreadableMedia,
    raise_if_out_of_memory,
)
from mediafarm.tasks.wire.family import (
    CommaList,
    EngineSpec,
    FamilySpec,
    MediaPath,
    NoParams,
    Params,
    Request,
    describe_validation_error,
)
from mediafarm.tasks.wire.keys import family_key
from mediafarm.tasks.wire.languages import normalize_language, script_language
from mediafarm.tasks.wire.plan import Collected, Part, Plan
from mediafarm.tasks.wire.records import ArtifactInfo, Envelope, Outcome, Progress, rung_named
from mediafarm.tasks.wire.result_metrics import ResultMetric

if TYPE_CHECKING:
    from mediafarm.tasks.runtime.context import EngineContext
    from mediafarm.tasks.runtime.gpu import torch_device
    from mediafarm.tasks.runtime.liveness import beat as alive

# What an engine runs with, from the worker side of a job (``tasks/runtime/``): resolved on first
# use (PEP 562), because every process imports the spec modules, producers too, and a producer
# loads nothing of the runtime. An engine's module, run in a pool child, imports them as any name.
_RUNTIME = {
    "EngineContext": ("mediafarm.tasks.runtime.context", "EngineContext"),
    "torch_device": ("mediafarm.tasks.runtime.gpu", "torch_device"),
    "alive": ("mediafarm.tasks.runtime.liveness", "beat"),
}


def __getattr__(name: str) -> Any:
    if name not in _RUNTIME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _RUNTIME[name]
    value = globals()[name] = getattr(importlib.import_module(module), attr)
    return value


def farm_redis() -> Any:
    """The farm's Redis (the result backend's client), for a family's producer-side calls.

    Builds the farm's Celery app on first use, from the ``FARM_*`` settings of this process. An
    engine uses ``ctx.redis`` instead: the worker's own, and None in a local context given none.
    """
    from mediafarm.tasks.app import app

    return app.backend.client


__all__ = [
    # The spec: what a family declares.
    "CommaList",
    "EngineSpec",
    "FamilySpec",
    "Ladder",
    "MediaPath",
    "NoParams",
    "Params",
    "Request",
    "Resume",
    "ResultMetric",
    "Rung",
    "TimeLimits",
    "describe_validation_error",
    "rung",
    # What an engine runs in and writes.
    "ArtifactStore",
    "EngineContext",
    "alive",  # ctx.alive() for code that has no ctx (a source's wait loop): no stall while it waits
    "FarmSettings",
    "get_settings",
    "sha256_of",
    "torch_device",
    # Checkpoints: what an attempt is handed to resume from (ctx.resume).
    "Checkpoint",
    "Made",
    "made_until",
    # Errors an engine raises (tasks/wire/errors.py says which does what).
    "Cancelled",
    "FarmError",
    "InvalidRequest",
    "MediaNotFound",
    "PermanentFailure",
    "RungUnavailable",
    "TransientFailure",
    "UnreadableMedia",
    "raise_if_out_of_memory",
    # Records of the farm's a family reads.
    "ArtifactInfo",
    "Envelope",
    "Outcome",
    "Progress",
    "rung_named",  # a result model's rung as the release before wrote it (variant only)
    # Pipelines: a request's plan, and the fan-in job's parts.
    "Collected",
    "Part",
    "Plan",
    # Languages: a request's, as its script tells it, and codes as rungs and requests compare them.
    "normalize_language",
    "script_language",
    # Time spans.
    "Span",
    "merge_spans",
    # A family's own Redis keys, and the farm's Redis outside a worker.
    "family_key",
    "farm_redis",
]
