"""The registry of job families: one line per built-in family, plus the operator's modules.

Routing, task names, time limits, ladders, the CLI and the client all read this registry; none of
them keeps a table of families of its own. A family is a folder with a module-level ``FAMILY``
(a :class:`~mediafarm.tasks.wire.family.FamilySpec`); a built-in one is added by one line in
:data:`BUILTIN`, anyone else's by naming its module in ``FARM_FAMILY_MODULES``.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from mediafarm.config.file import ConfigFileError
from mediafarm.config.ladders import Ladder, declared_ladders
from mediafarm.config.limits import TimeLimits, limit_overrides
from mediafarm.config.settings import get_settings
from mediafarm.tasks.wire.errors import InvalidRequest
from mediafarm.tasks.wire.family import FamilySpec

BUILTIN: tuple[str, ...] = (
    "mediafarm.tasks.families.vad",
    "mediafarm.tasks.families.subtitle",
    "mediafarm.tasks.families.subtitle_render",
    "mediafarm.tasks.families.subtitle_live",
    "mediafarm.tasks.families.tts",
    "mediafarm.tasks.families.dialogue",
    "mediafarm.tasks.families.yolo",
    "mediafarm.tasks.families.camfilter",
)

_families: dict[str, FamilySpec] = {}
_loaded = False
_lock = threading.Lock()


def register(spec: FamilySpec) -> FamilySpec:
    """Add a family. Registering the same spec twice is harmless; two families may not share a
    name, a task name or a queue, nor declare one result metric differently (one Prometheus
    metric counts both)."""
    with _lock:
        known = _families.get(spec.name)
        if known is spec:
            return spec
        if known is not None:
            raise ValueError(f"a job family named {spec.name!r} is already registered")
        for other in _families.values():
            if other.task_name == spec.task_name or other.queue == spec.queue:
                raise ValueError(f"family {spec.name!r} shares its task name or queue with {other.name!r}")
            theirs = {m.name: m.shape for m in other.metrics}
            for metric in spec.metrics:
                if theirs.get(metric.name, metric.shape) != metric.shape:
                    raise ValueError(f"family {spec.name!r} declares metric {metric.full_name} unlike "
                                     f"{other.name!r} does (kind, help, labels and buckets must agree)")  # fmt: skip
        _families[spec.name] = spec
    return spec


def load() -> Mapping[str, FamilySpec]:
    """Every family: the built-in ones and those of ``FARM_FAMILY_MODULES``, imported once."""
    global _loaded
    if not _loaded:
        for module_name in (*BUILTIN, *get_settings().family_modules):
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise ConfigFileError(f"family module {module_name!r} cannot be imported: {exc}") from exc
            spec = getattr(module, "FAMILY", None)
            if not isinstance(spec, FamilySpec):
                raise ConfigFileError(f"family module {module_name!r} has no module-level FAMILY (a FamilySpec)")
            register(spec)
        _loaded = True
    return MappingProxyType(_families)


def get(name: str) -> FamilySpec:
    """The family called ``name``, or ValueError naming the known ones."""
    families = load()
    try:
        return families[name]
    except KeyError:
        raise ValueError(f"unknown job family {name!r}; one of {sorted(families)}") from None


def by_task_name(task_name: str) -> FamilySpec | None:
    return next((s for s in load().values() if s.task_name == task_name), None)


def route(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **_: Any) -> dict[str, str] | None:
    """Celery router (``task_routes``): a family's task goes to its family queue."""
    spec = by_task_name(name)
    return {"queue": spec.queue} if spec is not None else None


def default_queues() -> list[str]:
    """The queues that a pool consuming ``*`` takes."""
    return [s.queue for s in load().values() if s.in_default_pools]


def limits_for(spec: FamilySpec) -> TimeLimits:
    """The family's time limits, the operator file's ``[limits.<family>]`` applied."""
    override = limit_overrides().get(spec.name)
    if not override:
        return spec.limits
    try:
        return dataclasses.replace(spec.limits, **override)
    except ConfigFileError as exc:
        raise ConfigFileError(f"[limits.{spec.name}]: {exc}") from None


def hard_limits(queues: set[str] | None = None) -> dict[str, float]:
    """``family <name>`` → hard limit of every family (or of those whose queue is in
    ``queues``), for the configuration checks."""
    specs = [s for s in load().values() if queues is None or s.queue in queues]
    return {f"family {s.name}": float(limits_for(s).hard) for s in specs}


def ladders_of(spec: FamilySpec) -> list[Ladder]:
    """Every ladder a job of this family may run: its own (the operator's, if declared) and the
    named ladders that declare it as their family."""
    declared = declared_ladders()
    own = declared.get(spec.name, spec.default_ladder)
    return [own] + [ladder for name, ladder in declared.items() if ladder.family == spec.name and name != spec.name]


def recorded_ladder(spec: FamilySpec, ladder: Ladder) -> str:
    """``ladder``'s name as the workers' capability records name it (``tasks.wire.capability``): a
    ladder started from one of the family's rungs (``ladder_for``) is named there as the family's own."""
    named = {one.name for one in ladders_of(spec)}
    return ladder.name if ladder.name in named else ladder_for(spec).name


def ladder_for(spec: FamilySpec, name: str | None = None) -> Ladder:
    """The ladder a job runs: the family's own, a named one of this family (``ladder_field``), or
    the family's own from one of its rungs down (a rung's name: a client that asks for a cheaper
    voice or model skips the rungs above it and keeps the ones below)."""
    own = declared_ladders().get(spec.name, spec.default_ladder)
    if name is None or name == spec.name:
        return own
    ladder = declared_ladders().get(name)
    if ladder is not None and ladder.family == spec.name:
        return ladder
    start = next((i for i, rung in enumerate(own.rungs) if rung.name == name), None)
    if start is not None:
        return Ladder(f"{own.name} from {name}", spec.name, own.rungs[start:])
    known = sorted(ladder.name for ladder in ladders_of(spec))
    rungs = [rung.name for rung in own.rungs]
    raise InvalidRequest(f"{spec.name} request: no ladder {name!r} is declared for this family, nor is it a rung "
                         f"of its own; ladders: {known}, rungs: {rungs}")  # fmt: skip


def ladder_problems() -> list[str]:
    """Operator mistakes in declared ladders and limits: a family nobody registered, an unknown
    engine, parameters an engine does not take. A worker refuses to start on any of them."""
    families = load()
    problems = [
        f"[limits.{name}]: no job family named {name!r}; registered: {sorted(families)}"
        for name in limit_overrides()
        if name not in families
    ]
    for name, ladder in declared_ladders().items():
        spec = families.get(ladder.family)
        if spec is None:
            problems.append(f"[ladders.{name}]: no job family named {ladder.family!r}; registered: {sorted(families)}")
            continue
        problems += [f"[ladders.{name}] {p}" for p in spec.rung_problems(ladder)]
    return problems
