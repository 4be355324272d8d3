"""Time limits of one attempt of a job, and the operator's overrides of them.

Each family declares its own defaults (``FamilySpec.limits``); operators override them in the
``[limits.<family>]`` tables of ``FARM_CONFIG_FILE``::

    [limits.vad]
    soft = 600
    hard = 660
    stall = 60

A table may name only some of them; the others keep the family's.
"""

from __future__ import annotations

from dataclasses import dataclass

from mediafarm.config.file import ConfigFileError, section


@dataclass(frozen=True)
class TimeLimits:
    """Time limits of one attempt, in seconds.

    Attributes:
        soft: Raises SoftTimeLimitExceeded in the task: a resource failure, the job moves down.
        hard: The watchdog kills the child: the job moves down. Must stay below the broker's
            visibility timeout (the worker refuses to start otherwise).
        stall: The watchdog kills a child that gave no sign of life (``tasks.runtime.liveness``: the job's
            start, progress, partial outputs, checkpoints, cancel checks, ``ctx.alive()``) for this
            long: the attempt is ``stalled``, the same rung runs once more, a second stall moves
            the job down. Set above the family's longest model load and engine step. Default 300.
    """

    soft: int
    hard: int
    stall: int = 300

    def __post_init__(self) -> None:
        if not 0 < self.soft < self.hard:
            raise ConfigFileError(f"time limits need 0 < soft < hard, got soft={self.soft} hard={self.hard}")
        if self.stall <= 0:
            raise ConfigFileError(f"the stall timeout must be > 0, got stall={self.stall}")


LIMIT_NAMES = ("soft", "hard", "stall")


def limit_overrides() -> dict[str, dict[str, int]]:
    """The operator file's ``[limits.<family>]`` tables: the limits each names, as integers
    (the family's own ``TimeLimits`` fill in the rest and check the whole)."""
    limits = {}
    for family, table in section("limits").items():
        unknown = sorted(set(table) - set(LIMIT_NAMES)) if isinstance(table, dict) else None
        if unknown is None or unknown or not table:
            raise ConfigFileError(f"[limits.{family}] takes integer {', '.join(LIMIT_NAMES)}, got {table!r}")
        try:
            limits[family] = {name: int(value) for name, value in table.items()}
        except (TypeError, ValueError):
            raise ConfigFileError(f"[limits.{family}] takes integer {', '.join(LIMIT_NAMES)}, got {table!r}") from None
    return limits
