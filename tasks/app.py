"""The one Celery app of the farm, plain: producers import it to send and to read results.

Every registered family (``tasks.families``) gets its task here. A family's spec module is light
(pydantic models, names); its engines are imported only in a pool child, on first use, so a
producer that imports this module pulls no media or model package.

Workers run the same app through :data:`WORKER_ENTRY` (``celery -A mediafarm.workers.app worker``,
or ``farm worker``), which adds the worker-side guards and metrics. Nothing here imports them: a
producer never loads the watchdog, psutil or prometheus-client. A worker started on this module
instead would run without the memory watchdog and the configuration check, so it refuses to start.
"""

from __future__ import annotations

import sys
from typing import Any

from celery import Celery, signals

from mediafarm.config.celery import celery_config
from mediafarm.config.settings import get_settings
from mediafarm.tasks import families
from mediafarm.tasks.base import make_task

# The module a worker must be started with; importing it wires the guards into this same app.
WORKER_ENTRY = "mediafarm.workers.app"

app = Celery("mediafarm")
app.config_from_object(celery_config(get_settings()))
for _spec in families.load().values():
    make_task(app, _spec)


def _refuse_a_worker_without_guards(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """``celeryd_init`` / ``worker_init``: stop a worker of this app that was not started through
    :data:`WORKER_ENTRY`. A SystemExit, because Celery logs and ignores a receiver's Exception."""
    worker = instance if instance is not None else sender
    if getattr(worker, "app", None) is not app or WORKER_ENTRY in sys.modules:
        return
    raise SystemExit(
        f"refusing to start: a farm worker must be started with `celery -A {WORKER_ENTRY} worker` (or "
        f"`farm worker`), which installs the memory watchdog, the configuration check and the metrics; "
        f"{__name__} is the producers' plain app"
    )


signals.celeryd_init.connect(_refuse_a_worker_without_guards, weak=False)
signals.worker_init.connect(_refuse_a_worker_without_guards, weak=False)
