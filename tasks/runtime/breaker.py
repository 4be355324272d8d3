"""A circuit breaker per rung and pool, and the memory-pressure step-down: rungs a new job skips now.

A rung that fails by resource (killed, oom, cuda_oom, timeout) on every job costs every job a
failed attempt, often a kill, before it moves down. The breaker stops that. It counts only the
failures the rung caused (``tasks.runtime.attribution``: the watchdog's own kills, a kernel OOM kill the
counters attribute, MemoryError, CUDA OOM, a time limit), never an outside kill or a lost worker:

    closed     every job runs the rung; its failures on this pool that the rung caused are counted
      │ `failures` of them within `window_s`
      ▼
    open       new jobs skip the rung (history: ``skipped``, the reason, no attempt spent)
      │ `cooldown_s` later, the first job to reach the rung claims the probe (atomically)
      ▼
    half_open  the probe runs the rung; the other jobs still skip it
      ├─ the probe succeeds                  → closed (the count starts again)
      ├─ the probe fails by resource         → open, with a fresh cool-down
      └─ it ends otherwise (bad input ...)   → its claim lapses, the next job probes

The state lives in the result backend's Redis (``keys.breakers``, ``keys.breaker_failures``), so
every worker of a pool agrees; each change is one Lua script, so two workers never both open it
twice or both probe. An open breaker never turns a good job into a non-answer
(``tasks.runtime.ladder_choice``): a job skips the rung only when a rung below it gives a real answer;
when only fallbacks are left below, it waits for the cool-down's end (at most ``max_wait_s``),
then runs the rung, as the probe if it can claim it, else anyway; and a rung it skipped is
tried once before the job takes a fallback or ends. Jobs already past the rung are not
affected; a job that the breaker moves down records why.

A ladder that declares ``step_down_under_pressure`` (``config.ladder_policy``) also starts its
new jobs one rung lower while the admission control's reading says the pool's memory is under
pressure, but never onto a fallback; that skip is recorded the same way.

Breaker bookkeeping never fails a job: a Redis error here is logged and the rung runs (or the
failure goes uncounted).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mediafarm.config.ladder_policy import BreakerPolicy, ladder_policy
from mediafarm.tasks.wire import keys, pool_hashes
from mediafarm.tasks.wire.records import RESOURCE_OUTCOMES, Attempt, Outcome

log = logging.getLogger("mediafarm.breaker")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
# What a job is told as it reaches a rung.
RUN, PROBE, SKIP = "run", "probe", "skip"


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


@dataclass(frozen=True)
class BreakerState:
    """One breaker that is not closed, as ``keys.breakers`` holds it (see there for the fields)."""

    pool: str
    ladder: str
    rung: str
    state: str
    since: float
    until: float
    failures: int
    window_s: float
    opened: int = 1
    probe: str | None = None
    probe_until: float | None = None

    @classmethod
    def from_json(cls, pool: str, field: str, data: dict[str, Any]) -> BreakerState:
        ladder, _, rung = field.partition("/")
        return cls(
            pool=pool, ladder=ladder, rung=rung, state=str(data.get("state", OPEN)),
            since=float(data.get("since", 0)), until=float(data.get("until", 0)),
            failures=int(data.get("failures", 0)), window_s=float(data.get("window_s", 0)),
            opened=int(data.get("opened", 1)), probe=data.get("probe") or None,
            probe_until=float(data["probe_until"]) if data.get("probe_until") else None,
        )  # fmt: skip

    def reason(self) -> str:
        """Why a job skips the rung, in the words its history keeps."""
        again = f", reopened after {self.opened - 1} failed probe(s)" if self.opened > 1 else ""
        now = f"job {self.probe} probes it" if self.state == HALF_OPEN else f"cool-down until {_utc(self.until)}"
        return (
            f"breaker open since {_utc(self.since)}, {self.failures} failures in {self.window_s:g} s on pool "
            f"{self.pool}{again}; {now}"
        )


def _field(ladder: str, rung: str) -> str:
    return f"{ladder}/{rung}"


# KEYS: breakers hash, failures zset. ARGV: field, now, member, failures, window_s, cooldown_s, job id.
# Answers {what happened, the state's JSON or the count}.
_FAILED = """
local now = tonumber(ARGV[2])
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw then
  local st = cjson.decode(raw)
  if st['state'] == 'half_open' and st['probe'] == ARGV[7] then
    st['state'] = 'open'
    st['since'] = now
    st['until'] = now + tonumber(ARGV[6])
    st['opened'] = (st['opened'] or 1) + 1
    st['probe'] = nil
    st['probe_until'] = nil
    raw = cjson.encode(st)
    redis.call('HSET', KEYS[1], ARGV[1], raw)
    return {'reopened', raw}
  end
  return {'unchanged', raw}
end
local window = tonumber(ARGV[5])
redis.call('ZADD', KEYS[2], now, ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. tostring(now - window))
redis.call('PEXPIRE', KEYS[2], math.max(1, math.ceil(window * 1000)))
local n = redis.call('ZCARD', KEYS[2])
if n >= tonumber(ARGV[4]) then
  local st = {state='open', since=now, ['until']=now + tonumber(ARGV[6]), failures=n, window_s=window, opened=1}
  raw = cjson.encode(st)
  redis.call('HSET', KEYS[1], ARGV[1], raw)
  redis.call('DEL', KEYS[2])
  return {'opened', raw}
end
return {'counted', tostring(n)}
"""

# KEYS: breakers hash. ARGV: field, now, job id, probe claim seconds. Answers {verdict, state JSON}.
_DECIDE = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return {'run', ''} end
local st = cjson.decode(raw)
local now = tonumber(ARGV[2])
if st['state'] == 'half_open' and st['probe'] == ARGV[3] then return {'probe', raw} end
local free = (st['state'] == 'open' and now >= tonumber(st['until']))
  or (st['state'] == 'half_open' and now >= tonumber(st['probe_until']))
if not free then return {'skip', raw} end
st['state'] = 'half_open'
st['probe'] = ARGV[3]
st['probe_until'] = now + tonumber(ARGV[4])
raw = cjson.encode(st)
redis.call('HSET', KEYS[1], ARGV[1], raw)
return {'probe', raw}
"""

# KEYS: breakers hash, failures zset. ARGV: field, job id, now, '1' to close (the probe succeeded)
# or '0' to let its claim lapse (it ended neither well nor by resource). 1 when it was the probe.
_PROBE_ENDED = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
local st = cjson.decode(raw)
if st['state'] ~= 'half_open' or st['probe'] ~= ARGV[2] then return 0 end
if ARGV[4] == '1' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2])
else
  st['probe_until'] = tonumber(ARGV[3])
  redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(st))
end
return 1
"""


class Breakers:
    """The breakers of one pool, as one process sees them. ``client``: the result backend's redis-py client.

    ``clock`` gives Unix time (tests pass a fake one); every worker's clock should agree within
    a second or so (NTP), as the cool-down is compared with it.
    """

    def __init__(self, client: Any, pool: str, clock: Callable[[], float] = time.time) -> None:
        self.client, self.pool, self.clock = client, pool, clock
        self.key = keys.breakers(pool)
        self._view: dict[str, BreakerState] = {}
        self._read_at = float("-inf")
        self._scripts: dict[str, Any] = {}

    def _script(self, text: str) -> Any:
        if text not in self._scripts:
            self._scripts[text] = self.client.register_script(text)
        return self._scripts[text]

    def view(self, refresh_s: float) -> dict[str, BreakerState]:
        """The breakers not closed, by ``<ladder>/<rung>``; read again when older than ``refresh_s``."""
        now = time.monotonic()
        if now - self._read_at >= refresh_s:
            raw = self.client.hgetall(self.key)
            self._view = {
                f.decode(): BreakerState.from_json(self.pool, f.decode(), json.loads(v)) for f, v in raw.items()
            }
            self._read_at = now
        return self._view

    def _keep(self, field: str, raw: Any) -> BreakerState | None:
        """Update this process's view with a state a script answered; the state."""
        if not raw:
            self._view.pop(field, None)
            return None
        state = BreakerState.from_json(self.pool, field, json.loads(raw))
        self._view[field] = state
        return state

    def decide(
        self, ladder: str, rung: str, job_id: str, probe_s: float, refresh_s: float
    ) -> tuple[str, BreakerState | None]:
        """May ``job_id`` run ``rung`` now? RUN (closed), PROBE (this job is the half-open probe)
        or SKIP (open), with the breaker's state. A round trip only when the breaker is not closed
        and its cool-down is over (the probe is claimed in Redis, by one job)."""
        field = _field(ladder, rung)
        known = self.view(refresh_s).get(field)
        if known is None:
            return RUN, None
        if known.state == OPEN and self.clock() < known.until:
            return SKIP, known
        verdict, raw = self._script(_DECIDE)(keys=[self.key], args=[field, repr(self.clock()), job_id, probe_s])
        verdict = verdict.decode() if isinstance(verdict, bytes) else verdict
        return verdict, self._keep(field, raw)

    def failed(self, ladder: str, rung: str, policy: BreakerPolicy, attempt: Attempt, job_id: str) -> str:
        """Count one resource failure of ``rung``; what it did: ``counted``, ``opened``,
        ``reopened`` (it was the probe's) or ``unchanged`` (already open: a job that began before)."""
        field = _field(ladder, rung)
        member = f"{job_id}:{attempt.started!r}"
        what, raw = self._script(_FAILED)(
            keys=[self.key, keys.breaker_failures(self.pool, ladder, rung)],
            args=[field, repr(self.clock()), member, policy.failures, policy.window_s, policy.cooldown_s, job_id],
        )
        what = what.decode() if isinstance(what, bytes) else what
        if what != "counted":
            state = self._keep(field, raw)
            if what in ("opened", "reopened") and state is not None:
                log.warning("rung %s of ladder %s: %s", rung, ladder, state.reason())
        return str(what)

    def probe_ended(self, ladder: str, rung: str, job_id: str, succeeded: bool) -> bool:
        """The probe ``job_id`` ended: close the breaker (``succeeded``) or let the next job probe.
        False when ``job_id`` was not (or no longer) the probe."""
        field = _field(ladder, rung)
        done = self._script(_PROBE_ENDED)(
            keys=[self.key, keys.breaker_failures(self.pool, ladder, rung)],
            args=[field, job_id, repr(self.clock()), int(succeeded)],
        )
        if done and succeeded:
            self._view.pop(field, None)
            log.warning("rung %s of ladder %s: breaker closed on pool %s, its probe %s succeeded", rung, ladder,
                        self.pool, job_id)  # fmt: skip
        return bool(done)


_BY_POOL: dict[tuple[str, int], Breakers] = {}


def pool_breakers(client: Any, pool: str) -> Breakers:
    """This process's view of ``pool``'s breakers through ``client`` (one per client and pool, so its
    cached reading serves every job of the process)."""
    found = _BY_POOL.get((pool, id(client)))
    if found is None or found.client is not client:
        found = _BY_POOL[(pool, id(client))] = Breakers(client, pool)
    return found


def count_kill(client: Any, pool: str, task_name: str, fields: Any, job_id: str, pid: int, outcome: Outcome) -> str:
    """Count the watchdog's kill of ``job_id``'s child against its rung's breaker at once.

    Called in the worker's main process as it kills (``workers.guards``). The job's next delivery
    counts the same attempt again when it settles it, but that may be long after: a retried job
    goes to the back of its queue, and every job queued before it would meet the failing rung
    first. Both count the attempt under the same member, so it counts once. Returns what the
    breaker did ('' when nothing was counted: not a farm job, breaker off, no open attempt of
    that child).
    """
    from mediafarm.tasks import registry

    spec = registry.by_task_name(task_name)
    if spec is None:
        return ""
    name = fields.get(spec.ladder_field) if spec.ladder_field and isinstance(fields, dict) else None
    ladder = registry.ladder_for(spec, name if isinstance(name, str) else None)
    policy = ladder_policy(ladder.identity)
    if not policy.breaker.enabled:
        return ""
    raw = client.lindex(keys.history(job_id), -1)
    if raw is None:
        return ""
    attempt = Attempt.from_json(json.loads(raw))
    if attempt.outcome is not None or attempt.pid != pid or outcome not in RESOURCE_OUTCOMES:
        return ""  # the watchdog's kills over the cap or the hard limit: the rung's doing (runtime.attribution)
    attempt.outcome = outcome
    return pool_breakers(client, pool).failed(ladder.identity, attempt.rung, policy.breaker, attempt, job_id)


def read_breakers(client: Any, pool: str | None = None) -> list[BreakerState]:
    """Every breaker not closed, of one pool or of all (for ``farm families`` and the metrics)."""
    return [BreakerState.from_json(owner, field, json.loads(raw))
            for owner, field, raw in pool_hashes.fields(client, keys.breakers, pool)]  # fmt: skip

