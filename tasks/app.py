"""The one Celery app of the farm. Producers import it to send; workers to run.

Task modules are listed in ``include`` and imported only by workers, so a producer that
imports this module pulls no media or model package.
"""

from __future__ import annotations

from celery import Celery

from config.celery import celery_config
from config.settings import get_settings

app = Celery("mediafarm", include=["tasks.vad"])
app.config_from_object(celery_config(get_settings()))

# The worker-side machinery (config check, memory watchdog, child set-up) is part of the app, so
# a worker started with plain `celery -A tasks.app worker` gets it too.
from workers.limits import install as _install_worker_steps  # noqa: E402

_install_worker_steps(app)
