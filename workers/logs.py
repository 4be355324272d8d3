"""The worker's log says what happened, once: a pipeline that ends because a part was refused or
cancelled is not an error of the farm's, and a child the watchdog killed is one WARNING line.

Celery logs a chord whose part failed for good (``Chord ... raised: ChordError("Dependency ...
raised ...")``) at ERROR with the traceback of its ``ChordError``, the part's failure chained
under it: a pipeline with one malformed line wrote a rejection and an error with two tracebacks
(issue #18 item 2). The part has logged its own line (``FarmTask.run_job``: one WARNING for a
rejection, one INFO for a cancel); the chord's consequence is logged at INFO without a traceback.
A part that failed any other way (an engine error, a bug) keeps Celery's ERROR and traceback.

billiard logs every pool child that ends on a signal at ERROR (``Process 'ForkPoolWorker-3'
pid:26851 exited with 'signal 9 (SIGKILL)'``). For a child the watchdog killed, its own WARNING
(``workers.guards``: why, the RSS and cap, the job) already said so: that second line is INFO. A
child killed by anything else (the kernel OOM killer, an operator) keeps billiard's ERROR.
"""

from __future__ import annotations

import logging

from celery.exceptions import ChordError, TaskRevokedError

from mediafarm.tasks.wire.errors import Cancelled, PermanentFailure

# The loggers of Celery's result backends that log a chord's failure (the Redis one, and the base
# class's join for the others).
CHORD_LOGGERS = ("celery.backends.redis", "celery.backends.base")
# A part that ended this way has said so itself.
_ENDED_BY_ITS_PART = (PermanentFailure, Cancelled, TaskRevokedError)
# billiard's pool logs through multiprocessing's logger (billiard.util.LOGGER_NAME), this message.
POOL_LOGGER = "multiprocessing"
_CHILD_EXIT = "Process %r pid:%r exited with %r"
# Pids the watchdog killed whose exit billiard has not logged yet (a handful at most: each is
# dropped when its exit is logged).
_killed_by_watchdog: set[int] = set()


def killed_by_watchdog(pid: int) -> None:
    """The watchdog killed this child and logged why (called in the main process)."""
    _killed_by_watchdog.add(pid)


class ChordOfAnEndedPart(logging.Filter):
    """Turns Celery's ERROR for a chord whose part was refused or cancelled into an INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, ChordError) and isinstance(exc.__cause__, _ENDED_BY_ITS_PART):
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
            record.exc_info, record.exc_text = None, None
        return True


class ExitOfAKilledChild(logging.Filter):
    """Turns billiard's ERROR for the exit of a child the watchdog killed into an INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg == _CHILD_EXIT and len(args) == 3 and args[1] in _killed_by_watchdog:
            _killed_by_watchdog.discard(args[1])
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def install() -> None:
    """Attach the filters in the worker's main process, before it forks its pool children."""
    for name, kind in [*((n, ChordOfAnEndedPart) for n in CHORD_LOGGERS), (POOL_LOGGER, ExitOfAKilledChild)]:
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())
