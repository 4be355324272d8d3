"""The one Celery app of the farm. Producers import it to send; workers to run.

Every registered family (``tasks.families``) gets its task here. A family's spec module is light
(pydantic models, names); its engines are imported only in a pool child, on first use, so a
producer that imports this module pulls no media or model package.
"""

from __future__ import annotations

from celery import Celery

from mediafarm.config.celery import celery_config
from mediafarm.config.settings import get_settings
from mediafarm.tasks import families
from mediafarm.tasks.base import make_task
from mediafarm.workers.guards import install as install_worker_guards

app = Celery("mediafarm")
app.config_from_object(celery_config(get_settings()))
# The worker-side guards (configuration check, memory watchdog, child set-up) are part of the
# app, so a worker started with plain `celery -A mediafarm.tasks.app worker` gets them too.
install_worker_guards(app)
for _spec in families.load().values():
    make_task(app, _spec)
