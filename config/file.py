"""The optional operator file (``FARM_CONFIG_FILE``, TOML) that overrides declared pools and ladders."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import Any

from mediafarm.config.settings import get_settings


class ConfigFileError(ValueError):
    """The operator file is missing, unreadable or has a field of the wrong shape."""


@functools.lru_cache(maxsize=4)
def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigFileError(f"FARM_CONFIG_FILE={path}: cannot read it ({exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"FARM_CONFIG_FILE={path}: not valid TOML ({exc})") from exc


def section(name: str) -> dict[str, Any]:
    """One top-level table of the operator file, or ``{}`` when there is no file or no such table."""
    path = get_settings().config_file
    if path is None:
        return {}
    table = _read(Path(path)).get(name, {})
    if not isinstance(table, dict):
        raise ConfigFileError(f"FARM_CONFIG_FILE={path}: [{name}] must be a table")
    return table
