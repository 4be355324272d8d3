"""A dialogue script: what a producer may send, checked line by line before anything is sent.

A script is ``{"lines": [{"speaker": "alice", "text": "Hello."}, ...]}``, or the bare list, or
the path of a JSON file holding either (read by the producer: ``farm submit dialogue
script.json``). Lines are numbered from 1, in errors, in the line jobs' ids (``<id>.line-0003``)
and in ``dialogue.json``. Every problem names its line: ``line 3: text: is empty ...``.

Light on purpose (a spec module imports it): pydantic, json and the TTS text rules only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from mediafarm.tasks.families.tts.speakers import NAME_PATTERN
from mediafarm.tasks.families.tts.text import check_text
from mediafarm.tasks.kit import describe_validation_error

# A dialogue of 500 lines is ~30-40 minutes of speech; each line is a farm job of its own, and the
# fan-in counts them in Redis. Longer scripts are several dialogues.
MAX_LINES = 500
# One line is one turn of speech (a paragraph at most); longer monologues are TTS jobs of their own.
MAX_LINE_CHARS = 2_000
# A script file is read whole by the producer: 500 lines of 2,000 characters, with room for JSON.
MAX_FILE_BYTES = 4 * 1024 * 1024


def _line_text(text: str) -> str:
    check_text(text)
    if len(text) > MAX_LINE_CHARS:
        raise ValueError(f"is {len(text):,} characters; a dialogue line holds at most {MAX_LINE_CHARS:,}")
    return text


class DialogueLine(BaseModel):
    """One line: who says it (a registered TTS speaker; ``default`` always exists) and what."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    speaker: str = Field(pattern=NAME_PATTERN)
    text: Annotated[str, AfterValidator(_line_text)]


def _problem(message: str) -> PydanticCustomError:
    # A custom error's message is shown as is (a ValueError's gets pydantic's "Value error, ").
    return PydanticCustomError("dialogue_script", message)


def _read_file(path: str) -> Any:
    file = Path(path)
    try:
        size = file.stat().st_size
        if size > MAX_FILE_BYTES:
            raise _problem(f"script file {path} is {size:,} bytes; at most {MAX_FILE_BYTES:,}")
        # utf-8-sig: a byte-order mark (Windows editors write one) is skipped, not refused as "not JSON".
        text = file.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise _problem(f"cannot read the script file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise _problem(f"script file {path} is not UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _problem(f"script file {path} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def load_script(value: Any) -> tuple[DialogueLine, ...]:
    """``value`` (a file path, ``{"lines": [...]}`` or a list) as checked lines; a pydantic error
    naming the line (and field) that does not fit, so the request reports it as ``script``'s."""
    if isinstance(value, str | Path):
        value = _read_file(str(value))
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"lines"})
        if unknown:
            shape = '{"lines": [{"speaker": ..., "text": ...}]}'
            raise _problem(f"unknown key(s) {unknown}; a script is {shape}")
        if "lines" not in value:
            raise _problem('has no "lines"')
        value = value["lines"]
    if not isinstance(value, list | tuple):
        raise _problem(f'must be a list of lines (or {{"lines": [...]}}), got {type(value).__name__}')
    if not value:
        raise _problem("has no lines; there is nothing to say")
    if len(value) > MAX_LINES:
        raise _problem(f"has {len(value):,} lines; a dialogue holds at most {MAX_LINES} (split it into several)")
    lines = []
    for number, item in enumerate(value, 1):
        if isinstance(item, DialogueLine):
            lines.append(item)
            continue
        if not isinstance(item, dict):
            raise _problem(f"line {number}: must be an object with speaker and text, got {type(item).__name__}")
        try:
            lines.append(DialogueLine.model_validate(item))
        except ValidationError as exc:
            raise _problem(f"line {number}: {describe_validation_error(exc)}") from None
    return tuple(lines)


def line_job_id(job_id: str, number: int) -> str:
    """The id of line ``number``'s TTS job (from 1): derived, so a re-submit under the same
    dialogue id names the same jobs."""
    return f"{job_id}.line-{number:04d}"
