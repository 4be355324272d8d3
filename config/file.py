"""The optional operator file (``FARM_CONFIG_FILE``, TOML) that overrides declared pools and ladders."""

from __future__ import annotations

import functools
import tomllib
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, TypeVar

from mediafarm.config.settings import get_settings


class ConfigFileError(ValueError):
    """The operator file is missing, unreadable or has a field of the wrong shape."""


Settings = TypeVar("Settings")


def table_over(base: Settings, table: Any, where: str) -> Settings:
    """``base`` (a frozen dataclass of settings) with the values of an operator file's table.

    Each value must fit the type of the field's value in ``base``: a bool only true or false, an
    int a whole number, a float any number. ConfigFileError names the table (``where``, e.g.
    ``[breaker]``) and the key, for an unknown key, a value of the wrong type and what the
    dataclass's own checks refuse.
    """
    if not isinstance(table, dict):
        raise ConfigFileError(f"{where} must be a table")
    known = {f.name for f in fields(base)}  # type: ignore[arg-type]
    unknown = set(table) - known
    if unknown:
        raise ConfigFileError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
    values = {}
    for key, value in table.items():
        current, number = getattr(base, key), isinstance(value, int | float) and not isinstance(value, bool)
        if isinstance(current, bool):
            fits, wanted = isinstance(value, bool), "true or false"
        elif isinstance(current, int):
            fits, wanted = number and isinstance(value, int), "a whole number"
        elif isinstance(current, float):
            fits, wanted = number, "a number"
            value = float(value) if fits else value
        else:
            fits, wanted = True, ""
        if not fits:
            raise ConfigFileError(f"{where}: {key} must be {wanted}, got {value!r}")
        values[key] = value
    try:
        return replace(base, **values)  # type: ignore[type-var]
    except ConfigFileError as exc:
        raise ConfigFileError(f"{where}: {exc}") from None


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
