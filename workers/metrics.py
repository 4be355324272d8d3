"""Prometheus metrics of a worker's main process, served on ``FARM_METRICS_PORT`` (0: off).

Task states and runtimes come from Flower's ``/metrics``; these are what only the farm knows:
which children it killed and why, how close the children run to their cap, and the numbers the
families declare of their results (``FamilySpec.metrics``: what the motion gate of a video family
saved), counted from each finished job's output.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from celery.worker.request import Request
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from mediafarm.tasks import families
from mediafarm.tasks.family import FamilySpec

log = logging.getLogger("mediafarm.metrics")

CHILD_KILLS = Counter(
    "mediafarm_child_kills_total", "Pool children SIGKILLed by the farm's watchdog", ["pool", "reason"]
)
CHILD_RSS_MAX = Gauge(
    "mediafarm_child_rss_max_bytes", "Largest RSS among the pool's children at the last watchdog poll", ["pool"]
)
CHILD_RSS_CAP = Gauge("mediafarm_child_rss_cap_bytes", "The pool's per-child RSS cap", ["pool"])


class ResultMetrics:
    """One Prometheus metric per name the families declare (``FamilySpec.metrics``), and the
    counting of a finished job's output into them.

    Families sharing a name declared it alike (the registry refuses otherwise), so the first
    declaration makes the metric.
    """

    def __init__(self, specs: Iterable[FamilySpec], registry: CollectorRegistry = REGISTRY) -> None:
        self._specs = {spec.name: spec for spec in specs}
        self._made: dict[str, Counter | Histogram] = {}
        for spec in self._specs.values():
            for m in spec.metrics:
                if m.full_name in self._made:
                    continue
                if m.kind == "counter":
                    self._made[m.full_name] = Counter(m.full_name, m.help, m.label_names, registry=registry)
                else:
                    self._made[m.full_name] = Histogram(m.full_name, m.help, m.label_names, buckets=m.buckets,
                                                        registry=registry)  # fmt: skip

    def counts(self, family: str) -> bool:
        """Does a job of ``family`` count anything (is its output worth reading back)?"""
        spec = self._specs.get(family)
        return spec is not None and bool(spec.metrics)

    def observe(self, envelope: Any) -> None:
        """Count a finished job's envelope: each declared number of its output into its metric."""
        if not isinstance(envelope, Mapping):
            return
        spec = self._specs.get(str(envelope.get("family", "")))
        if spec is None:
            return
        output = envelope.get("output") or {}
        job = {"family": spec.name, "variant": str(envelope.get("variant", ""))}
        for m in spec.metrics:
            value = m.value(output)
            if value is None:
                continue
            series = self._made[m.full_name].labels(**job, **dict(m.labels))
            if m.kind == "counter":
                series.inc(value)
            else:
                series.observe(value)


@functools.cache
def result_metrics() -> ResultMetrics:
    """The worker's metrics of every registered family's results (made once, on the default registry)."""
    return ResultMetrics(families.load().values())


def observe_job(envelope: Any) -> None:
    """Count a finished job's declared numbers (``FamilySpec.metrics``; YOLO's ``output.frames``)."""
    result_metrics().observe(envelope)


def _counts_results(task: Any) -> bool:
    spec = getattr(task, "spec", None)
    return spec is not None and result_metrics().counts(spec.name)


class _OutputReader:
    """Reads finished jobs' outputs from the result backend on a thread of the main process.

    The main process is told that a job succeeded, but not its output: a pool child sends only a
    short repr of it back (the output itself goes to the backend). Reading it back here, off the
    worker's event loop, costs one GET per job of a family that declares metrics, none for others,
    and a slow Redis delays only the metrics.
    """

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Any, str]] = queue.Queue(maxsize=10_000)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, app: Any, job_id: str) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="farm-metrics", daemon=True)
                self._thread.start()
        try:
            self._jobs.put_nowait((app, job_id))
        except queue.Full:
            log.warning("metrics reader is behind; job %s is not counted", job_id)

    def _run(self) -> None:
        while True:
            app, job_id = self._jobs.get()
            try:
                meta = app.backend.get_task_meta(job_id)
                if meta.get("status") == "SUCCESS":
                    observe_job(meta.get("result"))
            except Exception:  # noqa: BLE001 - metrics must never take the worker down
                log.warning("could not read the output of job %s for metrics", job_id, exc_info=True)


_READER = _OutputReader()


def _metered(on_success: Callable[..., Any]) -> Callable[..., Any]:
    """``on_success`` that also hands a successful job of a family that declares metrics to the reader."""

    @functools.wraps(on_success)
    def wrapper(self: Request, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        result = on_success(self, failed__retval__runtime, **kwargs)
        if not failed__retval__runtime[0] and _counts_results(self.task):
            _READER.submit(self.task.app, self.id)
        return result

    return wrapper


class MeteredRequest(Request):
    """Celery's request, whose ``on_success`` also feeds :func:`observe_job` (through the reader).

    ``on_success`` runs in the worker's MAIN process, the one whose registry is served; a counter
    raised in a pool child would never be scraped. The worker does not use this class as it is:
    it builds a subclass per task (``celery.worker.request.create_request_cls``) with an
    ``on_success`` of its own that does not call ours, so every subclass's is wrapped too.
    """

    on_success = _metered(Request.on_success)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "on_success" in cls.__dict__:
            cls.on_success = _metered(cls.__dict__["on_success"])


def serve(port: int) -> None:
    """Expose the metrics over HTTP on loopback-or-all as the operator binds the container."""
    result_metrics()  # every declared metric listed from the start, before its first job
    if port:
        start_http_server(port)
