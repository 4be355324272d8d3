"""The worker entry: ``celery -A mediafarm.workers.app worker`` (what ``farm worker`` runs).

It is the farm's one app (``mediafarm.tasks.app``, which producers import as it is) with a task
for every registered family and the worker side wired in: the guards (configuration check, memory
watchdog, child set-up: ``workers.guards``), the metered request class, which counts a finished job's frame counters
in the worker's main process (``workers.metrics``), its capability (``workers.capability``: it
consumes only the queues of families it can run, and says in Redis what it can run), the pool's
memory reading for admission control (``workers.pressure``), what it holds for the pools' scaling
signal (``workers.load``), and the router that sends farm tasks left on
Celery's default queue by clients with no farm configuration on to their families' queues
(``workers.foreign``), the drain (``workers.drain``), the lost-message sweep (``workers.lost_sweep``),
and the webhook dispatcher it starts beside it (``workers.webhook_dispatch``). A worker started on
the plain app imports this module too (the plain app names it in Celery's ``imports``, which only a
worker reads).
"""

from __future__ import annotations

from mediafarm.tasks.app import app
from mediafarm.tasks.runtime.base import FarmTask, register_tasks
from mediafarm.workers import (
    capability,
    drain,
    foreign,
    guards,
    handback,
    load,
    logs,
    lost_sweep,
    pressure,
    webhook_dispatch,
)
from mediafarm.workers.metrics import MeteredRequest

__all__ = ["app"]

# A task for every registered family: the app a producer imports has none.
register_tasks(app)
# Read by each task's strategy as the worker starts consuming, after this module has run.
FarmTask.Request = MeteredRequest
guards.install(app)
# Each worker publishes its pool's memory reading, which admission control reads (``workers.pressure``).
pressure.install(app)
# Each worker leaves out the queues of families it can run no rung of, and says what it can run.
capability.install(app)
# Each worker says what it holds (reserved, running, its slots): the pools' scaling signal (``workers.load``).
load.install(app)
# Each Redis worker beats; a peer silent past the grace has its jobs handed back (``workers.handback``).
handback.install(app)
# A job message lost in kombu's fetch (Redis) is published again, once a period for the farm (``workers.lost_sweep``).
lost_sweep.install(app)
# `farm drain` and SIGTERM stop taking jobs, wait FARM_DRAIN_SECONDS, hand back the rest (``workers.drain``).
drain.install(app)
# Farm tasks that plain Celery clients left on Celery's default queue go on to their families' queues.
foreign.install(app)
# Each worker starts a webhook dispatcher beside it, a process of its own (``workers.webhook_dispatch``).
webhook_dispatch.install(app)
# A pipeline ended by a refused or cancelled part is logged as such, not as an error (``workers.logs``).
logs.install()
