"""The one Celery app of the farm, plain: producers import it to send and to read results.

It registers no task. A producer sends by task name (``FamilySpec.task_name``), so it needs none,
and importing this module loads nothing of the worker side of a job (``tasks/runtime/``). A worker
gets a task for every registered family from its entry, :data:`WORKER_ENTRY`, which calls
:func:`~mediafarm.tasks.runtime.base.register_tasks` on this same app and wires in the worker side
(the memory watchdog, the configuration check, child set-up, metrics). A worker loads that entry
whichever module it was started with: ``celery -A mediafarm.workers.app worker`` and ``farm
worker`` import it first, and a worker started on this module (``celery -A mediafarm.tasks.app
worker``, as earlier versions said) imports it through Celery's ``imports`` setting, which only a
worker reads, before it builds its bootsteps.
"""

from __future__ import annotations

import time
from typing import Any

from celery import Celery, signals

from mediafarm.config.celery import celery_config
from mediafarm.config.settings import get_settings
from mediafarm.tasks import sent_ledger
from mediafarm.tasks.wire.trace import SENT_HEADER

# The worker side of this app: importing it wires the guards and metrics into this same app.
WORKER_ENTRY = "mediafarm.workers.app"

# No fix-ups: Celery's only built-in one (Django's) imports celery.worker, the worker's bootsteps,
# into every process that builds an app, and the farm runs no Django.
# Its AMQP part keeps every farm task's message published on Redis until the job ends (``tasks/sent_ledger.py``).
app = Celery("mediafarm", fixups=(), amqp=sent_ledger.LedgerAMQP)
app.config_from_object(celery_config(get_settings()))
# Read by workers only (Celery's loader, at worker start): never by a producer.
app.conf.imports = (*app.conf.imports, WORKER_ENTRY)


def _stamp_sent(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Stamp the message's ``SENT_HEADER``: the Unix time it was sent (a submit, or a retry), from
    which a worker's metrics take the job's wait in the queue (``workers.job_metrics``) and the
    job's trace starts (``tasks.wire.trace``)."""
    # Always overwritten: a retry carries its delivery's headers on, and its wait starts now.
    if headers is not None:
        headers[SENT_HEADER] = time.time()


signals.before_task_publish.connect(_stamp_sent, weak=False)
