"""Worker-side guards, installed on the app as Celery bootsteps and signal handlers.

- ``ConfigCheck``: the worker refuses to start on an unsafe configuration.
- ``MemoryWatchdog``: a thread in the worker's MAIN process polls the pool children and
  SIGKILLs one whose RSS passes the pool's cap, after writing down why (job id, RSS, cap) where
  the job's next attempt reads it. Celery 5.7 then retries the job under the same id
  (``task_retry_on_worker_lost``) and the ladder moves it one rung down.
  ``worker_max_memory_per_child`` cannot do this: it recycles a child only after its job ends.
- Child set-up (``worker_process_init``): ``oom_score_adj`` 1000 so the kernel's OOM killer takes
  a child, never the main process; per-child GPU pinning for a pool that spans GPUs.
- ``farm_main_process`` inspect command: proves the main process never imported torch.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import psutil
from celery import bootsteps, signals
from celery.worker.control import inspect_command

from config.celery import check_config
from config.pools import Pool, get_pool
from config.settings import get_settings

log = logging.getLogger("mediafarm.watchdog")
MB = 1024 * 1024


class ConfigCheck(bootsteps.Step):
    """Refuse to start a worker whose configuration would lose or duplicate jobs."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        # The task modules are imported by now, so their own hard limits are checked too.
        task_limits = {name: task.time_limit for name, task in worker.app.tasks.items() if task.time_limit}
        check_config(worker.app.conf, task_limits)
        super().__init__(worker, **kwargs)


def _job_on(pid: int) -> tuple[str, str] | None:
    """(job id, task name) of the request a pool child is running, from the worker's own state."""
    from celery.worker import state

    for _ in range(3):
        try:
            for request in list(state.active_requests):
                if request.worker_pid == pid:
                    return request.id, request.name
            return None
        except RuntimeError:  # the set changed while we copied it; look again
            continue
    return None


class MemoryWatchdog(bootsteps.StartStopStep):
    """Per-child RSS cap enforced while the job runs."""

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        settings = get_settings()
        self.pool: Pool = get_pool(settings.pool)
        self.interval = settings.watchdog_interval
        self.cap = self.pool.child_rss_cap_mb * MB if self.pool.child_rss_cap_mb else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.kills = 0

    def start(self, worker: Any) -> None:
        if self.cap is None:
            log.info("watchdog off: pool %s has no child_rss_cap_mb", self.pool.name)
            return
        self._thread = threading.Thread(target=self._run, args=(worker,), name="farm-watchdog", daemon=True)
        self._thread.start()
        log.info("watchdog on: pool %s, child RSS cap %d MiB", self.pool.name, self.pool.child_rss_cap_mb)

    def stop(self, worker: Any) -> None:
        self._stop.set()

    def _run(self, worker: Any) -> None:
        me = psutil.Process()
        while not self._stop.wait(self.interval):
            try:
                children = me.children()
            except psutil.Error:
                continue
            for child in children:
                try:
                    rss = child.memory_info().rss
                except psutil.Error:
                    continue
                if self.cap is not None and rss > self.cap:
                    self._kill(worker, child.pid, rss)

    def _kill(self, worker: Any, pid: int, rss: int) -> None:
        job = _job_on(pid)
        reason = (
            f"watchdog: child RSS {rss / MB:.0f} MiB passed the pool {self.pool.name!r} cap of "
            f"{self.pool.child_rss_cap_mb} MiB"
        )
        if job is not None:
            from tasks.history import record_kill

            job_id, _name = job
            record = {"pid": pid, "rss_mb": round(rss / MB, 1), "cap_mb": self.pool.child_rss_cap_mb,
                      "reason": reason, "at": time.time(), "worker": worker.hostname}
            try:
                record_kill(worker.app.backend.client, job_id, record, ttl=int(worker.app.conf.result_expires))
            except Exception:  # the kill matters more than its record
                log.exception("could not record the kill reason of job %s", job_id)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.kills += 1
        log.warning("%s; killed pid %d (job %s)", reason, pid, job[0] if job else "none")
        from workers.metrics import CHILD_KILLS

        CHILD_KILLS.labels(pool=self.pool.name, reason="rss_cap").inc()


def _on_child_start(**_: Any) -> None:
    """In each new pool child, before it runs any job."""
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:  # not Linux, or a sandbox that forbids it: the cap still protects us
        pass
    pool = get_pool(get_settings().pool)
    if len(pool.gpus) > 1:
        from billiard.process import current_process

        # A replacement child gets the index of the one it replaces, so it keeps the same GPU.
        index = current_process().index
        os.environ["CUDA_VISIBLE_DEVICES"] = str(pool.gpus[index % len(pool.gpus)])


@inspect_command()
def farm_main_process(state: Any) -> dict[str, Any]:
    """What the worker's main process has loaded: it must never hold torch or a CUDA context."""
    torch = sys.modules.get("torch")
    cuda_initialized = bool(torch is not None and torch.cuda.is_initialized())
    return {
        "pid": os.getpid(),
        "torch_imported": torch is not None,
        "cuda_initialized": cuda_initialized,
        "pool": get_settings().pool,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def install(app: Any) -> None:
    """Attach the farm's bootsteps and child set-up to ``app``."""
    app.steps["worker"].add(ConfigCheck)
    app.steps["worker"].add(MemoryWatchdog)
    signals.worker_process_init.connect(_on_child_start, weak=False)
