"""What every finished job tells the worker's metrics: its end, its attempts, its downgrades, its times.

Counted in the worker's MAIN process (the one whose registry is served), never in a pool child:
a child's counters would die with it (the watchdog SIGKILLs children) and no scrape reaches it.
The main process hears that a job ended (``workers.metrics.MeteredRequest``) and reads the job's
attempt history back from Redis on a thread of its own; the history holds every attempt, on
whichever worker or child it ran, each with its rung, outcome, start, duration and peak RSS.

Each job is counted once in the whole farm, by the first worker that sees it ended: a marker key
(``keys.metered``) set with NX decides, so a redelivered job that ends again on another worker is
not counted twice. Sum a metric over the workers to get the farm's figure.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.plan import READY
from mediafarm.tasks.wire.records import in_current_names

log = logging.getLogger("mediafarm.metrics")

# Seconds: interactive jobs wait and run well under a second, batch ones for an hour.
TIME_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
MB = 1024 * 1024
RSS_BUCKETS = tuple(mb * MB for mb in (64, 128, 256, 512, 1024, 1536, 2048, 4096, 8192, 16384))
# Moves a job one rung down (records.Outcome.moves_down), as stored; a newer farm's own reasons for
# starting lower (a breaker, memory pressure) arrive as whatever the history says.
TERMINAL_OUTCOMES = frozenset({"rejected", "error", "cancelled"})


class JobMetrics:
    """The farm-wide job metrics, on one registry (the served one by default)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.jobs = Counter(
            "mediafarm_jobs_total", "Jobs ended, by family, the rung they ended on and how they ended",
            ["family", "rung", "variant", "outcome"], registry=registry,
        )  # fmt: skip
        self.attempts = Counter(
            "mediafarm_attempts_total", "Attempts of ended jobs, by family, rung and outcome",
            ["family", "rung", "variant", "outcome"], registry=registry,
        )  # fmt: skip
        self.downgrades = Counter(
            "mediafarm_downgrades_total", "Jobs moved from one rung to a lower one, by the reason the first one lost",
            ["family", "from_rung", "to_rung", "from_variant", "to_variant", "reason"], registry=registry,
        )  # fmt: skip
        self.failures = Counter(
            "mediafarm_rung_failures_total",
            "Failed attempts of ended jobs by family, rung and cause (tasks.runtime.attribution), and whether each "
            "counted against the rung's breaker",
            ["family", "rung", "variant", "cause", "counted"], registry=registry,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "mediafarm_queue_wait_seconds",
            "Seconds from a job's message being sent (submit, or a retry) to a child starting it",
            ["family"], buckets=TIME_BUCKETS, registry=registry,
        )  # fmt: skip
        self.run_time = Histogram(
            "mediafarm_attempt_seconds", "Seconds an attempt ran, by family, rung and outcome",
            ["family", "rung", "variant", "outcome"], buckets=TIME_BUCKETS, registry=registry,
        )  # fmt: skip
        self.first_output = Histogram(
            "mediafarm_first_output_seconds",
            "Seconds from the start of a job's last attempt to its first partial output (streaming engines)",
            ["family", "rung", "variant"], buckets=TIME_BUCKETS, registry=registry,
        )  # fmt: skip
        self.peak_rss = Histogram(
            "mediafarm_attempt_peak_rss_bytes", "Peak RSS of the child during an attempt",
            ["family", "rung", "variant"], buckets=RSS_BUCKETS, registry=registry,
        )  # fmt: skip

    def observe_wait(self, family: str, sent: Any, started: float) -> None:
        """A delivery's wait in the queue: ``sent`` is the message's ``farm_sent`` header (Unix time)."""
        try:
            wait = started - float(sent)
        except (TypeError, ValueError):
            return
        if math.isfinite(wait):
            # Clocks of two machines disagree a little: a negative wait is a zero one.
            self.queue_wait.labels(family=family).observe(max(0.0, wait))

    def observe_end(
        self, family: str, state: str, attempts: Sequence[Mapping[str, Any]], first_output: Any, exc_type: str = ""
    ) -> None:
        """Count one ended job from its stored state, its attempt history (JSON dicts), the time of
        its first partial output and, for a failure, its stored error's class."""
        # Each series is labelled ``rung`` (the rung's name) and, for one release, ``variant`` (the
        # same name, as dashboards of the release before know it): docs/operating.md, "Upgrading".
        attempts = [in_current_names(dict(a)) for a in attempts]  # records of this release or the one before
        for attempt in attempts:
            rung, outcome = str(attempt["rung"]), str(attempt.get("outcome") or "open")
            self.attempts.labels(family=family, rung=rung, variant=rung, outcome=outcome).inc()
            if isinstance(attempt.get("counted"), bool):
                self.failures.labels(family=family, rung=rung, variant=rung, cause=str(attempt.get("cause") or "-"),
                                     counted=str(attempt["counted"]).lower()).inc()  # fmt: skip
            duration = _number(attempt.get("duration"))
            if duration is not None:
                self.run_time.labels(family=family, rung=rung, variant=rung, outcome=outcome).observe(duration)
            rss = _number(attempt.get("peak_rss_mb"))
            if rss is not None:
                self.peak_rss.labels(family=family, rung=rung, variant=rung).observe(rss * MB)
        for before, after in zip(attempts, attempts[1:], strict=False):
            if after["rung_index"] > before["rung_index"]:
                self.downgrades.labels(
                    family=family, from_rung=before["rung"], to_rung=after["rung"], from_variant=before["rung"],
                    to_variant=after["rung"], reason=downgrade_reason(before),
                ).inc()  # fmt: skip
        last = attempts[-1] if attempts else {}
        rung = str(last.get("rung", "")) or "-"
        self.jobs.labels(family=family, rung=rung, variant=rung, outcome=job_outcome(state, last, exc_type)).inc()
        first = _number(first_output)
        started = _number(last.get("started"))
        if state == "SUCCESS" and first is not None and started is not None:
            self.first_output.labels(family=family, rung=rung, variant=rung).observe(max(0.0, first - started))


def downgrade_reason(attempt: Mapping[str, Any]) -> str:
    """Why a job left a rung: the attempt's outcome (``killed``, ``oom``, ``cuda_oom``, ``timeout``,
    ``unavailable``), or for a rung the farm chose to skip, ``breaker`` (its breaker was open on
    the pool) or ``pressure`` (the pool was short of memory and the ladder steps down)."""
    outcome = str(attempt.get("outcome") or "open")
    if outcome != "skipped":
        return outcome
    reason = str(attempt.get("reason", ""))
    if reason.startswith("breaker"):
        return "breaker"
    return "pressure" if "pressure" in reason else outcome


# A job refused before any rung ran has no attempt: its stored error's class says why.
REJECTIONS = frozenset({"PermanentFailure", "InvalidRequest", "MediaNotFound", "MediaOutsideRoots", "UnreadableMedia"})


def job_outcome(state: str, last: Mapping[str, Any], exc_type: str = "") -> str:
    """How a job ended, in one word: ``ok``, ``cancelled``, ``rejected``, ``error``, or
    ``exhausted`` (every rung ran out of resources: its last attempt moved it down, nowhere).
    ``exc_type``: the class of a failed job's stored error, for a job with no attempt."""
    if state == "SUCCESS":
        return "ok"
    if state == "REVOKED":
        return "cancelled"
    outcome = str(last.get("outcome") or "")
    if outcome in TERMINAL_OUTCOMES:
        return outcome
    if outcome:
        return "exhausted"
    return "rejected" if exc_type in REJECTIONS else "exhausted" if exc_type == "NoRungLeft" else "error"


def _number(value: Any, default: float | None = None) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return default
    return float(value)


class EndReader:
    """Reads an ended job back from Redis (state, history, first output) and counts it once.

    ``on_success``: also called with the stored result of a job that succeeded (the families'
    declared result numbers, ``workers.metrics.ResultMetrics``).
    """

    def __init__(self, metrics: JobMetrics, on_success: Callable[[Any], None] | None = None) -> None:
        self.metrics, self.on_success = metrics, on_success

    def count(self, backend: Any, job_id: str, family: str, ttl: int) -> bool:
        """Count job ``job_id`` if it has ended and no worker has counted it yet; True if counted."""
        return self.count_many(backend, [(job_id, family)], ttl) == 1

    def count_many(self, backend: Any, jobs: Sequence[tuple[str, str]], ttl: int, client: Any = None) -> int:
        """Count every job of ``jobs`` (id, family) that has ended and that no worker counted yet,
        in two pipelined round trips for them all; how many were counted. ``client``: the Redis to
        read through (default: the backend's own)."""
        client = client if client is not None else backend.client
        pipe = client.pipeline(transaction=False)
        for job_id, _ in jobs:
            pipe.get(backend.get_key_for_task(job_id))
            pipe.lrange(keys.history(job_id), 0, -1)
            pipe.get(keys.first_output(job_id))
        replies = pipe.execute()
        ended = []
        for i, (job_id, family) in enumerate(jobs):
            raw_meta, raw_history, first_output = replies[3 * i : 3 * i + 3]
            meta = json.loads(raw_meta) if raw_meta else {}
            if str(meta.get("status", "")) in READY:
                ended.append((job_id, family, meta, raw_history, first_output))
        if not ended:
            return 0
        pipe = client.pipeline(transaction=False)
        for job_id, *_ in ended:
            pipe.set(keys.metered(job_id), 1, nx=True, ex=max(ttl, 1))
        first_counts = pipe.execute()
        counted = 0
        for (_, family, meta, raw_history, first_output), first in zip(ended, first_counts, strict=True):
            if not first:
                continue  # another worker (or an earlier end of this one) counted it
            self._observe(family, meta, raw_history, first_output)
            counted += 1
        return counted

    def _observe(self, family: str, meta: Mapping[str, Any], raw_history: Sequence[bytes], first_output: Any) -> None:
        state = str(meta["status"])
        result = meta.get("result")
        if isinstance(result, Mapping) and isinstance(result.get("attempts"), list):
            # A SUCCESS made the envelope's history the job's (tasks.result_backend): read that one.
            attempts = [a for a in result["attempts"] if isinstance(a, Mapping)]
        else:
            attempts = [json.loads(raw) for raw in raw_history]
        exc_type = str(result.get("exc_type", "")) if isinstance(result, Mapping) and state == "FAILURE" else ""
        self.metrics.observe_end(family, state, attempts, _float_or_none(first_output), exc_type)
        if state == "SUCCESS" and self.on_success is not None:
            self.on_success(result)


def _float_or_none(raw: Any) -> float | None:
    try:
        return float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None
