"""Downgrade ladders as the operator declares them: ordered rungs, best first, cheapest last.

A job runs on the rung given by the resource failures it has had (``tasks.runtime.downgrade``). Each
rung names an *engine* of its family (``FamilySpec.engines``) and that engine's parameters.
Every family declares a default ladder in its own folder; operators replace it, or add named
ladders a family can be asked to use, in ``FARM_CONFIG_FILE``::

    [ladders.vad]                       # replaces the vad family's default ladder
    rungs = [
      { name = "silero-onnx", engine = "silero", params = { threshold = 0.5 } },
      { name = "skip", engine = "skip" },   # a fallback: its engine declares it (or say fallback = true)
    ]

    [ladders.vad-fast]                  # a named ladder of the vad family
    family = "vad"
    rungs = [{ name = "webrtc", engine = "webrtc" }]

Whether each rung names a real engine with parameters it accepts is checked when a worker
starts (``tasks.families.ladder_problems``): a mistake there stops the worker, naming the rung.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from mediafarm.config.file import ConfigFileError, section
from mediafarm.config.ladder_policy import POLICY_KEYS, default_breaker, ladder_policy

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Rung:
    """One rung of a ladder.

    Attributes:
        name: What the result and the history call this rung (``silero-onnx``).
        engine: The family's engine that runs it (``silero``).
        params: Engine parameters, JSON-safe; checked against the engine's parameter model.
        device: ``cpu`` or ``cuda``; a ``cuda`` rung is unavailable on a pool without a GPU.
        languages: The languages the rung speaks or recognises, as the operator states them
            (``languages = ["en", "fr"]`` in farm.toml: a fine-tuned model whose folder tells
            nothing); None: what its engine tells (``tasks.wire.languages``).
        fallback: True: the rung gives no real answer, only a stand-in (VAD ``skip``: no spans;
            YOLO ``motion``: no detections), so a job takes it only after failing on the rungs
            above, never because their breakers are open or the pool is under pressure
            (``tasks.runtime.ladder_choice``). False: a cheaper answer. None: what its engine declares
            (``EngineSpec.fallback``).
    """

    name: str
    engine: str
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    device: str = "cpu"
    languages: tuple[str, ...] | None = None
    fallback: bool | None = None

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ConfigFileError(f"rung {self.name!r}: device must be one of {DEVICES}, got {self.device!r}")

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "engine": self.engine, "params": dict(self.params), "device": self.device}
        if self.fallback is not None:
            out["fallback"] = self.fallback
        return out if self.languages is None else {**out, "languages": list(self.languages)}


def rung(name: str, engine: str, device: str = "cpu", *, fallback: bool | None = None, **params: Any) -> Rung:
    """A rung, written the short way in a family's default ladder."""
    return Rung(name=name, engine=engine, params=MappingProxyType(params), device=device, fallback=fallback)


@dataclass(frozen=True)
class Ladder:
    """An ordered list of rungs, best first.

    Attributes:
        name: The ladder's name: its family's name, or a named ladder's own.
        family: The job family whose engines its rungs name.
        rungs: The rungs.
    """

    name: str
    family: str
    rungs: tuple[Rung, ...]

    def __post_init__(self) -> None:
        if not self.rungs:
            raise ConfigFileError(f"ladder {self.name!r} has no rungs")
        names = [v.name for v in self.rungs]
        if len(set(names)) != len(names):
            raise ConfigFileError(f"ladder {self.name!r} names a rung twice: {names}")

    def __len__(self) -> int:
        return len(self.rungs)

    @property
    def identity(self) -> str:
        """The name the ladder's breakers and policy go by. A job that asks to start from one of its
        family's rungs runs the family's ladder from there (``registry.ladder_for``: "tts from
        chattts-cpu"); its rungs are the family ladder's, and so are their breakers and policy."""
        return self.name.partition(" from ")[0]


def _rung_from_table(ladder: str, row: Any) -> Rung:
    if not isinstance(row, dict) or "name" not in row or "engine" not in row:
        raise ConfigFileError(f"[ladders.{ladder}] each rung needs at least name and engine, got {row!r}")
    unknown = set(row) - {"name", "engine", "params", "device", "languages", "fallback"}
    if unknown:
        raise ConfigFileError(f"[ladders.{ladder}] rung {row['name']!r}: unknown keys {sorted(unknown)}")
    params = row.get("params", {})
    if not isinstance(params, dict):
        raise ConfigFileError(f"[ladders.{ladder}] rung {row['name']!r}: params must be a table")
    languages = row.get("languages")
    if languages is not None and (
        not isinstance(languages, list) or not languages or not all(isinstance(x, str) and x for x in languages)
    ):
        raise ConfigFileError(f"[ladders.{ladder}] rung {row['name']!r}: languages must be a list of language codes")
    fallback = row.get("fallback")
    if fallback is not None and not isinstance(fallback, bool):
        raise ConfigFileError(f"[ladders.{ladder}] rung {row['name']!r}: fallback must be true or false")
    try:
        device = str(row.get("device", "cpu"))
        return Rung(str(row["name"]), str(row["engine"]), MappingProxyType(dict(params)), device,
                    tuple(languages) if languages is not None else None, fallback)  # fmt: skip
    except ConfigFileError as exc:
        raise ConfigFileError(f"[ladders.{ladder}] {exc}") from None


@functools.lru_cache(maxsize=8)
def declared_ladders() -> Mapping[str, Ladder]:
    """The operator file's ``[ladders.<name>]`` tables, by name.

    Cached for the life of the process: a worker reads its configuration once, at start.
    """
    ladders = {}
    default_breaker()  # a mistake in [breaker] stops the worker at start too, not every job it runs
    for name, table in section("ladders").items():
        ladder_policy(name)  # a mistake in its breaker or step-down stops the worker at start, as one in its rungs
        if isinstance(table, dict) and "rungs" not in table and set(table) <= POLICY_KEYS:
            continue  # the policy of a family's own ladder (config.ladder_policy); its rungs stay
        rungs = table.get("rungs") if isinstance(table, dict) else None
        if not isinstance(rungs, list):
            raise ConfigFileError(f"[ladders.{name}] needs a list `rungs`")
        family = table.get("family", name)
        if not isinstance(family, str):
            raise ConfigFileError(f"[ladders.{name}] family must be a string")
        ladders[name] = Ladder(name, family, tuple(_rung_from_table(name, r) for r in rungs))
    return MappingProxyType(ladders)
