"""The bare Celery baseline of bench/overhead.py: a no-op task with no farm machinery at all.

It carries the same soft time limit as the farm task: that is a Celery setting every farm job has,
and billiard's timeout bookkeeping is not farm machinery. (The farm's hard limit is the watchdog's.)
"""

from config.queues import time_limits
from tasks.app import app


@app.task(name="bench.bare_noop", soft_time_limit=time_limits()["chaos"].soft)
def bare_noop(ladder: str = "noop", plan: dict | None = None) -> dict:
    return {}


@app.task(name="bench.bare_untracked", soft_time_limit=time_limits()["chaos"].soft, track_started=False)
def bare_untracked(ladder: str = "noop", plan: dict | None = None) -> dict:
    """The strictest baseline: no STARTED write either (the farm's attempt record replaces it)."""
    return {}
