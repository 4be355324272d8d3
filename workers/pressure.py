"""The worker's memory reading of its pool, published for admission control (``tasks.producer.admission``).

Producers run elsewhere and cannot see a pool's memory, so each worker's main process writes what
it sees to Redis every second (``keys.pressure``: a field per worker, expiring when the pool goes
quiet): memory available to the worker (the host's, or its memory cgroup's limit minus usage,
whichever is smaller), where NVML sees GPUs the free memory of the pool's, and the queues the
worker consumes (whose jobs that memory would run). The memory cgroup is the one the worker
started in (containers and systemd units start it there); a worker moved to another one later is
not followed. Admission compares
it with the pool's thresholds (``[admission.pools.<pool>]``); so does a ladder that steps down
under pressure.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import redis
from celery import bootsteps
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from mediafarm.config.pools import Pool, get_pool
from mediafarm.config.settings import get_settings
from mediafarm.tasks.producer.admission import Reading, publish_reading
from mediafarm.tasks.runtime.oom_killer import locate_memory_cgroup, parse_count, parse_limit
from mediafarm.workers import fork_gate, nvml

log = logging.getLogger("mediafarm.pressure")
MB = 1024 * 1024
INTERVAL_S = 1.0
# cgroup version → (limit file, usage file, the memory.stat field of reclaimable page cache).
_CGROUP_FILES = {
    1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
    2: ("memory.max", "memory.current", "inactive_file"),
}


def _read(path: str | Path) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def cgroup_memory(directory: str, version: int) -> tuple[int, int] | None:
    """(limit, bytes available under it) of a memory cgroup; None without a limit.

    Usage counts the page cache, which the kernel reclaims before it kills anything: its inactive
    file pages count as available, as the kernel's own ``MemAvailable`` counts them for the host.
    """
    limit_file, usage_file, inactive_field = _CGROUP_FILES[version]
    limit = parse_limit(_read(os.path.join(directory, limit_file)) or "")
    usage_text = _read(os.path.join(directory, usage_file))
    if limit is None or usage_text is None:
        return None
    inactive = parse_count(_read(os.path.join(directory, "memory.stat")) or "", inactive_field) or 0
    return limit, max(0, limit - int(usage_text) + inactive)


class GpuMemory:
    """Free and total memory of GPUs through NVML (nvidia-ml-py), where it is installed and a driver
    answers; nothing otherwise. The main process never touches CUDA: NVML does not create a context."""

    def __init__(self) -> None:
        self._nvml: Any = nvml.nvml()

    def read(self, indices: tuple[int, ...]) -> dict[str, list[float]]:
        if self._nvml is None:
            return {}
        out = {}
        for index in indices:
            try:
                info = nvml.memory(index)
            except Exception:  # a GPU gone or not visible: say nothing rather than something wrong
                continue
            out[str(index)] = [round(info.free / MB, 1), round(info.total / MB, 1)]
        return out


def read_memory(cgroup: tuple[int, str] | None) -> tuple[float, float]:
    """(available, total) MiB for this worker: the smaller of the host's and its cgroup's."""
    vm = psutil.virtual_memory()
    available, total = vm.available, vm.total
    if cgroup is not None:
        limited = cgroup_memory(cgroup[1], cgroup[0])
        if limited is not None and limited[0] < total:
            total, available = limited[0], min(available, limited[1])
    return available / MB, total / MB


class PressureReporter(bootsteps.StartStopStep):
    """A thread in the worker's main process that publishes the pool's memory reading every second."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.pool: Pool = get_pool(get_settings().pool)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, worker: Any) -> None:
        cgroup_text, mountinfo = _read("/proc/self/cgroup"), _read("/proc/self/mountinfo")
        cgroup = locate_memory_cgroup(cgroup_text, mountinfo) if cgroup_text and mountinfo else None
        client = redis.Redis.from_url(get_settings().backend_url, socket_timeout=1, socket_connect_timeout=1)
        # What this worker takes (its pool's queues, or --queues): the jobs its memory speaks for.
        queues = tuple(sorted(worker.app.amqp.queues.consume_from or ()))
        self._thread = fork_gate.start_thread(self._run, "farm-pressure", (worker.hostname, client, cgroup, queues))

    def stop(self, worker: Any) -> None:
        self._stop.set()

    def _run(self, node: str, client: Any, cgroup: tuple[int, str] | None, queues: tuple[str, ...]) -> None:
        with fork_gate.held():  # NVML's module is imported here
            gpus = GpuMemory()
        failing = False
        while True:
            # One reading inside the fork gate (``workers.fork_gate``): it calls Redis and may log.
            with fork_gate.held():
                failing = self._publish(node, client, cgroup, queues, gpus, failing)
            if self._stop.wait(INTERVAL_S):
                return

    def _publish(
        self, node: str, client: Any, cgroup: tuple[int, str] | None, queues: tuple[str, ...], gpus: GpuMemory,
        failing: bool,
    ) -> bool:
        """Publish one reading; whether it failed (a failure is logged once until one goes out)."""
        try:
            available, total = read_memory(cgroup)
            reading = Reading(node, time.time(), available, total, gpus.read(self.pool.gpus), queues)
            publish_reading(client, self.pool.name, reading)
            return False
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            # Redis away (a restart): admission then sees no reading, and takes work. One line
            # per outage, as Celery's own consumer says it; no traceback for what is no bug.
            if not failing:
                log.warning("could not publish the memory reading of pool %s: %s", self.pool.name, exc)
        except Exception:  # anything else is a bug: its traceback, once until a reading goes out
            if not failing:
                log.warning("could not publish the memory reading of pool %s", self.pool.name, exc_info=True)
        return True


def install(app: Any) -> None:
    app.steps["worker"].add(PressureReporter)
