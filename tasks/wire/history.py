"""The attempt history of a job: one Redis list per job id, beside Celery's result.

Each attempt is written when it starts and completed when it ends. An attempt still open when
the job runs again was cut short: its child was SIGKILLed (the watchdog left its reason under
``keys.kill``) or its whole worker died. The next attempt settles it from that evidence.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.records import Attempt, KillRecord, attempts_in_current_names, in_current_names

# A Lua function for the farm's scripts (here and ``tasks/result_backend.py``): does the result key hold a
# stored SUCCESS? A meta that is not JSON is not one.
LUA_STORED_SUCCESS = """
local function stored_success(key)
  local stored = redis.call('GET', key)
  if not stored then return false end
  local ok, meta = pcall(cjson.decode, stored)
  return ok and type(meta) == 'table' and meta['status'] == 'SUCCESS'
end
"""


class AttemptLog:
    """Read and write one job's attempts. ``client`` is a redis-py client."""

    def __init__(self, client: Any, job_id: str, ttl: int) -> None:
        self.client, self.job_id, self.ttl = client, job_id, ttl
        self._key = keys.history(job_id)
        self._script: Any = None

    def read(self) -> tuple[list[Attempt], KillRecord | None]:
        """All attempts so far, and the watchdog's last kill record for this job (if any)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.lrange(self._key, 0, -1)
        pipe.get(keys.kill(self.job_id))
        raw, kill = pipe.execute()
        record = KillRecord.from_json(json.loads(kill)) if kill else None
        return [Attempt.from_json(json.loads(r)) for r in raw], record
    def append(self, attempt: Attempt, result_key: str = "") -> int:
        """Record a new attempt; returns its index, or -1 when the job has a stored SUCCESS
        (``result_key``) and nothing was written."""
        length, _, _ = self.client.eval(*self._append_command(attempt, result_key))
        return int(length) - 1 if length >= 0 else -1

    def append_behind(self, attempt: Attempt, result_key: str = "") -> PendingAppend:
        """Send the new attempt's record without waiting for Redis to answer.

        The record is what lets a later attempt recognise this one as killed, so it must be
        sent before the engine runs; but nothing needs its answer until the attempt ends, and a
        round trip per job is most of the farm's per-job cost (docs/benchmarks/overhead.md). Once written
        to the socket it reaches Redis even if this process is SIGKILLed: the kernel still
        delivers a dead process's sent bytes.

        The record is not written when the job already has a stored SUCCESS (``result_key``): a
        redelivered message that a stale or paused worker picks up after the job succeeded
        elsewhere must leave the history as the envelope tells it (found by the chaos suite).
        """
        # EVAL, not EVALSHA: the reply is read later, so a NOSCRIPT could not be retried. Redis
        # caches the compiled script; the cost is its text on the wire.
        command = ("EVAL", *self._append_command(attempt, result_key))
        connection = self.client.connection_pool.get_connection()
        try:
            connection.send_packed_command(connection.pack_command(*command))
        except BaseException:
            self.client.connection_pool.release(connection)
            raise
        return PendingAppend(self.client.connection_pool, connection)

    def _append_command(self, attempt: Attempt, result_key: str) -> tuple[Any, ...]:
        return (_APPEND_UNLESS_SUCCEEDED, 5, self._key, keys.cancel(self.job_id), result_key or self._key,
                keys.partials(self.job_id), keys.progress(self.job_id),
                json.dumps(attempt.to_json()), self.ttl, int(bool(result_key)), keys.bell(self.job_id))  # fmt: skip

    def clear_kill(self) -> None:
        self.client.delete(keys.kill(self.job_id))

    def settle(self, index: int, attempt: Attempt, result_key: str = "") -> bool:
        """Give an attempt another process left open its outcome, if it is still that open
        attempt (its owner may have finished it meanwhile) and the job has no stored SUCCESS
        (``result_key``). False when it was not written."""
        return bool(self._write(index, attempt, newest=False, result_key=result_key))

    def finish(self, index: int, attempt: Attempt, result_key: str) -> bool:
        """Write this process's own attempt's outcome, only if that attempt is still open, is
        still the newest, and the job has no stored SUCCESS (``result_key``). False: this process
        is stale (it was paused or cut off while the job went on elsewhere) and must write nothing.
        """
        return bool(self._write(index, attempt, newest=True, result_key=result_key))

    def _write(self, index: int, attempt: Attempt, *, newest: bool, result_key: str = "") -> int:
        if self._script is None:  # lazily: most jobs never write an outcome here
            self._script = self.client.register_script(_CONDITIONAL_LSET)
        return int(
            self._script(
                keys=[self._key, result_key],
                args=[index, attempt.pid, attempt.worker, repr(attempt.started), json.dumps(attempt.to_json()),
                      int(newest), keys.bell(self.job_id)],
            )  # fmt: skip
        )


# An attempt's outcome is written only over the very attempt the writer means: same child, same
# worker, same start, still open, and no SUCCESS stored (the SUCCESS made the log its envelope's,
# ``tasks.result_backend``); for a process finishing its own attempt, also still the newest
# attempt. Atomic in Redis, so a stale process can never rewrite history. A write rings the job's
# bell (ARGV[7], ``keys.bell``) with ``keys.BELL_ATTEMPT`` in the same step.
_CONDITIONAL_LSET = LUA_STORED_SUCCESS + """
local i = tonumber(ARGV[1])
if ARGV[6] == '1' and redis.call('LLEN', KEYS[1]) ~= i + 1 then return 0 end
local raw = redis.call('LINDEX', KEYS[1], i)
if not raw then return 0 end
local a = cjson.decode(raw)
if a['outcome'] ~= nil and a['outcome'] ~= cjson.null then return 0 end
if tostring(a['pid']) ~= ARGV[2] or a['worker'] ~= ARGV[3] then return 0 end
if math.abs(tonumber(a['started']) - tonumber(ARGV[4])) > 0.000001 then return 0 end
if KEYS[2] ~= '' and stored_success(KEYS[2]) then return 0 end
redis.call('LSET', KEYS[1], i, ARGV[5])
redis.call('PUBLISH', ARGV[7], 'attempt')
return 1
"""


# Appends an attempt record (RPUSH + EXPIRE) unless the job has a stored SUCCESS; answers
# {list length or -1 when not appended, cancel flag, 1 when a SUCCESS was stored}. The partial
# outputs and progress of the attempt before go in the same step, so whoever reads the history and
# the partials together knows whose they are: the newest attempt's (the gateway's event ids rely on
# it). The new attempt's own reset (``JobChannel.reset``) comes a moment later, too late for that.
# An append rings the job's bell (ARGV[4], ``keys.bell``) with ``keys.BELL_ATTEMPT``.
_APPEND_UNLESS_SUCCEEDED = LUA_STORED_SUCCESS + """
local cancelled = redis.call('EXISTS', KEYS[2])
if ARGV[3] == '1' and stored_success(KEYS[3]) then return {-1, cancelled, 1} end
local length = redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('DEL', KEYS[4], KEYS[5])
redis.call('PUBLISH', ARGV[4], 'attempt')
return {length, cancelled, 0}
"""


class PendingAppend:
    """The unanswered conditional append of :meth:`AttemptLog.append_behind`."""

    def __init__(self, pool: Any, connection: Any) -> None:
        self._pool, self._connection = pool, connection
        # The engine's first cancel check may read the answer (``JobChannel.attempt_began``), from
        # whatever thread it checks in: one reader at a time, or the replies go out of step.
        self._reading = threading.Lock()
        self._failed: BaseException | None = None
        self._index: int | None = None
        self._cancelled = False
        self._succeeded_before = False

    def succeeded_before(self) -> bool:
        """Was a SUCCESS already stored for the job when this attempt began (so no record of it
        was written)? False if unreadable."""
        self.settle_quietly()
        return self._succeeded_before

    def cancelled(self) -> bool:
        """Had the producer cancelled the job when this attempt was recorded? (False if unreadable.)"""
        self.settle_quietly()
        return self._cancelled

    def index(self) -> int:
        """Read Redis's answer (once), hand the connection back; the attempt's index (-1: no
        record was written, the job had succeeded)."""
        with self._reading:
            return self._read_index()

    def _read_index(self) -> int:
        if self._failed is not None:
            # The connection went back to the pool after the failed read: never read it again.
            raise self._failed
        if self._index is None:
            try:
                length, cancelled, succeeded = self._connection.read_response()
                self._cancelled, self._succeeded_before = bool(cancelled), bool(succeeded)
            except BaseException as exc:
                self._connection.disconnect()  # its replies are out of step now
                self._failed = exc
                raise
            finally:
                self._pool.release(self._connection)
            self._index = int(length) - 1 if length >= 0 else -1
        return self._index

    def settle_quietly(self) -> None:
        """Read the replies if they can be read; a broken connection is dropped, not raised."""
        try:
            self.index()
        except Exception:  # noqa: BLE001 - the connection is already disconnected and released
            pass


def record_kill(client: Any, job_id: str, record: KillRecord, ttl: int) -> None:
    """Written by the watchdog in the worker's main process *before* it sends SIGKILL."""
    client.set(keys.kill(job_id), json.dumps(record.to_json()), ex=ttl)


def read_attempts(client: Any, job_id: str, envelope: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The history as plain dicts, for the client and the CLI.

    For a job that succeeded, pass its result envelope: its ``attempts`` are the history, and the
    log holds the same once the SUCCESS is stored (``tasks.result_backend``); the envelope is read
    anyway, as the log expires with its own TTL and is gone after ``farm gc``.
    """
    if envelope is not None and isinstance(envelope.get("attempts"), list):
        return attempts_in_current_names(envelope["attempts"])
    return [in_current_names(json.loads(r)) for r in client.lrange(keys.history(job_id), 0, -1)]
