"""Celery's Redis result backend, with a stored SUCCESS that nothing but a SUCCESS replaces.

Celery means to keep a SUCCESS (``BaseKeyValueStoreBackend._store_result`` reads the stored state
first and skips the write after a SUCCESS), but it reads and writes in two round trips. A job that
moves down its ladder publishes its retry before the tracer stores RETRY, so with no retry delay
the next rung can run and store SUCCESS in between, and the late RETRY then replaces it: the job
reads as RETRY for good (seen in CI, tests/integration/test_kill_safety.py). Here every write but
a SUCCESS is one Lua script that checks and writes atomically; the SUCCESS write is Celery's own.

No state that is not an end (RETRY, STARTED, PENDING, a family's own) replaces a stored end
(SUCCESS, FAILURE, REVOKED) either. Celery's main process retries a job whose child was lost
(``task_retry_on_worker_lost``) by sending the retry first and storing RETRY after; a stale
worker's child (its worker paused past the visibility timeout, the job meanwhile ended elsewhere)
killed by the watchdog did exactly that, and the job read RETRY for good over another worker's
FAILURE (found by the chaos suite). An end may still follow an end that is not a SUCCESS, but
for a FAILURE after a REVOKED: a job its producer cancelled stays cancelled.

A farm job's SUCCESS (its result is the job's envelope) is one Lua script too: it keeps the first
stored SUCCESS (a second completion publishes nothing), and in the same step it makes the job's
attempt log the envelope's attempts. A stale copy of the job's message (a paused or cut-off
worker's, handed out again meanwhile) may have appended an attempt the successful worker never
read; without this the log would keep that open record after the envelope's last attempt. Once
the SUCCESS is stored, the log's conditional writes (``tasks.wire.history``) refuse every change, so
history and envelope agree for good.

``config.celery`` selects this class for every Redis result URL (Celery's ``class+url`` form).
"""

from __future__ import annotations

import json
from typing import Any

from celery import states
from celery.backends.redis import RedisBackend
from celery.exceptions import BackendStoreError
from kombu.utils.encoding import bytes_to_str

from mediafarm.tasks import sent_ledger
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.history import LUA_STORED_SUCCESS
from mediafarm.tasks.wire.trace import counting_connection

# Writes the state (KEYS[1] = ARGV[1], expiry ARGV[2] s, 0: none) and publishes it to waiting
# clients, as Celery's ``_set`` does, unless the stored meta is a SUCCESS (then returns 0). A meta
# that is not JSON is overwritten as before. The start of both scripts below.
_SET_AND_PUBLISH_UNLESS_SUCCESS = LUA_STORED_SUCCESS + """
if stored_success(KEYS[1]) then return 0 end
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ttl)
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', KEYS[1], ARGV[1])
"""

# Any state (ARGV[5]) but a farm job's SUCCESS. Over a stored end it writes nothing and returns 0
# when it is no end itself, or a FAILURE over a REVOKED (a cancelled job stays cancelled). An end
# (FAILURE, REVOKED: ARGV[3] the job id, else '') also takes the job out of the ledger of messages
# sent (KEYS[2], KEYS[3], ``tasks.sent_ledger``). The job's bell (ARGV[4], ``keys.bell``; '' for a
# key that names no job) rings with ``keys.BELL_STATE``.
_SET_STATE = sent_ledger.LUA_FORGET + """
local function stored_status(key)
  local stored = redis.call('GET', key)
  if not stored then return nil end
  local ok, meta = pcall(cjson.decode, stored)
  if not ok or type(meta) ~= 'table' then return nil end
  return meta['status']
end
local ENDS = {SUCCESS = true, FAILURE = true, REVOKED = true}
local before = stored_status(KEYS[1])
if before ~= nil and ENDS[before] then
  if not ENDS[ARGV[5]] or (before == 'REVOKED' and ARGV[5] == 'FAILURE') then return 0 end
end
""" + _SET_AND_PUBLISH_UNLESS_SUCCESS + """
forget_sent(KEYS[2], KEYS[3], ARGV[3])
if ARGV[4] ~= '' then redis.call('PUBLISH', ARGV[4], 'state') end
return 1
"""

# A farm job's SUCCESS: then the job's attempt log (KEYS[2]) becomes the envelope's attempts
# (ARGV[5...]), the job (ARGV[3]) leaves the ledger of messages sent (KEYS[3], KEYS[4]), and its
# bell (ARGV[4]) rings with ``keys.BELL_STATE``.
_STORE_SUCCESS_WITH_HISTORY = sent_ledger.LUA_FORGET + _SET_AND_PUBLISH_UNLESS_SUCCESS + """
redis.call('DEL', KEYS[2])
for i = 5, #ARGV do
  redis.call('RPUSH', KEYS[2], ARGV[i])
end
if #ARGV > 4 and ttl > 0 then redis.call('EXPIRE', KEYS[2], ttl) end
forget_sent(KEYS[3], KEYS[4], ARGV[3])
redis.call('PUBLISH', ARGV[4], 'state')
return 1
"""


def _envelope_attempts(task_id: str, result: Any) -> list[Any] | None:
    """The attempts of a farm job's envelope (``records.Envelope``), or None for any other result."""
    if isinstance(result, dict) and result.get("job_id") == task_id and isinstance(result.get("attempts"), list):
        return result["attempts"]
    return None


class FarmRedisBackend(RedisBackend):
    """RedisBackend whose writes never replace a stored SUCCESS, nor a stored end with a state that is not one."""

    _set_state_script: Any = None
    _store_success_script: Any = None

    def _create_client(self, **params: Any) -> Any:
        # Its connections count their round trips, for the job's trace (``tasks.wire.trace``).
        base = params.get("connection_class") or self.redis.Connection
        return super()._create_client(**{**params, "connection_class": counting_connection(base)})

    def on_task_call(self, producer: Any, task_id: Any) -> None:
        """Subscribe to a task's result when someone waits for it, not as it is sent.

        Celery subscribes as it sends so that ``apply_async().get()`` is subscribed early; the
        subscription ends when that ``AsyncResult`` is collected, usually long before anyone waits
        (``submit`` keeps only the id). A job then paid SUBSCRIBE, UNSUBSCRIBE, and SUBSCRIBE again
        in ``wait`` (issue #34); a job nobody waits for (the gateway's) paid the first two for
        nothing. Waiting misses nothing: it subscribes, then reads the stored state once."""

    def _store_result(
        self, task_id: Any, result: Any, state: str, traceback: Any = None, request: Any = None, **kwargs: Any
    ) -> Any:
        attempts = _envelope_attempts(bytes_to_str(task_id), result) if state == states.SUCCESS else None
        if attempts is None:
            return super()._store_result(task_id, result, state, traceback, request, **kwargs)
        meta = self._get_result_meta(result=result, state=state, traceback=traceback, request=request)
        meta["task_id"] = bytes_to_str(task_id)
        value = self.encode(meta)
        if isinstance(value, str) and len(value) > self._MAX_STR_VALUE_SIZE:
            raise BackendStoreError("value too large for Redis backend", state=state, task_id=task_id)
        history = [json.dumps(a) for a in attempts]
        key, history_key = self.get_key_for_task(task_id), keys.history(meta["task_id"])
        self.ensure(self._store_success, (key, value, history_key, history, meta["task_id"]))
        return result

    def _store_success(self, key: Any, value: Any, history_key: str, history: list[str], job_id: str = "") -> bool:
        if self._store_success_script is None:
            self._store_success_script = self.client.register_script(_STORE_SUCCESS_WITH_HISTORY)
        args = [value, int(self.expires or 0), job_id, keys.bell(job_id), *history]
        ledger = [keys.sent_messages(), keys.sent_times()]
        return bool(self._store_success_script(keys=[key, history_key, *ledger], args=args))

    def _set_with_state(self, key: Any, value: Any, state: str) -> Any:
        if state == states.SUCCESS:
            return super()._set_with_state(key, value, state)
        expires = self.failure_expires if state == states.FAILURE else None
        if isinstance(value, str) and len(value) > self._MAX_STR_VALUE_SIZE:
            return super()._set_with_state(key, value, state)  # Celery's own refusal
        job_id = self._job_id_of(key)
        ended = job_id if state in states.READY_STATES else ""
        return self.ensure(self._set_state, (key, value, expires, ended, job_id, state))

    def _set_state(
        self, key: Any, value: Any, expires: Any = None, ended: str = "", job_id: str = "", state: str = states.FAILURE
    ) -> bool:
        if expires is None:
            expires = self.expires
        if self._set_state_script is None:
            self._set_state_script = self.client.register_script(_SET_STATE)
        ledger = [keys.sent_messages(), keys.sent_times()]
        bell = keys.bell(job_id) if job_id else ""
        args = [value, int(expires or 0), ended, bell, state]
        return bool(self._set_state_script(keys=[key, *ledger], args=args))

    def _job_id_of(self, key: Any) -> str:
        """The task id a result key names (``celery-task-meta-<id>``), '' for any other key."""
        key, prefix = bytes_to_str(key), bytes_to_str(self.task_keyprefix)
        return key[len(prefix):] if key.startswith(prefix) else ""
