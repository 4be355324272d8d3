"""FarmTask: the Celery task base every job family uses.

It does three things and nothing else: picks the rung (via ``tasks.ladder``), turns a
``RetryRequest`` into Celery's retry under the same id, and makes sure a ``MemoryError``
never reaches Celery (which would shut the whole worker down).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Task
from redis.exceptions import RedisError

from config.ladders import Variant, get_ladder
from config.queues import Family, time_limits
from config.settings import get_settings
from tasks.errors import ResourceFailure, TransientFailure
from tasks.history import AttemptLog
from tasks.ladder import RetryRequest, run_ladder


class FarmTask(Task):
    """Base of the farm's tasks. Subclass attributes: ``family``."""

    family: str = ""
    # Celery's per-task default is 180 s: a downgrade should run at once. FARM_RETRY_DELAY.
    default_retry_delay = 0
    # Set per task in ``farm_task_options``; bounded by the ladder in any case.
    max_retries = 8
    # The attempt record written as the job starts replaces Celery's STARTED write (one Redis round
    # trip a job saved): JobHandle.state() reports STARTED from it, and the worker still sends
    # task-started events for Flower.
    track_started = False
    # Enforced by the worker's watchdog with a SIGKILL, so an overrun moves the job down a rung
    # (``workers.limits``). Celery's own ``time_limit`` would fail the job instead.
    farm_hard_limit: float | None = None

    def run_job(
        self, run_variant: Callable[[Variant, Callable[..., Any]], dict[str, Any]], *, ladder: str | None = None
    ) -> dict[str, Any]:
        """Run this job on its rung; the family adapter supplies ``run_variant``.

        ``ladder`` names another declared ladder than the family's (pipelines, tests).
        """
        settings = get_settings()
        request = self.request
        redelivered = bool((request.delivery_info or {}).get("redelivered"))
        fresh = not (redelivered or request.retries)
        try:
            if not fresh:
                stored = self.backend.get_task_meta(request.id)
                if stored.get("status") == "SUCCESS":
                    # Its worker died between storing the result and acking the message: the job
                    # is done, and running it again would only redo the work.
                    return stored["result"]
            outcome = run_ladder(
                job_id=request.id,
                ladder=get_ladder(ladder or self.family),
                log=AttemptLog(self.backend.client, request.id, ttl=int(self.app.conf.result_expires)),
                retries=request.retries,
                worker=request.hostname or "",
                transient_budget=settings.transient_retries,
                run_variant=run_variant,
                fresh=fresh,
            )
        except MemoryError:
            # Outside the engine (the engine's own are mapped in run_ladder); Celery must never see
            # one. The open attempt, if any, is settled by the next run as a lost child: one rung down.
            outcome = RetryRequest("MemoryError outside the engine", ResourceFailure("MemoryError", outcome="oom"))
        except RedisError as exc:
            # The attempt log or result backend failed (a broker hiccup), not the job: same rung,
            # bounded by max_retries; the retry itself goes through the same Redis, so a Redis that
            # stays down ends the job FAILED rather than looping.
            outcome = RetryRequest(f"Redis error: {exc}", TransientFailure(f"Redis error: {exc}"))
        if isinstance(outcome, RetryRequest):
            raise self.retry(exc=outcome.exc, countdown=settings.retry_delay)
        return outcome


def farm_task_options(family: Family) -> dict[str, Any]:
    """Decorator options shared by every family's task: base, name, limits, retry bound."""
    from config.queues import TASK_NAMES

    limits = time_limits()[family.value]
    ladder = get_ladder(family.value)
    return {
        "bind": True,
        "base": FarmTask,
        "name": TASK_NAMES[family],
        "family": family.value,
        "soft_time_limit": limits.soft,
        "farm_hard_limit": limits.hard,
        # One attempt per rung plus the same-rung budget, plus one to report the exhausted ladder.
        "max_retries": len(ladder) + get_settings().transient_retries,
        "default_retry_delay": get_settings().retry_delay,
    }
