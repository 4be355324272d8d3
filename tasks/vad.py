"""The VAD job: speech spans of an audio or video file. A thin adapter over ``tasks.engines.vad``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from config.ladders import Variant
from config.queues import Family
from config.settings import get_settings
from tasks.app import app
from tasks.base import FarmTask, farm_task_options
from tasks.media.paths import resolve_media


@app.task(**farm_task_options(Family.VAD))
def detect(self: FarmTask, media: str) -> dict[str, Any]:
    """Speech spans of ``media`` (a path inside the media roots).

    Output: ``{"spans": [{"start", "end"}], "duration", "model", "vad_skipped"}`` in seconds.
    """

    def run_variant(variant: Variant, engine: Callable[..., Any]) -> dict[str, Any]:
        path = resolve_media(media, get_settings().media_roots)
        return engine(path, **variant.params).to_json()

    return self.run_job(run_variant)
