"""The bare Celery baseline of bench/overhead.py: a no-op task with no farm machinery at all.

It carries the same time limits as the farm task: those are Celery settings every farm job has,
and billiard's timeout bookkeeping is not farm machinery.
"""

from config.queues import time_limits
from tasks.app import app


@app.task(name="bench.bare_noop", soft_time_limit=time_limits()["chaos"].soft, time_limit=time_limits()["chaos"].hard)
def bare_noop(ladder: str = "noop", plan: dict | None = None) -> dict:
    return {}
