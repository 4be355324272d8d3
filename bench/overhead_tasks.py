"""The bare Celery baseline of bench/overhead.py: a no-op task with no farm machinery at all.

It carries the same soft time limit as the farm task: that is a Celery setting every farm job has,
and billiard's timeout bookkeeping is not farm machinery. (The farm's hard limit is the watchdog's.)
"""

from mediafarm.tasks import registry
from mediafarm.tasks.app import app

SOFT_LIMIT = registry.limits_for(registry.get("chaos")).soft


@app.task(name="bench.bare_noop", soft_time_limit=SOFT_LIMIT)
def bare_noop(ladder: str = "noop", plan: dict | None = None) -> dict:
    return {}


@app.task(name="bench.bare_untracked", soft_time_limit=SOFT_LIMIT, track_started=False)
def bare_untracked(ladder: str = "noop", plan: dict | None = None) -> dict:
    """The strictest baseline: no STARTED write either (the farm's attempt record replaces it)."""
    return {}
