"""The worker's log says what happened: a pipeline that ends because a part was refused or cancelled
is not an error of the farm's.

Celery logs a chord whose part failed for good (``Chord ... raised: ChordError("Dependency ...
raised ...")``) at ERROR with the traceback of its ``ChordError``, the part's failure chained
under it: a pipeline with one malformed line wrote a rejection and an error with two tracebacks
(issue #18 item 2). The part has logged its own line (``FarmTask.run_job``: one WARNING for a
rejection, one INFO for a cancel); the chord's consequence is logged at INFO without a traceback.
A part that failed any other way (an engine error, a bug) keeps Celery's ERROR and traceback.
"""

from __future__ import annotations

import logging

from celery.exceptions import ChordError, TaskRevokedError

from mediafarm.tasks.errors import Cancelled, PermanentFailure

# The loggers of Celery's result backends that log a chord's failure (the Redis one, and the base
# class's join for the others).
CHORD_LOGGERS = ("celery.backends.redis", "celery.backends.base")
# A part that ended this way has said so itself.
_ENDED_BY_ITS_PART = (PermanentFailure, Cancelled, TaskRevokedError)


class ChordOfAnEndedPart(logging.Filter):
    """Turns Celery's ERROR for a chord whose part was refused or cancelled into an INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, ChordError) and isinstance(exc.__cause__, _ENDED_BY_ITS_PART):
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
            record.exc_info, record.exc_text = None, None
        return True


def install() -> None:
    """Attach the filter in the worker's main process, before it forks its pool children."""
    for name in CHORD_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ChordOfAnEndedPart) for f in logger.filters):
            logger.addFilter(ChordOfAnEndedPart())
