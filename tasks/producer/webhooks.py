"""A job's webhook: what a producer asks for, and the events its job puts in the farm's outbox.

A job may name a URL (``webhook``) and the events it wants posted there (``webhook_events``):

- ``start``: the job's first attempt began (once per job);
- ``progress``: how far the running attempt is, at most every ``FARM_WEBHOOK_PROGRESS_S``;
- ``attempt``: an attempt ended (its rung and outcome), a killed one as the next run settles it;
- ``completed``: the job ended: SUCCESS, FAILURE or REVOKED (cancelled while it ran).

The request travels in the job's message as the ``farm_webhook`` header, so it survives every
retry and handback as the message does. The job's child only writes events into Redis (the
outbox below); it never opens a connection to the receiver. The dispatcher
(``workers.webhook_dispatch``), a process a child's kill cannot take, delivers them, signed, in
order per job, retrying with backoff. Payloads are thin: ids, state, rung and links, never the
output itself.

No network here: the address checks look at the URL as written (the dispatcher checks what the
host resolves to before each try).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.errors import InvalidRequest
from mediafarm.tasks.wire.outbound import refused_host
from mediafarm.tasks.wire.records import in_current_names, rung_of

log = logging.getLogger("mediafarm.webhooks")

EVENTS = ("start", "progress", "attempt", "completed")
DEFAULT_EVENTS = ("completed",)
# The message header the request travels in (a Celery custom header: a request attribute in the child).
HEADER = "farm_webhook"
MAX_URL = 2000
# A job's outbox lives at least this long past its last event: the longest retry schedule fits.
OUTBOX_TTL_S = 3 * 24 * 3600


@dataclass(frozen=True)
class Webhook:
    """Where a job's events go. Attributes: url, events (a subset of :data:`EVENTS`)."""

    url: str
    events: tuple[str, ...]

    def to_header(self) -> dict[str, Any]:
        return {"url": self.url, "events": list(self.events)}

    @classmethod
    def from_header(cls, value: Any) -> Webhook | None:
        """The webhook a message's header names; None for none (or one this farm cannot read)."""
        if not isinstance(value, Mapping) or not isinstance(value.get("url"), str):
            return None
        events = tuple(e for e in value.get("events") or () if e in EVENTS)
        return cls(value["url"], events)


def checked(url: str | None, events: Iterable[str] | str | None, allow: Sequence[str] = ()) -> Webhook | None:
    """The producer's ``webhook`` and ``webhook_events`` as a :class:`Webhook` (None without a URL).

    Raises:
        InvalidRequest: the URL is not http(s) with a host, names a loopback, link-local or private
            address that ``allow`` (``FARM_WEBHOOK_ALLOW``) does not list, or an event is unknown.
    """
    if url is None:
        if events:
            raise InvalidRequest("webhook_events: given without a webhook URL")
        return None
    if not isinstance(url, str) or not url or len(url) > MAX_URL:
        raise InvalidRequest(f"webhook: must be an http or https URL of at most {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        port = parts.port  # a port that is no number raises here
    except ValueError as exc:
        raise InvalidRequest(f"webhook: {url!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidRequest(f"webhook: {url!r} must be an http or https URL, not {parts.scheme or 'schemeless'}")
    if not parts.hostname:
        raise InvalidRequest(f"webhook: {url!r} names no host")
    del port
    why = refused_host(parts.hostname, allow)
    if why:
        raise InvalidRequest(f"webhook: {url!r}: {why}")
    if events is None:
        chosen: tuple[str, ...] = DEFAULT_EVENTS
    else:
        listed = [e.strip() for e in events.split(",")] if isinstance(events, str) else [str(e) for e in events]
        unknown = sorted({e for e in listed if e not in EVENTS})
        if unknown:
            raise InvalidRequest(f"webhook_events: unknown {', '.join(unknown)}; the events are {', '.join(EVENTS)}")
        chosen = tuple(e for e in EVENTS if e in listed)  # the farm's order, each once
        if not chosen:
            raise InvalidRequest(f"webhook_events: name at least one of {', '.join(EVENTS)}")
    return Webhook(url, chosen)


def job_links(base: str, job_id: str, artifacts: Iterable[str] = ()) -> dict[str, Any]:
    """Links to the job and its files on the gateway (``FARM_PUBLIC_URL``; relative without it)."""
    job = f"{base.rstrip('/')}/v1/jobs/{quote(job_id, safe='')}"
    links: dict[str, Any] = {"job": job, "events": f"{job}/events"}
    names = list(artifacts)
    if names:
        links["artifacts"] = {n: f"{job}/artifacts/{quote(n)}" for n in names}
    return links


class Outbox:
    """The farm's pending deliveries in Redis (``client``: redis-py).

    Per job, a list of events not yet delivered, oldest first (``keys.webhook_outbox``), and the
    ids ever put there (``keys.webhook_seen``), so an event written again by a redelivered job is
    not posted twice. Farm-wide, a sorted set of the jobs with an event due (``keys.webhook_due``),
    scored by when their oldest event may be tried next, in the Redis server's time (hosts' clocks
    do not matter). A dispatcher leases a job by moving its score past the try; one that dies
    mid-try leaves the lease to lapse, and another tries the same event again, with the same id.
    """

    def __init__(self, client: Any) -> None:
        self.client = client

    def put(self, job_id: str, event: dict[str, Any], *, coalesce: bool = False) -> bool:
        """Add ``event`` (with its ``id``) to the job's outbox unless it was added before. With
        ``coalesce``, it replaces a newer event of its type still waiting behind the one in flight
        (progress: only the newest matters). True when added."""
        return bool(
            self.client.eval(_PUT, 3, keys.webhook_outbox(job_id), keys.webhook_seen(job_id), keys.webhook_due(),
                             event["id"], json.dumps(event), OUTBOX_TTL_S, int(coalesce), job_id)  # fmt: skip
        )

    def claim(self, lease_s: float) -> tuple[str, dict[str, Any]] | None:
        """Lease the job whose oldest event is most overdue: (job id, that event), or None."""
        found = self.client.eval(_CLAIM, 1, keys.webhook_due(), lease_s, keys.webhook_outbox(""))
        if not found:
            return None
        job_id, raw = found
        return job_id.decode() if isinstance(job_id, bytes) else job_id, json.loads(raw)

    def settle(self, job_id: str, event: dict[str, Any], result: str, entry: dict[str, Any],
               retry_in: float = 0.0) -> bool:  # fmt: skip
        """Record one try (``entry``, in the delivery log) and its consequence: ``delivered`` or
        ``gave-up`` drop the event, ``gone`` drops every pending event of the job (410), ``retry``
        keeps it (``event`` with its count of tries) to be tried again in ``retry_in`` s. False when
        the event is no longer the job's oldest (another dispatcher settled it): nothing written."""
        return bool(
            self.client.eval(_SETTLE, 3, keys.webhook_outbox(job_id), keys.webhook_due(), keys.webhook_log(job_id),
                             job_id, event["id"], result, retry_in, json.dumps(event), json.dumps(entry),
                             LOG_CAP, OUTBOX_TTL_S)  # fmt: skip
        )

    def pending(self, job_id: str) -> list[dict[str, Any]]:
        return [json.loads(r) for r in self.client.lrange(keys.webhook_outbox(job_id), 0, -1)]

    def tries(self, job_id: str) -> list[dict[str, Any]]:
        """The job's delivery log: every try, oldest first (at most :data:`LOG_CAP`)."""
        return [json.loads(r) for r in self.client.lrange(keys.webhook_log(job_id), 0, -1)]


LOG_CAP = 500

# KEYS: outbox, seen, due. ARGV: event id, event JSON, ttl, coalesce, job id.
_PUT = """
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('EXPIRE', KEYS[2], ARGV[3])
if ARGV[4] == '1' and redis.call('LLEN', KEYS[1]) >= 2 then
  local tail = cjson.decode(redis.call('LINDEX', KEYS[1], -1))
  if tail['type'] == cjson.decode(ARGV[2])['type'] then
    redis.call('LSET', KEYS[1], -1, ARGV[2])
    return 1
  end
end
redis.call('RPUSH', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
local t = redis.call('TIME')
redis.call('ZADD', KEYS[3], 'NX', t[1], ARGV[5])
return 1
"""

# KEYS: due. ARGV: lease seconds, the outbox key's prefix (the farm has one Redis, not a cluster:
# the job's key is built here from the member found).
_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
for _ = 1, 10 do
  local jobs = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 1)
  if #jobs == 0 then return false end
  local head = redis.call('LINDEX', ARGV[2] .. jobs[1], 0)
  if head then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), jobs[1])
    return {jobs[1], head}
  end
  redis.call('ZREM', KEYS[1], jobs[1])  -- its outbox expired or went: nothing left to send
end
return false
"""

# KEYS: outbox, due, log. ARGV: job id, event id, result, retry in s, event JSON, log entry, log cap, ttl.
_SETTLE = """
local head = redis.call('LINDEX', KEYS[1], 0)
if not head or cjson.decode(head)['id'] ~= ARGV[2] then return 0 end
redis.call('RPUSH', KEYS[3], ARGV[6])
redis.call('LTRIM', KEYS[3], -tonumber(ARGV[7]), -1)
redis.call('EXPIRE', KEYS[3], ARGV[8])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
if ARGV[3] == 'retry' then
  redis.call('LSET', KEYS[1], 0, ARGV[5])
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[1])
  return 1
end
if ARGV[3] == 'gone' then
  redis.call('DEL', KEYS[1])
else
  redis.call('LPOP', KEYS[1])
end
if redis.call('LLEN', KEYS[1]) > 0 then
  redis.call('ZADD', KEYS[2], now, ARGV[1])
else
  redis.call('ZREM', KEYS[2], ARGV[1])
end
return 1
"""


class JobEvents:
    """The events one delivery of a job writes into the outbox (in its child): never raises, since
    a webhook must not fail the job (a Redis too sick to take the event fails the job's own writes
    anyway, and the job's next delivery writes the events it finds missing)."""

    def __init__(self, client: Any, job_id: str, family: str, webhook: Webhook, *, base_url: str = "",
                 progress_s: float = 30.0) -> None:  # fmt: skip
        self.outbox, self.client, self.job_id, self.family = Outbox(client), client, job_id, family
        self.webhook, self.base_url, self.progress_s = webhook, base_url, progress_s
        self._progress_at = -1e9

    def wants(self, event: str) -> bool:
        return event in self.webhook.events

    def _put(self, kind: str, suffix: str, data: dict[str, Any], *, final: bool = False,
             coalesce: bool = False) -> None:  # fmt: skip
        links = data.pop("links", None) or job_links(self.base_url, self.job_id)
        body = {"type": f"job.{kind}", "timestamp": _iso(time.time()),
                "data": {"id": self.job_id, "family": self.family, **data, "links": links}}  # fmt: skip
        event = {"id": f"msg_{self.job_id}_{suffix}", "type": body["type"], "url": self.webhook.url,
                 "body": json.dumps(body, separators=(",", ":")), "final": final, "tries": 0}  # fmt: skip
        try:
            self.outbox.put(self.job_id, event, coalesce=coalesce)
        except Exception:  # noqa: BLE001 - see the class
            log.warning("job %s: could not put its %s webhook event in the outbox", self.job_id, kind, exc_info=True)

    def attempt_began(self, rung: str) -> None:
        """Before an attempt runs: the attempts that ended before it (a killed child's, settled
        by this run), and the job's start: put once, by its first attempt (a later one's is the
        same event id, which the outbox has seen)."""
        if self.wants("attempt"):
            self.attempts_ended()
        if self.wants("start"):
            self._put("start", "start", {"state": "STARTED", "rung": rung})

    def attempts_ended(self) -> list[dict[str, Any]]:
        """Write an ``attempt`` event for every ended attempt of the history not yet written; the
        history as read (or [] if unreadable)."""
        try:
            history = [in_current_names(json.loads(r)) for r in self.client.lrange(keys.history(self.job_id), 0, -1)]
        except Exception:  # noqa: BLE001 - see the class
            log.warning("job %s: could not read its history for webhooks", self.job_id, exc_info=True)
            return []
        if self.wants("attempt"):
            for i, a in enumerate(history):
                if a.get("outcome"):
                    self._put("attempt", f"attempt_{i}", {
                        "state": "STARTED", "attempt": i, "rung": a.get("rung"), "rung_index": a.get("rung_index"),
                        "outcome": a.get("outcome"), "reason": a.get("reason", ""),
                    })  # fmt: skip
        return history

    def progress(self, progress: dict[str, Any]) -> None:
        now = time.monotonic()
        if not self.wants("progress") or now - self._progress_at < self.progress_s:
            return
        self._progress_at = now
        # Each progress event its own id (the outbox keeps every id it has seen): two reports in
        # one millisecond had the same one, and the newer was dropped as seen.
        self._put("progress", f"progress_{time.time_ns()}", {"state": "STARTED", "progress": progress},
                  coalesce=True)  # fmt: skip

    def completed(self, state: str, envelope: Mapping[str, Any] | None = None, failure: str = "") -> None:
        """The job ended (after its state was stored, so a receiver that reads the job sees it)."""
        history = self.attempts_ended() if (self.wants("attempt") or envelope is None) else []
        if not self.wants("completed"):
            return
        if envelope is not None:
            rung = rung_of(envelope)[0]
            names = [a["name"] for a in envelope.get("artifacts", []) if isinstance(a, Mapping) and "name" in a]
            attempts = len(envelope.get("attempts", []))
        else:
            rung = next((a.get("rung") for a in reversed(history) if a.get("outcome")), None)
            names, attempts = [], len(history)
        data: dict[str, Any] = {"state": state, "rung": rung, "attempts": attempts,
                                "links": job_links(self.base_url, self.job_id, names)}  # fmt: skip
        if failure:
            data["failure"] = failure[:500]
        self._put("completed", "completed", data, final=True)


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"
