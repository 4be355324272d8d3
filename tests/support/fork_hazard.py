"""Makes the threads of a worker's main process import and log all the time (the fork-gate test).

Named in the worker's ``--include``, so it is imported in the worker's main process before the
pool forks its first child. It wraps what the farm's own threads do in each unit of work (the
watchdog's poll, the pressure reporter's publish, the metrics reader's batch, a scrape's collect)
so that each also imports :data:`TARGET` anew and writes log lines: exactly the work that left a
child forked in its middle holding a lock it can never release. The jobs of the test import the
same module in the child (``tests.support.chaos.import_probe``), which hangs there if it was
forked while a thread held that module's import lock; the gate (``workers.fork_gate``) must make
that impossible. Test-only: nothing of the farm names this module.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mediafarm.workers import guards, job_metrics, pressure

TARGET = "tests.support.fork_hazard_target"
log = logging.getLogger("tests.fork_hazard")
_count = itertools.count()
_one_at_a_time = threading.Lock()


def hazard(where: str) -> None:
    """Import TARGET afresh (its body runs, holding its module lock) and log, as a lazy import and
    a log line of a farm thread do."""
    with _one_at_a_time:  # two threads popping and importing the same name race each other
        sys.modules.pop(TARGET, None)
        importlib.import_module(TARGET)
    log.info("hazard %d in %s", next(_count), where)


def _wrapped(function: Callable[..., Any], where: str) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        hazard(where)
        return function(*args, **kwargs)

    return wrapper


class _HazardCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        hazard("scrape")
        yield GaugeMetricFamily("mediafarm_test_fork_hazards", "Hazards so far (fork-gate test)", value=0)


guards.MemoryWatchdog._poll = _wrapped(guards.MemoryWatchdog._poll, "watchdog")  # type: ignore[method-assign]
pressure.PressureReporter._publish = _wrapped(pressure.PressureReporter._publish, "pressure")  # type: ignore[method-assign]
pressure.INTERVAL_S = 0.02
job_metrics.EndReader.count_many = _wrapped(job_metrics.EndReader.count_many, "metrics")  # type: ignore[method-assign]
REGISTRY.register(_HazardCollector())
