"""The attempt history of a job: one Redis list per job id, beside Celery's result.

Each attempt is written when it starts and completed when it ends. An attempt still open when
the job runs again was cut short: its child was SIGKILLed (the watchdog left its reason under
``kill_key``) or its whole worker died. The next attempt settles it from that evidence.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from config.queues import history_key, kill_key

HOST = socket.gethostname()
# Outcomes that move a job one rung down.
RESOURCE_OUTCOMES = frozenset({"killed", "oom", "cuda_oom", "timeout"})
# Outcomes that do not run the rung again (the rung is skipped, no attempt spent).
SKIP_OUTCOMES = frozenset({"unavailable"})


@dataclass
class Attempt:
    """One run (or skip) of one rung.

    Attributes:
        rung: Index in the ladder.
        variant: The rung's name.
        outcome: ``ok``, ``killed``, ``oom``, ``cuda_oom``, ``timeout``, ``unavailable``,
            ``rejected`` (bad input), ``transient``, ``worker_lost``, ``error``; None while running.
        reason: Why it ended that way, in words an operator can act on.
        retries: Celery's ``request.retries`` when it started; tells a retry from a redelivery.
        started: Unix time.
        duration: Seconds, None for an attempt cut short.
        peak_rss_mb: The child's peak RSS during this attempt (for a killed one, what the
            watchdog saw).
        host: Machine name.
        worker: Celery node name.
        pid: Child process id.
    """

    rung: int
    variant: str
    outcome: str | None = None
    reason: str = ""
    retries: int = 0
    started: float = field(default_factory=time.time)
    duration: float | None = None
    peak_rss_mb: float | None = None
    host: str = HOST
    worker: str = ""
    pid: int = field(default_factory=os.getpid)

    def to_json(self) -> dict[str, Any]:
        # Flat fields only, so a shallow copy is the JSON form (dataclasses.asdict deep-copies, 10x slower).
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attempt:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


class AttemptLog:
    """Read and write one job's attempts. ``client`` is a redis-py client."""

    def __init__(self, client: Any, job_id: str, ttl: int) -> None:
        self.client, self.job_id, self.ttl = client, job_id, ttl
        self._key = history_key(job_id)

    def load(self) -> tuple[list[Attempt], dict[str, Any] | None]:
        """All attempts so far, and the watchdog's last kill record for this job (if any)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.lrange(self._key, 0, -1)
        pipe.get(kill_key(self.job_id))
        raw, kill = pipe.execute()
        return [Attempt.from_json(json.loads(r)) for r in raw], (json.loads(kill) if kill else None)

    def append(self, attempt: Attempt) -> int:
        """Record a new attempt; returns its index."""
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(self._key, json.dumps(attempt.to_json()))
        pipe.expire(self._key, self.ttl)
        length, _ = pipe.execute()
        return int(length) - 1

    def append_behind(self, attempt: Attempt) -> PendingAppend:
        """Send the new attempt's record without waiting for Redis to answer.

        The record is what lets a later attempt recognise this one as killed, so it must be
        sent before the engine runs; but nothing needs its answer until the attempt ends, and a
        round trip per job is most of the farm's per-job cost (bench/overhead.py). Once written
        to the socket it reaches Redis even if this process is SIGKILLed: the kernel still
        delivers a dead process's sent bytes.
        """
        connection = self.client.connection_pool.get_connection()
        try:
            connection.send_packed_command(
                connection.pack_commands(
                    [("RPUSH", self._key, json.dumps(attempt.to_json())), ("EXPIRE", self._key, self.ttl)]
                )
            )
        except BaseException:
            self.client.connection_pool.release(connection)
            raise
        return PendingAppend(self.client.connection_pool, connection)

    def clear_kill(self) -> None:
        self.client.delete(kill_key(self.job_id))

    def update(self, index: int, attempt: Attempt) -> None:
        self.client.lset(self._key, index, json.dumps(attempt.to_json()))


class PendingAppend:
    """The unanswered RPUSH + EXPIRE of :meth:`AttemptLog.append_behind`."""

    def __init__(self, pool: Any, connection: Any) -> None:
        self._pool, self._connection = pool, connection
        self._index: int | None = None

    def index(self) -> int:
        """Read Redis's answers (once), hand the connection back; the attempt's index."""
        if self._index is None:
            try:
                length = self._connection.read_response()
                self._connection.read_response()
            except BaseException:
                self._connection.disconnect()  # its replies are out of step now
                raise
            finally:
                self._pool.release(self._connection)
            self._index = int(length) - 1
        return self._index

    def settle_quietly(self) -> None:
        """Read the replies if they can be read; a broken connection is dropped, not raised."""
        try:
            self.index()
        except Exception:  # noqa: BLE001 - the connection is already disconnected and released
            pass


def record_kill(client: Any, job_id: str, record: dict[str, Any], ttl: int) -> None:
    """Written by the watchdog in the worker's main process *before* it sends SIGKILL."""
    client.set(kill_key(job_id), json.dumps(record), ex=ttl)


def read_attempts(client: Any, job_id: str, envelope: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The history as plain dicts, for the client and the CLI.

    For a job that succeeded, pass its result envelope: its ``attempts`` are the complete
    history (the log's copy of the last attempt is never completed, see ``run_ladder``).
    """
    if envelope is not None and isinstance(envelope.get("attempts"), list):
        return envelope["attempts"]
    return [json.loads(r) for r in client.lrange(history_key(job_id), 0, -1)]
