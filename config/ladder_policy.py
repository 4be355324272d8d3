"""What a ladder does under load: its rung circuit breaker and whether it steps down under memory pressure.

Declared in ``FARM_CONFIG_FILE``: defaults for every ladder in ``[breaker]``, and per ladder
beside (or instead of) its rungs. A ladders table without ``rungs`` sets the policy of a family's
own ladder and leaves its rungs as the family declares them::

    [breaker]                           # every ladder (these are the defaults)
    enabled = true
    failures = 3                        # resource failures of one rung on one pool ...
    window_s = 60                       # ... within this many seconds open its breaker
    cooldown_s = 30                     # new jobs start on the next rung this long, then one probes

    [ladders.tts]                       # the tts family's own ladder: policy only
    breaker = { cooldown_s = 120 }
    step_down_under_pressure = true     # under memory pressure, new jobs start one rung lower

    [ladders.vad]
    breaker = { enabled = false }

The breaker itself is ``tasks.runtime.breaker``; the pressure reading is the admission control's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from mediafarm.config.file import ConfigFileError, section, table_over

# The keys of a ladders table that are policy, not rungs (``config.ladders`` skips a table of only these).
POLICY_KEYS = frozenset({"breaker", "step_down_under_pressure"})


@dataclass(frozen=True)
class BreakerPolicy:
    """When a rung's breaker opens, and for how long.

    Attributes:
        enabled: False: the ladder's rungs never open a breaker (every job meets every rung).
        failures: Resource failures (killed, oom, cuda_oom, timeout) of one rung on one pool ...
        window_s: ... within this many seconds that open its breaker.
        cooldown_s: Seconds new jobs start past the open rung; after them one job (the probe)
            runs it again: its success closes the breaker, its resource failure opens it anew.
        refresh_s: Seconds a worker child may act on the breakers' state it last read (one Redis
            read per child and pool at most this often; a probe's claim is always atomic in Redis).
    """

    enabled: bool = True
    failures: int = 3
    window_s: float = 60.0
    cooldown_s: float = 30.0
    refresh_s: float = 1.0

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise ConfigFileError(f"failures must be >= 1, got {self.failures}")
        for name in ("window_s", "cooldown_s", "refresh_s"):
            if getattr(self, name) < 0:
                raise ConfigFileError(f"{name} must be >= 0, got {getattr(self, name)}")

    def describe(self) -> str:
        if not self.enabled:
            return "off"
        return f"{self.failures} in {self.window_s:g} s, cool-down {self.cooldown_s:g} s"


@dataclass(frozen=True)
class LadderPolicy:
    """Attributes: breaker (its rungs' breaker), step_down_under_pressure (new jobs start one rung
    lower while the pool's memory is under pressure, instead of being refused)."""

    breaker: BreakerPolicy = BreakerPolicy()
    step_down_under_pressure: bool = False


def default_breaker() -> BreakerPolicy:
    """The ``[breaker]`` table over the built-in defaults."""
    return table_over(BreakerPolicy(), section("breaker"), "[breaker]")


@functools.lru_cache(maxsize=64)
def ladder_policy(ladder: str) -> LadderPolicy:
    """The policy of the ladder named ``ladder`` (a family's name for its own ladder).

    Cached for the life of the process, as the ladders are.

    Raises:
        ConfigFileError: a key of the ladder's table has the wrong shape.
    """
    table = section("ladders").get(ladder)
    if not isinstance(table, dict):
        return LadderPolicy(default_breaker())
    breaker = default_breaker()
    if "breaker" in table:
        breaker = table_over(breaker, table["breaker"], f"[ladders.{ladder}] breaker")
    step_down = table.get("step_down_under_pressure", False)
    if not isinstance(step_down, bool):
        raise ConfigFileError(f"[ladders.{ladder}] step_down_under_pressure must be true or false")
    return LadderPolicy(breaker, step_down)
