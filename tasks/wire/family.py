"""What a job family declares about itself, once, in its own folder: :class:`FamilySpec`.

A family is a request schema, a result type, engines, a default ladder and time limits. The
registry (``tasks.registry``) turns each spec into a Celery task, a route, a CLI rendering and a
client entry; nothing else in the farm names a family. A spec module is imported by every farm
process, producers included, so it imports nothing heavy: engines are named as ``module:function``
and imported in the pool child on first use.

An engine is a plain function ``engine(ctx, request, params)``: ``ctx`` is the
:class:`~mediafarm.tasks.runtime.context.EngineContext` of the attempt, ``request`` the validated request
model, ``params`` the rung's validated parameter model. It returns the family's result model, or
is a generator that yields partial outputs and returns the result.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo

from mediafarm.config.file import ConfigFileError
from mediafarm.config.ladders import Ladder, Rung
from mediafarm.config.limits import TimeLimits
from mediafarm.tasks.wire.checkpoint import Resume
from mediafarm.tasks.wire.errors import InvalidRequest, PermanentFailure
from mediafarm.tasks.wire.media_paths import resolve_media
from mediafarm.tasks.wire.media_urls import is_media_url, url_parts
from mediafarm.tasks.wire.result_metrics import ResultMetric

TASK_NAME = re.compile(r"^farm\.[a-z0-9_-]+\.[a-z0-9_]+$")
FAMILY_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


def _media_shape(value: Any) -> Any:
    # ValueError, so pydantic reports it as this field's problem (InvalidRequest) on either side.
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty path string, got {value!r}")
    if "\x00" in value:
        raise ValueError("contains a NUL byte")
    if is_media_url(value):
        url_parts(value)  # UrlNotAllowed (a ValueError) for a URL the farm never fetches
    # A string either way (the union's str in Python and JSON modes alike); a path becomes a Path
    # after, a URL stays the string it is (a Path would fold its "//").
    return value


def _media_resolved(value: Path | str, info: ValidationInfo) -> Path | str:
    context = info.context or {}
    roots = context.get("media_roots")
    url = isinstance(value, str) and is_media_url(value)
    # In a producer: checked for shape only, since the producer may not see the farm's file system
    # nor know the workers' FARM_MEDIA_URLS. In the worker (media roots given): the real path inside
    # the roots, or the local copy of a URL's media, or the failure itself (MediaNotFound, a URL
    # not allowed ...: not a ValueError, so pydantic lets it through).
    if roots is None:
        return value if url else Path(value)
    if url:
        fetch = context.get("fetch_media")
        if fetch is None:
            raise PermanentFailure(f"media URL {value!r}: this process fetches no media (only a worker does)")
        return fetch(str(value))
    return resolve_media(str(value), roots)


# A request field that names an input: a path (or an http(s) URL) on the wire, a resolved, checked
# Path in the engine (symlinks followed, inside FARM_MEDIA_ROOTS, a non-empty regular file; a URL's
# media fetched by the worker first, from a host FARM_MEDIA_URLS lists: tasks.runtime.media_fetch).
MediaPath = Annotated[Path | str, BeforeValidator(_media_shape), AfterValidator(_media_resolved)]


def _comma_separated(value: Any) -> Any:
    # The CLI gives `--formats vtt,srt` as one string; the wire and Python callers give a list.
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


# A list request field that also takes "a,b,c".
CommaList = BeforeValidator(_comma_separated)


class Request(BaseModel):
    """Base of every family's request: unknown fields are refused, never silently dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Params(BaseModel):
    """Base of every engine's parameter model: a rung naming a parameter the engine does not
    take is an operator error found when the worker starts."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(Params):
    """The parameters of an engine that takes none."""


def validation_problems(exc: ValidationError) -> list[tuple[str, str]]:
    """``(field, problem)`` for each of the error's problems, in the words pydantic uses."""
    return [(".".join(str(p) for p in error["loc"]) or "(request)", error["msg"])
            for error in exc.errors(include_url=False)]  # fmt: skip


def describe_validation_error(exc: ValidationError) -> str:
    """``field: problem; field: problem`` in the words pydantic uses, without its URLs."""
    return "; ".join(f"{field}: {problem}" for field, problem in validation_problems(exc))


@dataclass(frozen=True)
class EngineSpec:
    """One engine of a family.

    Attributes:
        target: ``module:function``, imported in the pool child on first use.
        params: The model the rung's ``params`` must fit.
        needs: Import names that must be installed on the pool, checked without importing them;
            a rung whose engine misses one is skipped as unavailable. The one place an engine's
            packages are stated: engines import them without guards (a package that is present
            but does not import is RungUnavailable at ``map_exceptions``).
        extra: The ``mediafarm`` extra that installs ``needs`` (``"vad"``), named in the skip
            message; None for a family installed some other way.
        weights: The parameter of this engine that names its weights, a file or folder under
            ``FARM_MODELS_DIR`` (``"model"``); a rung whose weights are absent is skipped as
            unavailable before it is charged an attempt (or a media check is charged to it).
            None: the engine has no weights of the operator's.
        languages: What a rung of this engine speaks or recognises: ``(params, models_dir,
            request) -> codes``, or None from the hook for any language (``tasks.wire.languages``; the
            models dir and the request are None where not known, as in ``farm families``). A rung
            that cannot handle a job's language is skipped for it. None: any language. Light, like
            the spec: it reads a file or asks a program, it imports no model.
        languages_by_request: The ``languages`` hook adds what the job's own request names (a
            TTS speaker's voices for further languages): a worker's capability record, judged with
            no request, cannot tell a rung's languages, so routing does not filter it by language
            (the worker's own check, which sees the request, does).
        fallback: True: a rung of this engine gives no real answer, only a stand-in (VAD's
            ``skip``, YOLO's ``motion``), unless the rung says otherwise (``Rung.fallback``): a
            job takes it only after failing on the rungs above (``tasks.runtime.ladder_choice``).
    """

    target: str
    params: type[Params] = NoParams
    needs: tuple[str, ...] = ()
    extra: str | None = None
    weights: str | None = None
    languages: Callable[[Any, Path | None, Any], Any] | None = None
    languages_by_request: bool = False
    fallback: bool = False

    def missing(self) -> str | None:
        """Which package of ``needs`` this pool lacks, and how to install it; None if it has them all."""
        for module in self.needs:
            if not _installed(module):
                install = f": pip install 'mediafarm[{self.extra}]'" if self.extra else ""
                return f"package {module!r} is not installed on this pool{install}"
        return None

    def unavailable(self, rung: Rung, models_dir: Path | None = None, *, packages_checked: bool = False) -> str | None:
        """Why this pool cannot run ``rung`` at all, or None if it can. With ``models_dir``, the
        rung's weights (``weights``) must be there too. ``packages_checked``: the caller has just
        found ``missing()`` None (a judge of many rungs of one engine looks packages up once)."""
        missing = None if packages_checked else self.missing()
        if missing:
            return missing
        if rung.device == "cuda" and not _gpu_visible():
            return "rung needs a GPU and this pool has none (CUDA_VISIBLE_DEVICES is empty, or no NVIDIA device)"
        if models_dir is not None and self.weights is not None:
            return missing_model(models_dir, getattr(self.parse_params(rung), self.weights))
        return None

    def parse_params(self, rung: Rung) -> Params:
        """The rung's parameters as the engine's model; ConfigFileError naming the rung if they do not fit."""
        try:
            return self.params.model_validate(dict(rung.params))
        except ValidationError as exc:
            raise ConfigFileError(
                f"rung {rung.name!r} (engine {rung.engine!r}): params do not fit: "
                + describe_validation_error(exc)
            ) from None

    def function(self) -> Callable[..., Any]:
        """The engine function (imports its module: call it in the pool child)."""
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)


def missing_model(models_dir: Path, relative: str) -> str | None:
    """Why the model file or folder ``relative`` cannot be had from ``models_dir``; None if it is there.
    (Both the rung's check before an attempt and ``EngineContext.model_path`` in the engine say so.)"""
    if (models_dir / relative).exists():
        return None
    return f"model {relative!r} is not in the models dir {models_dir} (FARM_MODELS_DIR)"


def _installed(module: str) -> bool:
    # find_spec imports a dotted name's parent package: a missing parent raises ImportError, a
    # broken one anything at all. Either way this pool cannot run the engine.
    try:
        return importlib.util.find_spec(module) is not None
    except Exception:  # noqa: BLE001
        return False


def _gpu_visible() -> bool:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        # Not set by `farm worker` (a plain `celery worker`): look for the devices themselves,
        # without touching CUDA in this process.
        return bool(glob.glob("/dev/nvidia[0-9]*"))
    return visible.strip() not in ("", "-1")


def _no_summary(result: BaseModel) -> str:
    return ""


def _no_render(result: BaseModel) -> Any:
    return None


@dataclass(frozen=True)
class FamilySpec:
    """Everything the farm needs to know about one job family.

    Attributes:
        name: The family (``vad``): its ladder's name, its queue unless ``queue`` says otherwise.
        task_name: The Celery task name, the wire contract (``farm.vad.detect``).
        request: The model a job's keyword arguments must fit (checked in the producer and again,
            with the media roots, in the worker).
        result: The model of the job's output.
        engines: Engine name → engine, as rungs name them.
        ladder: The default ladder, best rung first.
        limits: Time limits of one attempt.
        queue: The family queue (default: ``name``).
        summary: One line about a result for the CLI (model, duration ...).
        render: A rich renderable of a result for the CLI (a table of spans ...), or None.
        cli_argument: The request field that ``farm submit FAMILY ARG`` fills with ARG (None: the
            CLI takes every field as ``--param``). A ``MediaPath`` field is made absolute first.
        ladder_field: A request field that names which declared ladder of this family to run
            (pipelines and tests choose ladders per job); None: always the family's own.
        in_default_pools: Whether pools that consume ``*`` take this family's queue.
        description: One line for ``farm families`` and the docs.
        probe: A cheap look at the validated request's input (the file opens, the streams the
            family needs are there and start to decode), run in the pool child before the engine's
            module is imported and its model loaded, so a bad file is refused at once on a cold
            child. Raises a PermanentFailure naming the problem. It imports what it needs inside
            (a spec module stays light). None: nothing to look at beyond the request model.
        metrics: Numbers of the result the workers count into Prometheus metrics
            (:class:`~mediafarm.tasks.wire.result_metrics.ResultMetric`; YOLO's frame counters).
        cli: The family's own ``farm`` commands: ``module:attribute`` naming a ``typer.Typer``,
            which the CLI mounts under the Typer's ``name`` (the family's name if it has none) when
            it is built (``farm speakers``). The module is imported by every ``farm`` command, so
            it is light like the spec; None: the family has no commands of its own.
        language: The language of a parsed request (given, or detected from its text), an ISO
            639-1 code, or None when not known; rungs that cannot handle it are skipped
            (``tasks.wire.languages``). None: the family's jobs are not filtered by language.
        resume: How the family's jobs go on from a checkpoint after a lost attempt
            (:class:`~mediafarm.tasks.wire.checkpoint.Resume`: the unit, the rule, across which rungs);
            its engines write checkpoints with ``ctx.checkpoint``. None: every attempt starts over.
    """

    name: str
    task_name: str
    request: type[Request]
    result: type[BaseModel]
    engines: Mapping[str, EngineSpec]
    ladder: tuple[Rung, ...]
    limits: TimeLimits
    queue: str = ""
    summary: Callable[[Any], str] = _no_summary
    render: Callable[[Any], Any] = _no_render
    cli_argument: str | None = None
    ladder_field: str | None = None
    in_default_pools: bool = True
    description: str = ""
    probe: Callable[[Any], None] | None = None
    metrics: tuple[ResultMetric, ...] = ()
    cli: str | None = None
    language: Callable[[Any], str | None] | None = None
    resume: Resume | None = None
    _ladder: Ladder = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not FAMILY_NAME.match(self.name):
            raise ValueError(f"family name {self.name!r} must match {FAMILY_NAME.pattern}")
        if not TASK_NAME.match(self.task_name):
            raise ValueError(f"family {self.name!r}: task name {self.task_name!r} must match {TASK_NAME.pattern}")
        object.__setattr__(self, "engines", MappingProxyType(dict(self.engines)))
        object.__setattr__(self, "queue", self.queue or self.name)
        object.__setattr__(self, "_ladder", Ladder(self.name, self.name, tuple(self.ladder)))
        for name in filter(None, (self.cli_argument, self.ladder_field)):
            if name not in self.request.model_fields:
                raise ValueError(f"family {self.name!r}: {name!r} is not a field of {self.request.__name__}")
        problems = self.rung_problems(self._ladder)
        if problems:  # a mistake in the family's own code, found when it is imported
            raise ValueError(f"family {self.name!r}, default ladder: " + "; ".join(problems))
        object.__setattr__(self, "metrics", tuple(self.metrics))
        declared: dict[str, ResultMetric] = {}
        for metric in self.metrics:
            if metric.root_field() not in self.result.model_fields:
                raise ValueError(f"family {self.name!r}: metric {metric.name!r} reads {metric.path!r}, "
                                 f"and {metric.root_field()!r} is not a field of {self.result.__name__}")  # fmt: skip
            if declared.setdefault(metric.name, metric).shape != metric.shape:
                raise ValueError(f"family {self.name!r}: metric {metric.name!r} is declared twice, differently")
        if self.cli is not None and not re.match(r"^[\w.]+:\w+$", self.cli):
            raise ValueError(f"family {self.name!r}: cli {self.cli!r} must be 'module:attribute'")

    @property
    def default_ladder(self) -> Ladder:
        return self._ladder

    def commands(self) -> Any:
        """The family's ``typer.Typer`` of commands (``cli``, imported), or None."""
        if self.cli is None:
            return None
        module, _, name = self.cli.partition(":")
        return getattr(importlib.import_module(module), name)

    @property
    def cli_argument_is_path(self) -> bool:
        """Is the CLI's positional argument a file path (a ``MediaPath`` field)?"""
        return self.cli_argument is not None and self.cli_argument in self.media_fields

    @property
    def media_fields(self) -> tuple[str, ...]:
        """The request fields that name an input file (``MediaPath``), which the worker resolves
        inside the media roots."""
        return tuple(
            name for name, info in self.request.model_fields.items()
            if any(getattr(m, "func", None) is _media_resolved for m in info.metadata)
        )  # fmt: skip

    def rung_problems(self, ladder: Ladder) -> list[str]:
        """What is wrong with ``ladder``'s rungs for this family (unknown engine, params that do not fit)."""
        problems = []
        for rung in ladder.rungs:
            engine = self.engines.get(rung.engine)
            if engine is None:
                problems.append(
                    f"rung {rung.name!r} names an unknown engine {rung.engine!r}; "
                    f"the {self.name} family has {sorted(self.engines)}"
                )
                continue
            try:
                engine.parse_params(rung)
            except ConfigFileError as exc:
                problems.append(str(exc))
        return problems

    def parse_request(self, fields: Mapping[str, Any], media_roots: list[Path] | None = None,
                      fetch_media: Callable[[str], Path] | None = None) -> Request:  # fmt: skip
        """The job's fields as the request model, or InvalidRequest naming each problem.

        With ``media_roots`` (in the worker) media paths are resolved and checked too, raising
        the media failures (``MediaNotFound`` ...) themselves, and media named by URL is fetched
        with ``fetch_media`` (URL -> local copy).
        """
        context = None if media_roots is None else {"media_roots": media_roots, "fetch_media": fetch_media}
        try:
            return self.request.model_validate(dict(fields), context=context)
        except ValidationError as exc:
            raise InvalidRequest.of_fields(self.name, validation_problems(exc)) from None

    def parse_result(self, output: Mapping[str, Any]) -> BaseModel:
        """A stored output (the envelope's ``output``) as the result model."""
        return self.result.model_validate(dict(output))
