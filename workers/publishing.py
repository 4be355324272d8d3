"""A thread of the worker's main process that writes one of its records to Redis at a steady beat.

The capability record (``workers.capability``) and the load record (``workers.load``) are written
alike: under the fork gate (a Redis call and maybe a log line must not be under way as a child is
forked, ``workers.fork_gate``), a Redis away logged once per outage, a bug's traceback once until a
write goes out again, and the next beat whatever happened.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from mediafarm.workers import fork_gate


def publish_every(stop: threading.Event, interval: float, step: Callable[[], None], what: str,
                  log: logging.Logger) -> None:  # fmt: skip
    """Run ``step`` every ``interval`` seconds until ``stop`` is set (``what``: the record, for the log)."""
    failing = False
    while not stop.is_set():
        with fork_gate.held():
            try:
                step()
                failing = False
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                if not failing:
                    log.warning("could not publish this worker's %s: %s", what, exc)
                failing = True
            except Exception:  # a bug: its traceback, once until a record goes out
                if not failing:
                    log.warning("could not publish this worker's %s", what, exc_info=True)
                failing = True
        stop.wait(interval)
