"""The Celery configuration of the farm, and the checks that refuse an unsafe one.

Every setting that differs from Celery's default is here with the reason. Two defaults in
particular lose jobs: ack-on-receive (a job is gone if its worker dies) and prefetch 4 (a busy
child hoards jobs another could run).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery.exceptions import ImproperlyConfigured

from mediafarm.config.priorities import DEFAULT_PRIORITY, REDIS_PRIORITY_SEP, REDIS_PRIORITY_STEPS, wire_priority
from mediafarm.config.settings import FarmSettings, is_amqp

# Routing reads the family registry: every family's task goes to its family queue unless the
# producer names another. A string, so this module does not import the tasks package.
ROUTER = "mediafarm.tasks.registry.route"
# Celery's Redis backend, except that nothing but a SUCCESS replaces a stored SUCCESS (atomic).
RESULT_BACKEND = "mediafarm.tasks.result_backend:FarmRedisBackend"
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def result_backend_setting(url: str) -> str:
    """``result_backend`` for a URL: a Redis URL gets the farm's backend class (``class+url``)."""
    return f"{RESULT_BACKEND}+{url}" if url.startswith(_REDIS_SCHEMES) else url


def backend_address(setting: str) -> str:
    """The URL in a ``result_backend`` setting, without a ``class+`` prefix."""
    scheme = setting.partition("://")[0]
    return setting.split("+", 1)[1] if "+" in scheme else setting


class UnsafeConfiguration(ImproperlyConfigured):
    """The configuration would lose or duplicate jobs, or names what does not exist; the worker
    refuses to start."""


def celery_config(settings: FarmSettings) -> dict[str, Any]:
    """Celery settings (new-style lowercase names) derived from the farm settings."""
    return _common(settings) | (_rabbitmq(settings) if settings.broker_is_rabbitmq else {})


def _broker_options(settings: FarmSettings) -> dict[str, Any]:
    if settings.broker_is_rabbitmq:
        # A submit returns only once RabbitMQ has taken the message (publisher confirms).
        return {"confirm_publish": True}
    return {
        "visibility_timeout": settings.visibility_timeout,
        # A dead worker's jobs come back visibility_timeout + at most one sweep after it died.
        "unacked_restore_interval": settings.restore_interval,
        "unacked_restore_throttle": 1,
        # The sweep's lock: kombu's default 300 s expiry, left behind by a Redis stopped while a
        # worker held it, blocked every restore for 5 minutes after the restart. A sweep takes
        # milliseconds; each message is restored at most once whoever sweeps.
        "unacked_mutex_expire": 5,
        # A list per priority of the farm's scale (kombu's default is 4 steps: 0-2, 3-5, ...),
        # named as admission control counts them (``config.priorities``). Queue order stays
        # round-robin: priority is served before queue order in kombu's BRPOP anyway.
        "priority_steps": list(REDIS_PRIORITY_STEPS),
        "sep": REDIS_PRIORITY_SEP,
    }


def _rabbitmq(settings: FarmSettings) -> dict[str, Any]:
    # Quorum queues: replicated and durable, and the queue type RabbitMQ keeps developing. Every
    # process of the farm must declare them alike (a classic declaration of the same queue is
    # refused by the broker), which one shared configuration guarantees. Celery turns global QoS
    # off for them by itself (worker_detect_quorum_queues).
    return {
        "task_default_queue_type": "quorum",
        "task_create_missing_queue_type": "quorum",
        # How soon RabbitMQ drops a worker that stopped answering, handing its jobs to another.
        "broker_heartbeat": settings.broker_heartbeat,
    }


def _common(settings: FarmSettings) -> dict[str, Any]:
    return {
        "broker_url": settings.broker_url or None,
        "result_backend": result_backend_setting(settings.backend_url) or None,
        # JSON only: a worker that unpickles what a producer sent runs the producer's code.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # Ack after the job ran: a worker that dies mid-job leaves the message to be redelivered.
        "task_acks_late": True,
        # A killed child must not make Redis redeliver the same killing message forever
        # (measured: 13 runs in 30 s). Celery 5.7 instead retries it under the same id with
        # retries + 1, and the ladder turns that count into a cheaper rung.
        "task_retry_on_worker_lost": True,
        # Only when that retry cannot be sent (the broker is down: a child killed during a Redis
        # restart) is the message handed back instead, and the job runs again once the broker is
        # back, the killed attempt settled from its record. Without it Celery fails the job with
        # WorkerLostError (found by the chaos suite).
        "task_reject_on_worker_lost": True,
        # Publishing (a producer's submit, a retry sent by a worker) rides out a broker restart of
        # up to about a minute: Celery's default gives up after 3 tries in 0.6 s.
        "task_publish_retry_policy": {"max_retries": 30, "interval_start": 0, "interval_step": 0.5, "interval_max": 2},
        # One job at a time per child: a long job never holds others hostage in its prefetch.
        "worker_prefetch_multiplier": 1,
        # For tasks outside the farm (the bench's bare baselines): farm tasks write their attempt
        # record as they start instead (``FarmTask.track_started``).
        "task_track_started": True,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "result_extended": True,
        "result_expires": 7 * 24 * 3600,
        "task_routes": (ROUTER,),
        "task_default_queue": "default",
        # What a message sent without a priority gets (Celery's own sends: a chord's callback); the
        # farm's default, in the broker's terms (``config.priorities``: Redis counts backwards).
        "task_default_priority": wire_priority(DEFAULT_PRIORITY, settings.broker_is_rabbitmq),
        "broker_transport_options": _broker_options(settings),
        "result_backend_transport_options": {"visibility_timeout": settings.visibility_timeout},
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        # A running job goes on through a broker outage. On Redis its unacked message stays in the
        # unacked hash (AOF keeps it across a restart) and its ack later works on a new
        # connection, so nothing runs twice. Cancelling instead (Celery's option) sends the cancel's
        # retry to the backend that is down, fails, and ends the job REVOKED for good: measured,
        # every running job lost on a Redis restart (tests/integration/test_broker_faults.py).
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # Result and attempt writes ride out a short backend outage: retried with backoff (10 ms
        # doubling to 10 s), about two minutes in all, then the job fails as before.
        "result_backend_always_retry": True,
        "result_backend_max_retries": 20,
        # Cold shutdown (SIGQUIT, or a second SIGTERM) waits this long for running jobs, then hands
        # their messages back to the queue at once instead of after the visibility timeout.
        "worker_soft_shutdown_timeout": settings.soft_shutdown_timeout,
    }


def config_problems(
    conf: Any,
    hard_limits: Mapping[str, float] | None = None,
    retry_delay: float = 0.0,
    *,
    consumer_timeout: float = 1800.0,
    consumed_limits: Mapping[str, float] | None = None,
) -> list[str]:
    """What is unsafe in a Celery configuration (empty when it is safe).

    ``conf`` is a Celery ``app.conf`` or any mapping with the same keys; ``hard_limits`` maps
    what has a hard time limit (``family vad``, ``task farm.vad.detect``) to it, in seconds;
    ``retry_delay`` is FARM_RETRY_DELAY. On RabbitMQ, ``consumer_timeout`` is FARM_CONSUMER_TIMEOUT
    and ``consumed_limits`` the limits of what this worker consumes (default: all of them).
    """
    problems: list[str] = []
    accepted = set(conf.get("accept_content") or ()) | set(conf.get("result_accept_content") or ())
    serializers = {conf.get("task_serializer"), conf.get("result_serializer")}
    unsafe = {c for c in accepted | serializers if c and ("pickle" in str(c) or "yaml" in str(c))}
    if unsafe:
        problems.append(
            f"accept_content/result_accept_content/serializers include {sorted(unsafe)}: "
            "only json is allowed (a worker that unpickles a message runs the sender's code)"
        )
    limits = {name: hard for name, hard in (hard_limits or {}).items() if hard}
    if conf.get("task_time_limit"):
        limits["task_time_limit"] = conf.get("task_time_limit")
    if is_amqp(str(conf.get("broker_url") or "")):
        # RabbitMQ redelivers a job only when its consumer is gone or holds it past the
        # consumer timeout, which counts per channel: only the queues this worker consumes matter.
        consumed = dict(limits if consumed_limits is None else consumed_limits)
        name, longest = max(consumed.items(), key=lambda kv: kv[1], default=("nothing", 0))
        if consumer_timeout <= longest + retry_delay:
            problems.append(
                f"FARM_CONSUMER_TIMEOUT ({consumer_timeout:g} s, RabbitMQ's consumer_timeout) must exceed the "
                f"longest hard time limit this worker runs ({longest:g} s, {name})"
                + (f" plus FARM_RETRY_DELAY ({retry_delay:g} s)" if retry_delay else "")
                + ": otherwise RabbitMQ closes the channel of a still-running job and delivers it again. "
                "Raise consumer_timeout in rabbitmq.conf and state it in FARM_CONSUMER_TIMEOUT"
            )
    else:
        problems += _visibility_problems(conf, limits, retry_delay)
    backend = backend_address(str(conf.get("result_backend") or ""))
    if backend and not backend.startswith(_REDIS_SCHEMES):
        problems.append(
            f"result backend {backend.split('://')[0]}:// is not Redis: the attempt histories and kill "
            "records live beside the results, in Redis (set FARM_RESULT_BACKEND to a Redis URL)"
        )
    if not conf.get("task_retry_on_worker_lost"):
        problems.append(
            "task_retry_on_worker_lost is off: a job whose child is killed would fail instead of moving down"
        )
    if not conf.get("task_acks_late"):
        problems.append("task_acks_late is off: a worker that dies mid-job would lose it")
    if conf.get("task_reject_on_worker_lost") and not conf.get("task_retry_on_worker_lost"):
        problems.append(
            "task_reject_on_worker_lost without task_retry_on_worker_lost redelivers a job that "
            "kills its child forever"
        )
    if not conf.get("broker_url"):
        problems.append("FARM_BROKER_URL is not set (use `farm up` for a local farm with an embedded Redis)")
    return problems


def _visibility_problems(conf: Any, limits: Mapping[str, float], retry_delay: float) -> list[str]:
    # Redis hands any unacked job, whichever worker holds it, to the next sweeper after the
    # visibility timeout: every family's limit counts, not just this worker's.
    visibility = (conf.get("broker_transport_options") or {}).get("visibility_timeout", 3600)
    longest_name, longest = max(limits.items(), key=lambda kv: kv[1], default=("nothing", 0))
    problems = []
    if visibility <= longest:
        problems.append(
            f"FARM_VISIBILITY_TIMEOUT ({visibility} s) must exceed the longest hard time limit "
            f"({longest} s, {longest_name}): otherwise Redis hands a still-running job to a second worker"
        )
    if retry_delay and visibility <= longest + retry_delay:
        problems.append(
            f"FARM_RETRY_DELAY ({retry_delay:g} s) plus the longest hard time limit ({longest:g} s) must "
            f"stay below FARM_VISIBILITY_TIMEOUT ({visibility} s): a delayed retry would be delivered twice"
        )
    return problems


def check_config(conf: Any, hard_limits: Mapping[str, float] | None = None, retry_delay: float = 0.0) -> None:
    """Raise :class:`UnsafeConfiguration` naming every problem, or return quietly."""
    problems = config_problems(conf, hard_limits, retry_delay)
    if problems:
        raise UnsafeConfiguration("refusing to start, unsafe configuration:\n  - " + "\n  - ".join(problems))
