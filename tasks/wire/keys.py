"""Names of the Redis keys the farm writes beside Celery's own, in the result backend's database.

One prefix for all of them, so an operator can find (and a `SCAN mediafarm:*` can count) what the
farm keeps. Each key lives as long as the job's result (``result_expires``) unless said otherwise (the
breakers' keys are a pool's, not a job's).
Only the farm's own keys are named here; a family names its own with :func:`family_key`, under the
same prefix and in a space no farm key uses.
"""

from __future__ import annotations

import re

PREFIX = "mediafarm"
# The first part after the prefix of every key named here: a family's space may not be one of them.
FARM_SPACES = frozenset(
    {"attempts", "kill", "progress", "partials", "submitted", "cancel", "pipeline", "breaker", "breaker-failures",
     "rung-failures", "first-output", "metered", "gpu-children",
     "refused", "pressure", "heartbeat", "tenant", "room-lease", "webhook", "webhook-seen", "webhook-due",
     "webhook-log", "capability", "load", "wanted", "unsent",
     "sent", "sent-at", "sent-suspect", "sent-sweep", "bell"}
)
_SPACE = re.compile(r"^[a-z][a-z0-9_-]*$")


def history(job_id: str) -> str:
    """Attempt history of one job: a list of JSON attempts, oldest first (``records.Attempt``)."""
    return f"{PREFIX}:attempts:{job_id}"


def kill(job_id: str) -> str:
    """Why the watchdog killed the child running a job (``records.KillRecord``), written before the SIGKILL."""
    return f"{PREFIX}:kill:{job_id}"


def progress(job_id: str) -> str:
    """The running attempt's latest progress (``records.Progress``); overwritten, throttled."""
    return f"{PREFIX}:progress:{job_id}"


def partials(job_id: str) -> str:
    """What a generator engine has yielded so far in the running attempt: a list of JSON items."""
    return f"{PREFIX}:partials:{job_id}"


def bell(job_id: str) -> str:
    """The pub/sub channel a job's worker publishes on whenever a follower would see it change, the
    message naming what changed (:data:`BELL_KINDS`; ``tasks.producer.bells``). Not a key: nothing
    is stored under it."""
    return f"{PREFIX}:bell:{job_id}"


# What a message on a job's bell says changed: an attempt recorded or ended (``tasks.wire.history``'s
# scripts), a partial output published, progress reported (``JobChannel``): the kinds a follower
# chooses among. The job's stored state (``tasks.result_backend``'s scripts) rings every bell.
BELL_ATTEMPT, BELL_PARTIAL, BELL_PROGRESS, BELL_STATE = "attempt", "partial", "progress", "state"
BELL_KINDS = (BELL_ATTEMPT, BELL_PARTIAL, BELL_PROGRESS)


def submitted(job_id: str) -> str:
    """A producer-chosen job id already used: who submitted what (``client.submit(job_id=...)``)."""
    return f"{PREFIX}:submitted:{job_id}"


def cancel(job_id: str) -> str:
    """Present when a producer asked for the job to stop; engines poll it (``EngineContext.cancelled``)."""
    return f"{PREFIX}:cancel:{job_id}"


def room_lease(owner: str, room: str) -> str:
    """The connection that holds a gateway's dialogue room (``gateway.ws.rooms``): a random id, set as
    it connects. A connection that drops cancels its unfinished lines after a grace period only if
    no newer connection to the room has taken this key. Kept a day after the last connection."""
    return f"{PREFIX}:room-lease:{owner}:{room}"


def pipeline_plan(job_id: str) -> str:
    """The plan of the pipeline whose fan-in job is ``job_id`` (``plan.Plan`` as JSON)."""
    return f"{PREFIX}:pipeline:{job_id}"


def breakers(pool: str) -> str:
    """The rung circuit breakers of one pool that are not closed (``tasks.runtime.breaker``): a hash, field
    ``<ladder>/<rung>``, value a JSON object. A closed breaker has no field. Fields:

    - ``state``: ``open`` (new jobs start past the rung) or ``half_open`` (cool-down over: one
      job, the probe, runs the rung; the others still start past it);
    - ``since``: Unix time it opened (or reopened, after a failed probe);
    - ``until``: Unix time its cool-down ends;
    - ``failures``, ``window_s``: the resource failures within the window that opened it;
    - ``opened``: how many times it opened since it was last closed (1, then +1 per failed probe);
    - ``probe``, ``probe_until``: the probing job's id and when its claim lapses (half-open only).

    Kept until the breaker closes (no TTL: an open breaker must outlive any quiet spell).
    ``SCAN mediafarm:breaker:*`` lists the pools that have one open.
    """
    return f"{PREFIX}:breaker:{pool}"


def breaker_failures(pool: str, ladder: str, rung: str) -> str:
    """Recent resource failures of one rung on one pool, counted by its breaker: a sorted set,
    member the failed attempt (``<job id>:<start>``), score the Unix time of the failure. Expires
    one window after its newest failure; emptied when the breaker opens."""
    return f"{PREFIX}:breaker-failures:{pool}:{ladder}:{rung}"


def rung_failures(pool: str) -> str:
    """Failed attempts of one pool's rungs, judged by cause (``tasks.runtime.attribution``): a hash, field
    ``<ladder>/<rung>/<cause>/<1 if it counted against the breaker, else 0>``, value a count.
    Expires a day after the newest failure; shown by ``farm families``."""
    return f"{PREFIX}:rung-failures:{pool}"


def first_output(job_id: str) -> str:
    """Unix time of the running attempt's first partial output (set once per attempt, cleared with
    its partials): the workers' ``mediafarm_first_output_seconds``."""
    return f"{PREFIX}:first-output:{job_id}"


def metered(job_id: str) -> str:
    """Present once a worker counted the ended job into its metrics, so that no other counts it again."""
    return f"{PREFIX}:metered:{job_id}"


def gpu_children(worker: str) -> str:
    """The CUDA allocator figures of one worker's GPU children: a hash, field the child's pid, value
    JSON (device, reserved bytes, fragmentation, action taken), written after each job by the child
    and served by the worker's main process (``workers.gpu_hygiene``). Expires an hour after its
    last write; a child's field goes when the main process sees the child gone.
    """
    return f"{PREFIX}:gpu-children:{worker}"


def refusals(family: str) -> str:
    """Jobs of one family that admission control refused (``tasks.producer.admission``): a hash, field the
    reason (``depth``, ``tenant``, ``pressure``), value a count that only grows. No TTL: a counter
    for the metrics (``mediafarm_admission_refusals_total``), one small hash per family."""
    return f"{PREFIX}:refused:{family}"


def pressure(pool: str) -> str:
    """The memory readings of one pool's workers (``tasks.producer.admission.Reading``): a hash, field the
    worker's node name, value JSON. Written every second by each worker (``workers.pressure``);
    expires 5 s after the pool's last write, and a reader ignores a field older than that."""
    return f"{PREFIX}:pressure:{pool}"


def heartbeats() -> str:
    """When each Redis worker last beat (``workers.handback``): a hash, field the worker's node name,
    value the Redis server's time of its last beat (so hosts' clocks do not matter). A worker
    removes its field as it stops; a dead worker's field stays until an hour after its last beat."""
    return f"{PREFIX}:heartbeat"


def capabilities() -> str:
    """What each live worker can run (``tasks.wire.capability``): a hash, field the worker's node name,
    value JSON (its pool, the queues it consumes and leaves out, the rungs of each family it can run
    and why not the others, the Redis server's time of the write). Rewritten by each worker every
    few seconds (``workers.capability``) and removed as it stops; a reader ignores a field older
    than ``capability.STALE_S``, and a field an hour old is dropped. The hash expires an hour after
    its last write."""
    return f"{PREFIX}:capability"


def pool_capabilities() -> str:
    """What each pool's workers could run when they were last live (``tasks.wire.capability.known_pools``):
    a hash, field the worker's node name, value its last capability record. Rewritten with the
    workers' records but kept when they stop, so that a pool at zero replicas is still known by
    what it runs (``tasks.producer.wake``); a field a week old is dropped."""
    return f"{PREFIX}:capability:pools"


def wanted(pool: str) -> str:
    """The jobs that would have started on a better rung on ``pool`` had it had a live worker
    (``tasks.producer.wake``): a sorted set, member the job id, score the Redis server's time of its submit;
    pruned of members older than ``FARM_WAKE_WINDOW`` as it is written, and expires that long after
    its last job was added."""
    return f"{PREFIX}:wanted:{pool}"


def worker_loads() -> str:
    """What each live worker holds (``tasks.wire.worker_load``): a hash, field the worker's node name,
    value JSON (its pool, its slots, the jobs it reserved and has not started, the jobs it runs,
    whether it drains, the Redis server's time of the write). Rewritten by each worker every second
    (``workers.load``) and removed as it stops; a reader ignores a field older than
    ``worker_load.STALE_S``, and a field an hour old is dropped. The hash expires an hour after its
    last write. The pools' scaling signal (``tasks.producer.scaling``) sums it by pool."""
    return f"{PREFIX}:load"


def unsent_retries(job_id: str) -> str:
    """How often a job's message went back because its worker could not send its retry
    (``tasks.runtime.base.FarmTask.send_retry``): a counter, expiring a day after its last count."""
    return f"{PREFIX}:unsent:{job_id}"


def sent_messages() -> str:
    """The farm tasks' messages sent and not yet ended (``tasks.sent_ledger``): a hash, field the job
    id, value the message as published (JSON). Written as each message is published on Redis,
    removed in the step that stores the job's end; an entry older than ``result_expires`` is dropped."""
    return f"{PREFIX}:sent"


def sent_times() -> str:
    """When each message of :func:`sent_messages` was published: a sorted set, score the time."""
    return f"{PREFIX}:sent-at"


def sent_suspects() -> str:
    """Jobs of :func:`sent_messages` found in no queue, not unacked and not ended at one look of
    the lost-message sweep (``tasks.runtime.lost_messages``): a sorted set, score when first found so."""
    return f"{PREFIX}:sent-suspect"


def sent_sweep_lock() -> str:
    """Held by the worker making the lost-message sweep's look of this period (its node name);
    lapses before the next period, so one worker of the farm looks each period."""
    return f"{PREFIX}:sent-sweep"


def tenant_jobs(family: str, tenant: str) -> str:
    """Jobs of one family a tenant (a gateway token's owner) submitted that have not started: a
    sorted set, member the job id, score its submit time; pruned of started and ended jobs as
    admission control reads it, and expires a day after its last job was added."""
    return f"{PREFIX}:tenant:{family}:{tenant}"


def webhook_outbox(job_id: str) -> str:
    """A job's webhook events not yet delivered (``tasks.producer.webhooks.Outbox``): a list of JSON
    events, oldest first. Expires three days after its last event was added (the retry schedule
    fits), not with the result."""
    return f"{PREFIX}:webhook:{job_id}"


def webhook_seen(job_id: str) -> str:
    """The ids of every webhook event ever put in a job's outbox (a set), so a redelivered job does
    not post an event twice. Expires with the outbox."""
    return f"{PREFIX}:webhook-seen:{job_id}"


def webhook_due() -> str:
    """The jobs with a webhook event to deliver: a sorted set, member the job id, score the Redis
    server's time its oldest event may be tried next (a dispatcher's lease moves it past the try).
    No TTL: a job leaves it when its outbox is empty."""
    return f"{PREFIX}:webhook-due"


def webhook_log(job_id: str) -> str:
    """A job's webhook delivery log: a list of JSON tries (event, try, status, latency, result),
    oldest first, the newest 500 kept. Expires with the outbox."""
    return f"{PREFIX}:webhook-log:{job_id}"


def every_key() -> str:
    """A ``SCAN`` pattern matching every key named here (``farm gc`` checks a backend holds some)."""
    return f"{PREFIX}:*"


def family_key(space: str, *parts: str) -> str:
    """A key of a family's own, ``mediafarm:<space>:<part>:...``, beside the farm's keys.

    ``space`` is the family's name by convention (``family_key("loudness", job_id)``); the TTS
    speaker hash is ``family_key("speakers")``, the name it had before families named their keys.
    A family sets its keys' expiry itself (the farm's keys above expire with the job's result).

    Raises:
        ValueError: ``space`` is not a lowercase name, is one of the farm's own (:data:`FARM_SPACES`),
            or a part is empty.
    """
    if not _SPACE.match(space):
        raise ValueError(f"key space {space!r} must match {_SPACE.pattern}")
    if space in FARM_SPACES:
        raise ValueError(f"key space {space!r} is the farm's own ({sorted(FARM_SPACES)}); name it after the family")
    if any(not part for part in parts):
        raise ValueError(f"key {space!r}: every part must be a non-empty string, got {parts!r}")
    return ":".join((PREFIX, space, *parts))
