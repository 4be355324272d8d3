"""Names of queues, tasks and keys, and the routing table: declared once, used everywhere.

Task names are stable strings (``farm.<family>.<verb>``) so a producer that does not install
mediafarm can still send a job by name with any Celery or kombu client.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Family(StrEnum):
    """A job family: one kind of media job, one ladder, one family queue."""

    VAD = "vad"
    YOLO = "yolo"
    TTS = "tts"
    SUBTITLE = "subtitle"


TASK_NAMES: dict[Family, str] = {
    Family.VAD: "farm.vad.detect",
    Family.YOLO: "farm.yolo.detect",
    Family.TTS: "farm.tts.synthesize",
    Family.SUBTITLE: "farm.subtitle.transcribe",
}

# Family queues are what producers send to. A GPU pool also consumes `gpu<N>.<family>` so that a
# producer can ask for affinity (the GPU that already holds a speaker's embedding, say) by queue.
FAMILY_QUEUES: tuple[str, ...] = tuple(f.value for f in Family)


def gpu_queue(gpu: int, family: Family | str) -> str:
    """The affinity queue of one family on one GPU, e.g. ``gpu0.tts``."""
    return f"gpu{gpu}.{Family(family).value}"


# Routing: every task goes to its family queue unless the producer names another queue.
TASK_ROUTES: dict[str, dict[str, str]] = {name: {"queue": fam.value} for fam, name in TASK_NAMES.items()}


@dataclass(frozen=True)
class TimeLimits:
    """Per-family time limits of one attempt, in seconds.

    Attributes:
        soft: Raises SoftTimeLimitExceeded in the task: a resource failure, the job moves down.
        hard: The child is killed; must stay below the broker's visibility timeout.
    """

    soft: int
    hard: int


# One attempt of a job, not the whole ladder. VAD streams at RTF < 0.01: 6 h of audio is ~4 min.
# Operators override them in `[limits.<family>]` of FARM_CONFIG_FILE (see `time_limits`).
TIME_LIMITS: dict[str, TimeLimits] = {
    Family.VAD.value: TimeLimits(soft=1800, hard=1900),
    Family.YOLO.value: TimeLimits(soft=3600, hard=3700),
    Family.TTS.value: TimeLimits(soft=600, hard=660),
    Family.SUBTITLE.value: TimeLimits(soft=3600, hard=3700),
}


def time_limits() -> dict[str, TimeLimits]:
    """Declared limits with the operator file's ``[limits.<family>]`` tables applied."""
    from config.file import ConfigFileError, section

    limits = dict(TIME_LIMITS)
    for family, table in section("limits").items():
        try:
            limits[family] = TimeLimits(soft=int(table["soft"]), hard=int(table["hard"]))
        except (KeyError, TypeError, ValueError):
            raise ConfigFileError(f"[limits.{family}] needs integer soft and hard, got {table!r}") from None
        if not 0 < limits[family].soft < limits[family].hard:
            raise ConfigFileError(f"[limits.{family}]: need 0 < soft < hard, got {table!r}")
    return limits

# Redis keys the farm writes beside Celery's own (result backend database).
KEY_PREFIX = "mediafarm"


def history_key(job_id: str) -> str:
    """Attempt history of one job: a Redis list of JSON attempts, oldest first."""
    return f"{KEY_PREFIX}:attempts:{job_id}"


def kill_key(job_id: str) -> str:
    """Why the watchdog killed the child running a job, written before the SIGKILL."""
    return f"{KEY_PREFIX}:kill:{job_id}"
