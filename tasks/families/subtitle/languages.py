"""The languages the subtitle rungs recognise (``tasks.wire.languages`` is the seam).

- A Whisper model in CTranslate2 format: English only when its folder says ``.en`` or its
  vocabulary is smaller than a multilingual Whisper's (51,865 tokens: the size CTranslate2 and
  faster-whisper tell one by; tiny.en's has 51,864 and still lists every language token), else
  the languages of its ``<|xx|>`` tokens. Not known (None: any) when the folder is not there.
- pocketsphinx: the languages of the models its package ships (``model/en-us``).

A job's language is its request's ``language``; without one every rung may take it and the
recogniser's own detection is the result's ``language``.

Light: reads files only (every farm process imports the spec that names these).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

# faster-whisper's Whisper.is_multilingual: CTranslate2 says so from the vocabulary's size.
MULTILINGUAL_VOCABULARY = 51_865
_LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2,3})\|>$")


def request_language(request: Any) -> str | None:
    """The subtitle job's language (``FamilySpec.language``): the request's, or None (detected by the rung)."""
    return request.language


def _vocabulary(folder: Path) -> list[str] | None:
    text_file, json_file = folder / "vocabulary.txt", folder / "vocabulary.json"
    try:
        if text_file.exists():
            return text_file.read_text(encoding="utf-8").splitlines()
        if json_file.exists():
            tokens = json.loads(json_file.read_text(encoding="utf-8"))
            return tokens if isinstance(tokens, list) else None
    except (OSError, ValueError):
        return None
    return None


@functools.lru_cache(maxsize=32)
def _model_languages(folder: Path, mtime: float) -> tuple[str, ...] | None:
    tokens = _vocabulary(folder)
    if tokens is None:
        return None
    if len(tokens) < MULTILINGUAL_VOCABULARY:
        return ("en",)
    return tuple(m.group(1) for t in tokens if (m := _LANGUAGE_TOKEN.match(t)))


def whisper_languages(params: Any, models_dir: Path | None, request: Any) -> tuple[str, ...] | None:
    if re.search(r"\.en$", params.model.rstrip("/")):
        return ("en",)
    if models_dir is None:
        return None
    folder = models_dir / params.model
    try:
        mtime = folder.stat().st_mtime
    except OSError:
        return None  # absent: the weights check says so
    return _model_languages(folder.resolve(), mtime)


def pocketsphinx_languages(params: Any, models_dir: Path | None, request: Any) -> list[str] | None:
    spec = importlib.util.find_spec("pocketsphinx")
    if spec is None or not spec.submodule_search_locations:
        return None
    models = Path(next(iter(spec.submodule_search_locations))) / "model"
    found = [p.name for p in models.iterdir() if p.is_dir()] if models.is_dir() else []
    return found or None
