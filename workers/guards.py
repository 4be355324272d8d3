"""Worker-side guards, installed on the app as Celery bootsteps and signal handlers.

- ``ConfigCheck``: the worker refuses to start on an unsafe configuration.
- ``MemoryWatchdog``: a thread in the worker's MAIN process polls the pool children and
  SIGKILLs one whose RSS passes the pool's cap, after writing down why (job id, RSS, cap) where
  the job's next attempt reads it. Celery 5.7 then retries the job under the same id
  (``task_retry_on_worker_lost``) and the ladder moves it one rung down.
  ``worker_max_memory_per_child`` cannot do this: it recycles a child only after its job ends.
- Child set-up (``worker_process_init``): ``oom_score_adj`` 1000 so the kernel's OOM killer takes
  a child, never the main process; per-child GPU pinning for a pool that spans GPUs; ``SIGUSR2``
  writes every thread's stack to the worker's stderr (``kill -USR2 <child pid>``: where a stuck job
  is, even inside a C call that holds the GIL).
- ``farm_main_process`` inspect command: proves the main process never imported torch, and that
  every thread it runs was started through the fork gate (``workers.fork_gate``).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import psutil
import redis
from billiard.process import current_process
from celery import bootsteps, signals
from celery.worker import state as worker_state
from celery.worker.control import inspect_command

from mediafarm.config.admission import admission_problems
from mediafarm.config.celery import UnsafeConfiguration, config_problems
from mediafarm.config.pools import Pool, get_pool
from mediafarm.config.settings import get_settings
from mediafarm.config.storage_url import S3Place
from mediafarm.tasks import registry
from mediafarm.tasks.runtime import liveness
from mediafarm.tasks.runtime.breaker import count_kill
from mediafarm.tasks.wire import object_store
from mediafarm.tasks.wire.history import record_kill
from mediafarm.tasks.wire.records import KillRecord, Outcome
from mediafarm.workers import fork_gate, gpu_hygiene, webhook_dispatch
from mediafarm.workers.logs import killed_by_watchdog
from mediafarm.workers.metrics import CHILD_KILLS, CHILD_RSS_CAP, CHILD_RSS_MAX, serve

log = logging.getLogger("mediafarm.watchdog")
# Imported only in pool children, never in the main process that forks them.
MODEL_RUNTIMES = ("torch", "ctranslate2", "faster_whisper", "onnxruntime", "pocketsphinx", "silero_vad")
MB = 1024 * 1024


class ConfigCheck(bootsteps.Step):
    """Refuse to start a worker whose configuration would lose or duplicate jobs, or whose
    ladders name an engine or engine parameters that do not exist."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        consumed = set(worker.app.amqp.queues.consume_from)  # -Q, or every declared queue
        problems = startup_problems(worker.app.conf, hard_limits(worker.app), consumed_queues=consumed)
        if problems:
            raise UnsafeConfiguration("refusing to start:\n  - " + "\n  - ".join(problems))
        super().__init__(worker, **kwargs)


# Seconds a worker waits at start for a store that answers to make its bucket (storage_problems).
BUCKET_WAIT_S = 30.0


def startup_problems(
    conf: Any, task_limits: dict[str, float] | None = None, consumed_queues: set[str] | None = None
) -> list[str]:
    """Everything that stops a worker from starting: unsafe Celery settings and ladder mistakes.

    ``task_limits``: hard limits of the tasks a running worker has registered (any task module it
    was given), beside the families' own. ``consumed_queues``: the queues the worker consumes
    (None: all), which is what RabbitMQ's consumer timeout is checked against.
    """
    settings = get_settings()
    task_limits = task_limits or {}
    tasks = {f"task {name}": hard for name, hard in task_limits.items()}
    consumed = None
    if consumed_queues is not None:
        # A family's task counts where its queue is consumed; another task (a benchmark's) has
        # no known queue, so it counts wherever it may run.
        others = {f"task {name}": hard for name, hard in task_limits.items() if registry.by_task_name(name) is None}
        consumed = registry.hard_limits(queues=consumed_queues) | others
    problems = config_problems(
        conf, registry.hard_limits() | tasks, retry_delay=settings.retry_delay,
        consumer_timeout=settings.consumer_timeout, consumed_limits=consumed,
    )  # fmt: skip
    return problems + registry.ladder_problems() + admission_problems() + storage_problems()


def storage_problems() -> list[str]:
    """An object store this worker could never write to (FARM_STORAGE_URL): no such bucket, access
    refused, boto3 not installed. A store that cannot be reached yet is no reason to refuse: an
    attempt waits for it (``tasks.wire.object_store.AttemptPublisher``). A store that answers without the
    bucket is given ``BUCKET_WAIT_S`` to make it: a cluster started at once (Compose, Kubernetes)
    starts the store and its workers together, and the store makes its bucket as it starts."""
    url = get_settings().storage_url
    if not url:
        return []
    deadline = time.monotonic() + BUCKET_WAIT_S
    while True:
        try:
            object_store.store_at().check(S3Place.parse(url))
        except object_store.NoBucket as exc:
            if time.monotonic() >= deadline:
                return [f"FARM_STORAGE_URL {url}: {exc} (waited {BUCKET_WAIT_S:g} s for it)"]
            log.warning("FARM_STORAGE_URL %s: %s; waiting for it", url, exc)
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
            continue
        except object_store.StoreRefused as exc:
            return [f"FARM_STORAGE_URL {url}: {exc}"]
        except RuntimeError as exc:  # boto3 missing
            return [f"FARM_STORAGE_URL {url}: {exc}"]
        except object_store.StoreUnavailable as exc:
            log.warning("FARM_STORAGE_URL %s cannot be reached yet; attempts will wait for it: %s", url, exc)
        return []


def hard_limits(app: Any) -> dict[str, float]:
    """Hard time limit of each registered task: the farm's (enforced by the watchdog) or Celery's."""
    limits = {}
    for name, task in app.tasks.items():
        hard = getattr(task, "farm_hard_limit", None) or task.time_limit
        if hard:
            limits[name] = float(hard)
    return limits


def stall_timeouts(app: Any) -> dict[str, float]:
    """Stall timeout of each registered farm task (``TimeLimits.stall``, enforced by the watchdog)."""
    return {name: float(t.farm_stall_timeout) for name, t in app.tasks.items() if getattr(t, "farm_stall_timeout", None)}


def _active_jobs() -> dict[int, Any]:
    """Requests running in pool children, by child pid, from the worker's own state."""
    for _ in range(3):
        try:
            return {r.worker_pid: r for r in list(worker_state.active_requests) if r.worker_pid}
        except RuntimeError:  # the set changed while we copied it; look again
            continue
    return {}


def child_pids(pid: int) -> set[int] | None:
    """The pids of a process's children, from ``/proc/<pid>/task/*/children``; None where the
    kernel keeps no such file (built without CONFIG_PROC_CHILDREN, or not Linux).

    The watchdog polls 20 times a second. psutil's ``children()`` reads the stat file of every
    process on the machine to find them, a share of a core spent by every worker's main process,
    idle or not (the peers bench found the TTS job slower than bare Piper on a loaded machine).
    Every thread's file is read, as a child is listed under the thread that forked it. A listing
    and plain reads, not ``glob`` (which matches each name with a regular expression and stats
    it), which was still most of an idle worker's main-process CPU. Measured: docs/benchmarks/tts.md.
    """
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return None
    pids: set[int] = set()
    found = False
    for tid in tids:
        try:
            fd = os.open(f"{base}/{tid}/children", os.O_RDONLY)
        except OSError:  # no such file on this kernel, or a thread that ended meanwhile
            continue
        found = True
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        except OSError:  # the thread ended between the open and the read
            continue
        finally:
            os.close(fd)
        pids.update(int(p) for p in b"".join(chunks).split())
    return pids if found else None


def _unaccepted_jobs() -> dict[int, Any]:
    """Requests written to a pool child that has not accepted them yet, by the child's pid (the
    pool writes a job only to an idle child, which accepts it at once: one still unaccepted a
    stall timeout later went to a stuck child)."""
    for _ in range(3):
        try:
            reserved = list(worker_state.reserved_requests)
            break
        except RuntimeError:  # the set changed while we copied it; look again
            continue
    else:
        return {}
    out = {}
    for request in reserved:
        if request.time_start or request._apply_result is None:
            continue
        job = request._apply_result()  # billiard's ApplyResult (a weak reference)
        proc = getattr(job, "_write_to", None)
        if job is not None and proc is not None and not job._accepted and getattr(proc, "pid", None):
            out[proc.pid] = request
    return out


class MemoryWatchdog(bootsteps.StartStopStep):
    """Per-child RSS cap, per-job hard time limit and stall timeout, enforced while the job runs.

    All end in a SIGKILL of the child, so all take Celery's worker-lost retry path; the job comes
    back one rung down (a first stall: on the same rung). (Celery's own hard time limit acks the
    job and fails it: no downgrade, so farm tasks leave it unset and declare ``farm_hard_limit``.)
    A child is stalled when it gave no sign of life (``tasks.runtime.liveness``) since it accepted its job
    or since its last beat, for longer than its family's stall timeout, while the farm's Redis
    answers: a child waiting out a Redis outage is silent through no fault of its own.
    """

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        settings = get_settings()
        self.pool: Pool = get_pool(settings.pool)
        self.interval = settings.watchdog_interval
        self.cap = self.pool.child_rss_cap_mb * MB if self.pool.child_rss_cap_mb else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._redis: Any = None
        # Children killed and not yet reaped. A killed child stays listed (a zombie, RSS 0) and its
        # job active until the pool reaps it, and it was killed, recorded and logged again at every
        # poll meanwhile (2-3 times after a paused worker resumed): one kill, one line.
        self._killed: set[psutil.Process] = set()
        self._stalls: dict[str, float] = {}
        # (job id, child pid) → when this job was first seen written to that child, unaccepted.
        self._unaccepted: dict[tuple[str, int], float] = {}
        # Redis, as the stall check last saw it: (when asked, answered), and when it last did not.
        self._redis_seen = (0.0, False)
        self._redis_down_at = 0.0
        # When this process last polled, and when it came back from a pause of its own (the whole
        # worker stopped, or starved): its children were silent through that too, for no fault.
        self._polled_at = 0.0
        self._resumed_at = 0.0
        # Each pool process's signs of life, made before the pool forks its first child (every
        # step's __init__ runs before any step starts). A replacement child takes its index's slot.
        autoscale = getattr(worker, "autoscale", None) or (0, 0)
        liveness.create(2 * max(int(getattr(worker, "concurrency", 0) or 0), int(autoscale[0] or 0)) + 8)

    def start(self, worker: Any) -> None:
        # Its own client with short timeouts: a slow Redis must not hold up a kill for long.
        self._redis = redis.Redis.from_url(
            get_settings().backend_url, socket_timeout=0.5, socket_connect_timeout=0.5
        )
        self._limits = hard_limits(worker.app)
        self._stalls = stall_timeouts(worker.app)
        serve(get_settings().metrics_port, worker, self.pool)
        if self.cap:
            CHILD_RSS_CAP.labels(pool=self.pool.name).set(self.cap)
        self._thread = fork_gate.start_thread(self._run, "farm-watchdog", (worker,))
        cap = f"{self.pool.child_rss_cap_mb} MiB" if self.cap else "none"
        log.info("watchdog on: pool %s, child RSS cap %s, hard limits %s", self.pool.name, cap, self._limits)

    def stop(self, worker: Any) -> None:
        self._stop.set()

    def _run(self, worker: Any) -> None:
        me = psutil.Process()
        known: dict[int, psutil.Process] = {}
        while not self._stop.wait(self.interval):
            # One poll inside the fork gate: a kill records and logs (``workers.fork_gate``).
            with fork_gate.held():
                self._poll(worker, me, known)

    def _poll(self, worker: Any, me: psutil.Process, known: dict[int, psutil.Process]) -> None:
        try:
            children = self._children(me, known)
        except psutil.Error:
            return
        self._killed &= set(children)
        jobs = _active_jobs()
        waiting = _unaccepted_jobs()
        beats = liveness.last_beats()
        now = time.time()
        if self._polled_at and now - self._polled_at > max(1.0, 20 * self.interval):
            self._resumed_at = now
        self._polled_at = now
        seen = {(r.id, pid): self._unaccepted.get((r.id, pid), now) for pid, r in waiting.items()}
        self._unaccepted = seen
        largest = 0
        for child in children:
            if child in self._killed:
                continue
            request = jobs.get(child.pid)
            try:
                rss = child.memory_info().rss
            except psutil.Error:
                continue
            largest = max(largest, rss)
            if self.cap is not None and rss > self.cap:
                reason = (
                    f"watchdog: child RSS {rss / MB:.0f} MiB passed the pool {self.pool.name!r} cap of "
                    f"{self.pool.child_rss_cap_mb} MiB"
                )
                self._kill(worker, child, request, rss, Outcome.KILLED, reason)
            elif request is not None and request.time_start:
                limit = self._limits.get(request.name)
                if limit and now - request.time_start > limit:
                    reason = f"watchdog: hard time limit of {limit:.0f} s passed ({now - request.time_start:.0f} s)"
                    self._kill(worker, child, request, rss, Outcome.TIMEOUT, reason)
                else:
                    reason = self._stalled(request, beats.get(child.pid, 0.0), now)
                    if reason:
                        self._kill(worker, child, request, rss, Outcome.STALLED, reason)
            elif request is None and child.pid in waiting:
                reason = self._never_took(waiting[child.pid], now - seen[(waiting[child.pid].id, child.pid)], now)
                if reason:
                    # No attempt began, so there is none to write the reason into: the pool sends
                    # the unaccepted job to another child, and the line below says why.
                    self._kill(worker, child, None, rss, Outcome.STALLED, f"{reason} (job {waiting[child.pid].id})")
        CHILD_RSS_MAX.labels(pool=self.pool.name).set(largest)

    def _stalled(self, request: Any, beat: float, now: float) -> str:
        """Why the child running ``request`` counts as stuck ('' if it does not)."""
        stall = self._stalls.get(request.name)
        if not stall:
            return ""
        since = max(beat, request.time_start, self._resumed_at)
        if now - since <= stall or not self._redis_steady(now, stall):
            return ""
        if beat < request.time_start:
            sign = "no sign of life since it received the job: it never started it"
        else:
            sign = f"its last sign of life {now - beat:.0f} s ago, {beat - request.time_start:.0f} s into the job"
        return f"watchdog: stalled: silent past the stall timeout of {stall:g} s ({sign})"

    def _never_took(self, request: Any, waited: float, now: float) -> str:
        """Why the child that was written ``request`` counts as stuck before taking it ('' if not)."""
        stall = self._stalls.get(request.name)
        waited = min(waited, now - self._resumed_at)
        if not stall or waited <= stall or not self._redis_steady(now, stall):
            return ""
        return f"watchdog: stalled: the child never took the job written to it {waited:.0f} s ago (stall timeout {stall:g} s)"

    def _redis_steady(self, now: float, stall: float) -> bool:
        """Has the farm's Redis answered for a stall timeout? Asked at most once a second, only
        about a silent child: one that waits out a Redis outage is not stuck (and its kill's
        record could not be written)."""
        asked, answered = self._redis_seen
        if now - asked >= 1.0:
            try:
                answered = bool(self._redis.ping())
            except Exception:  # noqa: BLE001 - any failure to answer is an outage here
                answered = False
            self._redis_seen = (now, answered)
            if not answered:
                self._redis_down_at = now
        return answered and now - self._redis_down_at > stall

    @staticmethod
    def _children(me: psutil.Process, known: dict[int, psutil.Process]) -> list[psutil.Process]:
        """The worker's pool children, each as the same psutil.Process from poll to poll (``known``,
        pruned to the living), so a pid reused by a new child is a new process to psutil. The
        webhook dispatcher is a child too, but no pool child: not watched."""
        helpers = webhook_dispatch.dispatcher_pids()
        pids = child_pids(me.pid)
        if pids is None:
            return [c for c in me.children() if c.pid not in helpers]
        pids -= helpers
        for pid in list(known):
            if pid not in pids:
                del known[pid]
        children = []
        for pid in pids:
            if pid not in known:
                try:
                    known[pid] = psutil.Process(pid)
                except psutil.Error:  # gone between the listing and now
                    continue
            children.append(known[pid])
        return children

    def _kill(
        self, worker: Any, child: psutil.Process, request: Any, rss: int, outcome: Outcome, reason: str
    ) -> None:
        if request is not None:
            record = KillRecord(
                pid=child.pid, worker=worker.hostname, at=time.time(), outcome=outcome, reason=reason,
                rss_mb=round(rss / MB, 1), cap_mb=self.pool.child_rss_cap_mb,
            )  # fmt: skip
            try:
                record_kill(self._redis, request.id, record, ttl=int(worker.app.conf.result_expires))
            except Exception:  # the kill matters more than its record
                log.exception("could not record the kill reason of job %s", request.id)
        try:
            # psutil checks the process is still the one we measured (pid reuse).
            child.kill()
        except psutil.Error:
            return
        self._killed.add(child)
        killed_by_watchdog(child.pid)  # billiard's own ERROR for its exit becomes INFO (workers.logs)
        log.warning("%s; killed pid %d%s", reason, child.pid, f" (job {request.id})" if request is not None else "")
        CHILD_KILLS.labels(pool=self.pool.name, reason=outcome.value).inc()
        if request is not None and outcome != Outcome.STALLED:  # a stall counts only when it repeats (downgrade.py)
            try:  # now, not when the job comes back from the end of its queue (tasks.runtime.breaker.count_kill)
                count_kill(self._redis, self.pool.name, request.name, request.kwargs, request.id, child.pid, outcome)
            except Exception:  # noqa: BLE001 - the kill matters more than its count
                log.exception("could not count the kill of job %s against its rung's breaker", request.id)


# Sent to a pool child, this signal makes it write every thread's stack (faulthandler); the child
# goes on. Celery's main process answers SIGUSR1 with its own threads' stacks.
STACKS_SIGNAL = signal.SIGUSR2


def _on_child_start(**_: Any) -> None:
    """In each new pool child, before it runs any job."""
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:  # not Linux, or a sandbox that forbids it: the cap still protects us
        pass
    # The worker's own stderr (its log), not Celery's logging proxy, which has no file descriptor.
    faulthandler.register(STACKS_SIGNAL, file=sys.__stderr__, all_threads=True)
    # A replacement child gets the index of the one it replaces: the same liveness slot, GPU.
    index = current_process().index
    liveness.claim(index)
    pool = get_pool(get_settings().pool)
    if len(pool.gpus) > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(pool.gpus[index % len(pool.gpus)])


_CHILD_REDIS: Any = None


def _after_job(task: Any = None, **_: Any) -> None:
    """In a pool child after each job: the CUDA allocator's fragmentation, measured and acted on
    (``workers.gpu_hygiene``); nothing in a child that never initialised CUDA."""
    global _CHILD_REDIS
    if "torch" not in sys.modules:
        return
    try:
        if _CHILD_REDIS is None:
            _CHILD_REDIS = redis.Redis.from_url(get_settings().backend_url, socket_timeout=1, socket_connect_timeout=1)
        pool = get_pool(get_settings().pool)
        worker = getattr(getattr(task, "request", None), "hostname", None) or ""
        gpu_hygiene.after_job(_CHILD_REDIS, worker, pool.gpu_fragmentation_limit)
    except Exception:  # noqa: BLE001 - the job is over; its figures must not fail it
        log.warning("could not measure the CUDA allocator after a job", exc_info=True)


@inspect_command()
def farm_main_process(state: Any) -> dict[str, Any]:
    """What the worker's main process has loaded: it must never hold torch, a CUDA context or a
    model runtime (CTranslate2 and ONNX Runtime are not fork-safe once initialised)."""
    torch = sys.modules.get("torch")
    cuda_initialized = bool(torch is not None and torch.cuda.is_initialized())
    return {
        "pid": os.getpid(),
        "torch_imported": torch is not None,
        "cuda_initialized": cuda_initialized,
        "model_runtimes": sorted(m for m in MODEL_RUNTIMES if m in sys.modules),
        "pool": get_settings().pool,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        # Threads not started through the fork gate (``workers.fork_gate``): there must be none.
        "ungated_threads": fork_gate.ungated_threads(),
    }


def install(app: Any) -> None:
    """Attach the farm's bootsteps and child set-up to ``app``."""
    app.steps["worker"].add(ConfigCheck)
    app.steps["worker"].add(MemoryWatchdog)
    signals.worker_process_init.connect(_on_child_start, weak=False)
    signals.task_postrun.connect(_after_job, weak=False)
