"""Records that each live worker rewrites in one Redis hash, stamped with the Redis server's time.

A worker's capability record (``tasks.wire.capability``) and its load record (``tasks.wire.worker_load``)
are kept alike: one field per worker node, its JSON object carrying ``"at"``, the server's time of
the write, so that readers on other hosts judge a record's age by the server's clock, not theirs.
A writer drops the fields older than its ``forget_after`` (a worker killed without its stop step);
a reader takes only the records written within its ``stale_s``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

# KEYS[1]: the hash. ARGV[1]: the node, ARGV[2]: its record as a JSON object, ARGV[3]: seconds after
# which any field is dropped. Writes the record with the server's time (``"at"`` set inside the
# JSON object) and drops fields older than ARGV[3]; returns the time.
_WRITE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local record = cjson.decode(ARGV[2])
record['at'] = now
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(record))
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local ok, other = pcall(cjson.decode, all[i + 1])
  if not ok or type(other) ~= 'table' or now - (tonumber(other['at']) or 0) > tonumber(ARGV[3]) then
    redis.call('HDEL', KEYS[1], all[i])
  end
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return tostring(now)
"""


class Timed(Protocol):
    node: str
    at: float


R = TypeVar("R", bound=Timed)


def write(client: Any, key: str, node: str, record_json: str, forget_after: float) -> float:
    """Write one worker's record (its ``at`` the Redis server's now); the time written."""
    return float(client.eval(_WRITE, 1, key, node, record_json, forget_after))


def live(client: Any, key: str, parse: Callable[[Any], R], stale_s: float) -> list[R]:
    """The records of ``key`` written within ``stale_s`` by the Redis server's clock, by node name."""
    pipe = client.pipeline(transaction=False)
    pipe.time()
    pipe.hvals(key)
    (seconds, micros), raws = pipe.execute()
    return fresh(raws, seconds + micros / 1e6, parse, stale_s)


def fresh(raws: Iterable[Any], now: float, parse: Callable[[Any], R], stale_s: float) -> list[R]:
    """The readable records of ``raws`` no older than ``stale_s`` at ``now``, by node name; an
    unreadable one (another farm's, a half-written one) is left out."""
    out = []
    for raw in raws:
        try:
            record = parse(raw)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if now - record.at <= stale_s:
            out.append(record)
    return sorted(out, key=lambda r: r.node)
