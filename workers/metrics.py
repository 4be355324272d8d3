"""Prometheus metrics of a worker's main process, served on ``FARM_METRICS_PORT`` (0: off).

Task states and runtimes come from Flower's ``/metrics``; these are what only the farm knows:
which children it killed and why, how close the children run to their cap, and what the motion
gate of a video family saved.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

from celery.worker.request import Request
from prometheus_client import Counter, Gauge, Histogram, start_http_server

log = logging.getLogger("mediafarm.metrics")

CHILD_KILLS = Counter(
    "mediafarm_child_kills_total", "Pool children SIGKILLed by the farm's watchdog", ["pool", "reason"]
)
CHILD_RSS_MAX = Gauge(
    "mediafarm_child_rss_max_bytes", "Largest RSS among the pool's children at the last watchdog poll", ["pool"]
)
CHILD_RSS_CAP = Gauge("mediafarm_child_rss_cap_bytes", "The pool's per-child RSS cap", ["pool"])
# What a motion gate saved (Frigate publishes the same): counted from each finished job's output.
FRAMES = Counter(
    "mediafarm_frames_total", "Video frames of finished jobs, by what became of them", ["family", "variant", "fate"]
)
MODEL_MS_PER_FRAME = Histogram(
    "mediafarm_model_ms_per_frame", "Mean model time per examined frame, one observation per finished job",
    ["family", "variant"], buckets=(5, 10, 25, 50, 100, 250, 500, 1000, 2500),
)  # fmt: skip
FRAME_FATES = ("decoded", "examined", "skipped")


def observe_job(envelope: Any) -> None:
    """Count a finished job's frame counters (``output.frames``, as the yolo family reports them)."""
    if not isinstance(envelope, Mapping):
        return
    frames = (envelope.get("output") or {}).get("frames")
    if not isinstance(frames, Mapping):
        return
    labels = {"family": str(envelope.get("family", "")), "variant": str(envelope.get("variant", ""))}
    for fate in FRAME_FATES:
        FRAMES.labels(fate=fate, **labels).inc(int(frames.get(fate) or 0))
    if frames.get("model_ms_per_frame") is not None:
        MODEL_MS_PER_FRAME.labels(**labels).observe(float(frames["model_ms_per_frame"]))


def _counts_frames(task: Any) -> bool:
    spec = getattr(task, "spec", None)
    return spec is not None and "frames" in spec.result.model_fields


class _OutputReader:
    """Reads finished jobs' outputs from the result backend on a thread of the main process.

    The main process is told that a job succeeded, but not its output: a pool child sends only a
    short repr of it back (the output itself goes to the backend). Reading it back here, off the
    worker's event loop, costs one GET per job of a family that counts frames, none for others,
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
    """``on_success`` that also hands a successful job of a frame-counting family to the reader."""

    @functools.wraps(on_success)
    def wrapper(self: Request, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        result = on_success(self, failed__retval__runtime, **kwargs)
        if not failed__retval__runtime[0] and _counts_frames(self.task):
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
    if port:
        start_http_server(port)
