"""Time limits of one attempt of a job, and the operator's overrides of them.

Each family declares its own defaults (``FamilySpec.limits``); operators override them in the
``[limits.<family>]`` tables of ``FARM_CONFIG_FILE``::

    [limits.vad]
    soft = 600
    hard = 660
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
    """

    soft: int
    hard: int

    def __post_init__(self) -> None:
        if not 0 < self.soft < self.hard:
            raise ConfigFileError(f"time limits need 0 < soft < hard, got soft={self.soft} hard={self.hard}")


def limit_overrides() -> dict[str, TimeLimits]:
    """The operator file's ``[limits.<family>]`` tables."""
    limits = {}
    for family, table in section("limits").items():
        try:
            limits[family] = TimeLimits(soft=int(table["soft"]), hard=int(table["hard"]))
        except (KeyError, TypeError, ValueError):
            raise ConfigFileError(f"[limits.{family}] needs integer soft and hard, got {table!r}") from None
        except ConfigFileError as exc:
            raise ConfigFileError(f"[limits.{family}]: {exc}") from None
    return limits
