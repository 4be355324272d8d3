"""Downgrade ladders: per job family, the ordered variants, best first, cheapest last.

A job runs on the rung given by the number of resource failures it has had (see
``tasks.ladder``). Each variant names an *engine* (the code that runs it, registered in
``tasks.engines``) and that engine's parameters. Operators change a ladder in the
``[ladders.<family>]`` table of ``FARM_CONFIG_FILE``::

    [ladders.vad]
    rungs = [
      { name = "silero-onnx", engine = "silero", params = { threshold = 0.5 } },
      { name = "skip", engine = "skip" },
    ]
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from config.file import ConfigFileError, section


@dataclass(frozen=True)
class Variant:
    """One rung of a ladder.

    Attributes:
        name: What the result and the history call this rung (``silero-onnx``).
        engine: The registered engine that runs it (``silero``).
        params: Engine parameters, JSON-safe.
        device: ``cpu`` or ``cuda``; a ``cuda`` rung is unavailable on a pool without a GPU.
    """

    name: str
    engine: str
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    device: str = "cpu"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "engine": self.engine, "params": dict(self.params), "device": self.device}


@dataclass(frozen=True)
class Ladder:
    """The variants of one family, best first."""

    family: str
    rungs: tuple[Variant, ...]

    def __post_init__(self) -> None:
        if not self.rungs:
            raise ConfigFileError(f"ladder {self.family!r} has no rungs")
        names = [v.name for v in self.rungs]
        if len(set(names)) != len(names):
            raise ConfigFileError(f"ladder {self.family!r} names a rung twice: {names}")

    def __len__(self) -> int:
        return len(self.rungs)


def _v(name: str, engine: str, device: str = "cpu", **params: Any) -> Variant:
    return Variant(name=name, engine=engine, params=MappingProxyType(params), device=device)


DEFAULT_LADDERS: dict[str, Ladder] = {
    "vad": Ladder(
        "vad",
        (
            # Streaming silero over PyAV blocks; one ONNX thread per child, so concurrency = cores.
            _v("silero-onnx", "silero", threshold=0.5, min_silence_ms=300, speech_pad_ms=30),
            # webrtcvad: a few MB, no torch; coarser boundaries.
            _v("webrtc", "webrtc", aggressiveness=2, min_silence_ms=300, min_speech_ms=150),
            # The camera filter's --skip-vad: no spans, result flagged, the pipeline goes on.
            _v("skip", "skip"),
        ),
    ),
}


def _variant_from_table(family: str, row: Any) -> Variant:
    if not isinstance(row, dict) or "name" not in row or "engine" not in row:
        raise ConfigFileError(f"[ladders.{family}] each rung needs at least name and engine, got {row!r}")
    params = row.get("params", {})
    if not isinstance(params, dict):
        raise ConfigFileError(f"[ladders.{family}] rung {row['name']!r}: params must be a table")
    return Variant(
        name=str(row["name"]),
        engine=str(row["engine"]),
        params=MappingProxyType(dict(params)),
        device=str(row.get("device", "cpu")),
    )


@functools.lru_cache(maxsize=64)
def get_ladder(family: str) -> Ladder:
    """The ladder of ``family``: the operator's if the config file declares one, else the default.

    Cached for the life of the process: a worker reads its configuration once, at start.
    """
    override = section("ladders").get(family)
    if override is not None:
        rungs = override.get("rungs") if isinstance(override, dict) else None
        if not isinstance(rungs, list):
            raise ConfigFileError(f"[ladders.{family}] needs a list `rungs`")
        return Ladder(family, tuple(_variant_from_table(family, r) for r in rungs))
    try:
        return DEFAULT_LADDERS[family]
    except KeyError:
        raise ConfigFileError(f"no ladder declared for job family {family!r}") from None
