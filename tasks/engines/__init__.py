"""Engine registry: what code runs a ladder rung, and whether this pool can run it at all.

A rung names an engine; the engine is a plain function importable as ``module:function``.
Nothing heavy is imported here: the module is imported in the child on first use, and
availability is decided from installed packages and visible GPUs without importing them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from config.ladders import Variant


@dataclass(frozen=True)
class Engine:
    """Attributes: target (``module:function``), needs (import names that must be installed)."""

    target: str
    needs: tuple[str, ...] = ()

    def unavailable(self, variant: Variant) -> str | None:
        """Why this pool cannot run ``variant`` with this engine, or None if it can."""
        for module in self.needs:
            if importlib.util.find_spec(module) is None:
                return f"package {module!r} is not installed on this pool"
        if variant.device == "cuda":
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            if visible in ("", "-1"):
                return "variant needs a GPU and this pool has none (CUDA_VISIBLE_DEVICES is empty)"
        return None

    def load(self) -> Callable[..., Any]:
        module, _, func = self.target.partition(":")
        return getattr(importlib.import_module(module), func)


ENGINES: dict[str, Engine] = {
    "silero": Engine("tasks.engines.vad:silero_spans", needs=("silero_vad", "onnxruntime", "av")),
    "webrtc": Engine("tasks.engines.vad:webrtc_spans", needs=("webrtcvad", "av")),
    "skip": Engine("tasks.engines.vad:skipped", needs=("av",)),
}


def get_engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        from tasks.errors import PermanentFailure

        raise PermanentFailure(f"ladder names an unknown engine {name!r}; known: {sorted(ENGINES)}") from None


def register_engine(name: str, engine: Engine) -> None:
    """Add an engine (a plugin's, or a test's). Names are global to the farm."""
    ENGINES[name] = engine
