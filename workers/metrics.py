"""Prometheus metrics of a worker's main process, served on ``FARM_METRICS_PORT`` (0: off).

Everything is counted or read in the MAIN process, whose registry is the one served; pool
children count nothing themselves (their counters would die with them, and no scrape reaches
them). What a job did in its child reaches the main process through Redis: the attempt history
of each ended job (``workers.job_metrics``), the GPU children's allocator figures
(``workers.gpu_hygiene``). The watchdog's kills and the children's RSS are the main process's own.
Queue depths, breakers and admission refusals are read at scrape (``workers.collectors``), and
the pools' scaling signal (``tasks.producer.scaling_metrics``, which the gateway serves too). The
names and labels are in docs/operating.md ("Metrics").
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from celery.exceptions import Retry
from celery.worker.request import Request
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from mediafarm.config.pools import Pool
from mediafarm.tasks import registry as families
from mediafarm.tasks.producer import scaling_metrics
from mediafarm.tasks.wire.family import FamilySpec
from mediafarm.tasks.wire.records import rung_of
from mediafarm.workers import fork_gate
from mediafarm.workers.collectors import FarmState, GpuChildren, GpuMemory, QueueDepth
from mediafarm.workers.job_metrics import EndReader, JobMetrics

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
        rung = rung_of(envelope)[0]
        job = {"family": spec.name, "rung": rung, "variant": rung}
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


_JOBS: JobMetrics | None = None
BATCH = 200  # ended jobs read back in one round trip, at most


def job_metrics() -> JobMetrics:
    """The worker's job metrics (made once, on the default registry)."""
    global _JOBS
    if _JOBS is None:
        _JOBS = JobMetrics()
    return _JOBS


class _EndReader:
    """Reads ended jobs back from Redis on a thread of the main process and counts them
    (``workers.job_metrics``): their end, attempts, downgrades and times, and the numbers their
    families declare of their results.

    The main process is told that a job ended, but not its history nor its output: a pool child
    sends only a short repr of its result back. Reading them here, off the worker's event loop,
    costs two pipelined round trips per batch of the jobs that ended since the last one, and a
    slow Redis delays only the metrics. One app per worker: a batch is read through the first
    job's.
    """

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Any, str, str]] = queue.Queue(maxsize=10_000)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._ends: EndReader | None = None
        self._client: Any = None

    def submit(self, app: Any, job_id: str, family: str) -> None:
        with self._lock:
            if self._thread is None:
                self._ends = EndReader(job_metrics(), on_success=observe_job)
                self._thread = fork_gate.start_thread(self._run, "farm-metrics")
        try:
            self._jobs.put_nowait((app, job_id, family))
        except queue.Full:
            log.warning("metrics reader is behind; job %s is not counted", job_id)

    def _run(self) -> None:
        assert self._ends is not None
        while True:
            # What ended meanwhile goes in one batch: two round trips for them all.
            batch = [self._jobs.get()]
            while len(batch) < BATCH:
                try:
                    batch.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            app = batch[0][0]
            # One batch inside the fork gate (``workers.fork_gate``), through a client of its own
            # whose timeouts bound the hold (the backend's own client waits as long as Redis does).
            with fork_gate.held():
                try:
                    if self._client is None:
                        import redis

                        from mediafarm.config.settings import get_settings

                        self._client = redis.Redis.from_url(get_settings().backend_url, socket_timeout=1,
                                                            socket_connect_timeout=1)  # fmt: skip
                    self._ends.count_many(app.backend, [(job_id, family) for _, job_id, family in batch],
                                          int(app.conf.result_expires), client=self._client)  # fmt: skip
                except Exception:  # noqa: BLE001 - metrics must never take the worker down
                    log.warning("could not read %d ended jobs back for metrics", len(batch), exc_info=True)
                finally:
                    for _ in batch:
                        self._jobs.task_done()

    def drain(self, timeout: float = 5.0) -> None:
        """Wait until every job handed over so far is counted (tests; a scrape need not)."""
        deadline = time.monotonic() + timeout
        while self._jobs.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)


_READER = _EndReader()


def _family(request: Request) -> str | None:
    spec = getattr(request.task, "spec", None)
    return getattr(spec, "name", None)


# Set by ``serve``: nothing is read back for metrics nobody scrapes (FARM_METRICS_PORT=0).
_COUNTING = False


def _ended(request: Request) -> None:
    family = _family(request)
    if _COUNTING and family is not None:
        _READER.submit(request.task.app, request.id, family)


def _metered_success(on_success: Callable[..., Any]) -> Callable[..., Any]:
    """``on_success`` that also hands a job that ended well to the reader (a failed one goes
    through ``on_failure``, which Celery calls from here)."""

    @functools.wraps(on_success)
    def wrapper(self: Request, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        result = on_success(self, failed__retval__runtime, **kwargs)
        if not failed__retval__runtime[0]:
            _ended(self)
        return result

    return wrapper


class MeteredRequest(Request):
    """Celery's request, whose callbacks feed the job metrics (``workers.job_metrics``).

    The callbacks run in the worker's MAIN process, the one whose registry is served; a counter
    raised in a pool child would never be scraped (and would die with a killed child). A started
    job's queue wait is observed as a child accepts it; an ended job (success, failure, cancel;
    not a retry, which is no end) is read back from Redis by the reader thread. The worker does
    not use this class as it is: it builds a subclass per task
    (``celery.worker.request.create_request_cls``) with an ``on_success`` of its own that does not
    call ours, so every subclass's is wrapped too.
    """

    on_success = _metered_success(Request.on_success)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "on_success" in cls.__dict__:
            cls.on_success = _metered_success(cls.__dict__["on_success"])

    def on_accepted(self, pid: int, time_accepted: float) -> None:
        super().on_accepted(pid, time_accepted)
        family = _family(self)
        if family is not None and self.time_start:
            # Imported here: this module is imported by `farm up` before it has set the broker the
            # app is built for (the worker itself has built it long before a job is accepted).
            from mediafarm.tasks.app import SENT_HEADER

            job_metrics().observe_wait(family, self._request_dict.get(SENT_HEADER), self.time_start)

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> Any:
        result = super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        exc = getattr(exc_info.exception, "exc", exc_info.exception)  # ExceptionWithTraceback
        if not isinstance(exc, Retry):
            # Also a lost child retried by Celery: the reader counts only a job whose stored state
            # is an end (SUCCESS, FAILURE, REVOKED), and a retried one's is not.
            _ended(self)
        return result


def serve(port: int, worker: Any = None, pool: Pool | None = None) -> None:
    """Expose the metrics over HTTP (all addresses: bind the port as the container needs). Port 0:
    no endpoint, and ended jobs are not read back (a worker nobody scrapes pays nothing per job).

    With a running ``worker`` and its ``pool``, also the scrape-time collectors
    (``workers.collectors``): the depth of the queues it consumes, the pool's breakers and
    admission refusals, NVML's GPU memory and the GPU children's allocator figures, and the pools'
    scaling signal (``tasks.producer.scaling_metrics``).
    """
    global _COUNTING
    result_metrics()  # every declared metric listed from the start, before its first job
    job_metrics()
    if worker is not None and pool is not None:
        install_collectors(worker, pool)
    if port:
        _COUNTING = True
        _start_server(port)


class _QuietHandler(WSGIRequestHandler):
    """Logs no request (as prometheus_client's own handler). A client that sends nothing holds
    the server's one thread this long at most."""

    timeout = 10

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class _GatedServer(WSGIServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        with fork_gate.held():  # it prints a traceback
            super().handle_error(request, client_address)


def _start_server(port: int, registry: CollectorRegistry = REGISTRY) -> WSGIServer:
    """prometheus_client's WSGI server on all addresses, whose scrapes run inside the fork gate
    (``workers.fork_gate``): a scrape's collectors call Redis and log. One thread, a scrape at a
    time; reading the request and writing the answer stay outside the gate (plain socket I/O)."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        with fork_gate.held():
            return list(metrics(environ, start_response))

    httpd = make_server("0.0.0.0", port, app, _GatedServer, handler_class=_QuietHandler)
    fork_gate.start_thread(httpd.serve_forever, "farm-metrics-http")
    return httpd


_COLLECTORS: list[Any] = []


def install_collectors(worker: Any, pool: Pool, registry: CollectorRegistry = REGISTRY) -> None:
    """Register the scrape-time collectors of ``worker`` (once per process)."""
    if _COLLECTORS:
        return
    import redis

    from mediafarm.config.settings import get_settings

    client = redis.Redis.from_url(get_settings().backend_url, socket_timeout=1, socket_connect_timeout=1)
    app = worker.app
    _COLLECTORS.extend([
        QueueDepth(app, lambda: sorted(app.amqp.queues.consume_from)),
        FarmState(client, pool.name, lambda: sorted(families.load())),
        GpuMemory(pool.gpus),
        GpuChildren(client, lambda: worker.hostname, pool.name),
        scaling_metrics.for_this_farm(),
    ])  # fmt: skip
    for collector in _COLLECTORS:
        registry.register(collector)
