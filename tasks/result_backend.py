"""Celery's Redis result backend, with a stored SUCCESS that nothing but a SUCCESS replaces.

Celery means to keep a SUCCESS (``BaseKeyValueStoreBackend._store_result`` reads the stored state
first and skips the write after a SUCCESS), but it reads and writes in two round trips. A job that
moves down its ladder publishes its retry before the tracer stores RETRY, so with no retry delay
the next rung can run and store SUCCESS in between, and the late RETRY then replaces it: the job
reads as RETRY for good (seen in CI, tests/integration/test_kill_safety.py). Here every write but
a SUCCESS is one Lua script that checks and writes atomically; the SUCCESS write is Celery's own.
``config.celery`` selects this class for every Redis result URL (Celery's ``class+url`` form).
"""

from __future__ import annotations

from typing import Any

from celery import states
from celery.backends.redis import RedisBackend

# Writes the state (with its expiry) and publishes it to waiting clients, as Celery's ``_set``
# does, unless the stored meta is a SUCCESS. A meta that is not JSON is overwritten as before.
_SET_UNLESS_SUCCESS = """
local stored = redis.call('GET', KEYS[1])
if stored then
  local ok, meta = pcall(cjson.decode, stored)
  if ok and type(meta) == 'table' and meta['status'] == 'SUCCESS' then return 0 end
end
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ttl)
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
"""

class FarmRedisBackend(RedisBackend):
    """RedisBackend whose non-SUCCESS writes never replace a stored SUCCESS."""

    _set_unless_success_script: Any = None

    def _set_with_state(self, key: Any, value: Any, state: str) -> Any:
        if state == states.SUCCESS:
            return super()._set_with_state(key, value, state)
        expires = self.failure_expires if state == states.FAILURE else None
        if isinstance(value, str) and len(value) > self._MAX_STR_VALUE_SIZE:
            return super()._set_with_state(key, value, state)  # Celery's own refusal
        return self.ensure(self._set_unless_success, (key, value, expires))

    def _set_unless_success(self, key: Any, value: Any, expires: Any = None) -> bool:
        if expires is None:
            expires = self.expires
        if self._set_unless_success_script is None:
            self._set_unless_success_script = self.client.register_script(_SET_UNLESS_SUCCESS)
        return bool(self._set_unless_success_script(keys=[key], args=[value, int(expires or 0)]))
