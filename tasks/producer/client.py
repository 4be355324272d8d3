"""The producer API: submit a job, get a handle, follow it, fetch what it made. No torch, no model imports.

    from mediafarm import submit
    job = submit("vad", media="/media/cam/2026-11-29.mp4")    # InvalidRequest at once if malformed
    envelope = job.wait(timeout=600, on_progress=print)      # raises JobRejected / LadderExhausted / ...
    envelope["output"]["spans"], envelope["rung"], envelope["attempts"], envelope["artifacts"]

This is the one way to submit; following a job is its handle's (``tasks.producer.handles``). Task names
are the wire contract (``FamilySpec.task_name``), for producers that send with a plain Celery client.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from celery import chord, group
from redis.exceptions import RedisError

from mediafarm.config.pools import Pool, get_pools
from mediafarm.config.priorities import DEFAULT_PRIORITY, checked_priority, wire_priority
from mediafarm.config.settings import get_settings
from mediafarm.tasks import registry
from mediafarm.tasks.app import app
from mediafarm.tasks.producer import admission, routing, wake, webhooks
from mediafarm.tasks.producer.handles import JobHandle, PipelineHandle
from mediafarm.tasks.wire import capability, keys, trace
from mediafarm.tasks.wire.artifacts import ArtifactStore, UnsafeArtifactName, folder_name
from mediafarm.tasks.wire.errors import InvalidRequest, Overloaded
from mediafarm.tasks.wire.family import FamilySpec
from mediafarm.tasks.wire.languages import normalize_language
from mediafarm.tasks.wire.plan import Part, Plan

__all__ = ["JobHandle", "PipelineHandle", "farm_redis", "handle", "known_families", "send_plan", "submit"]

log = logging.getLogger("mediafarm.client")


def farm_redis() -> Any:
    """The farm's Redis (the result backend's client), for what a producer keeps beside its jobs:
    the gateway's room leases and pushed audio, the workers' capability records it lists, its
    readiness check. A job's own keys are read through its handle (``handles.JobHandle``)."""
    return app.backend.client


def known_families() -> Mapping[str, FamilySpec]:
    """The job families this farm knows, by name."""
    return registry.load()


def submit(
    family: str,
    *,
    queue: str | None = None,
    job_id: str | None = None,
    priority: int = DEFAULT_PRIORITY,
    tenant: str | None = None,
    webhook: str | None = None,
    webhook_events: Iterable[str] | str | None = None,
    **fields: Any,
) -> JobHandle:
    """Send a job of ``family`` with its request fields as keywords (JSON-safe).

    The fields are checked against the family's request model before anything is sent:
    ``ValueError`` for an unknown family, ``InvalidRequest`` (a ValueError) naming each field
    that does not fit. ``queue`` overrides the family queue, e.g. ``gpu0.vad`` for GPU affinity.

    ``job_id`` is an idempotency key: the first submit with it sends the job, every later one
    (racing or not) returns that job's handle and sends nothing, so the job never runs twice for
    it. Reusing a key for another family or other fields raises ValueError. Keys are remembered
    as long as results (``result_expires``). Without ``job_id`` every job gets a fresh UUID.

    ``priority``: 0..9, higher runs first, default 4 (``config.priorities``: how each broker
    honours it). ``tenant``: who submits (the gateway passes its caller), for the per-tenant limit.

    ``webhook``: an http(s) URL the farm posts the job's events to, signed (``tasks.producer.webhooks``;
    docs/operating.md, Webhooks); ``webhook_events``: which, of ``start``, ``progress``,
    ``attempt``, ``completed`` (default: ``completed``). InvalidRequest for a URL that is not
    http(s) with a host, or names a loopback or private address FARM_WEBHOOK_ALLOW does not list.
    A pipeline's webhook is its fan-in job's: its events are the pipeline's.

    Admission control (``tasks.producer.admission``) may refuse the job before anything is sent: it raises
    ``Overloaded`` (with ``retry_after``) when the family's queues hold their limit, the tenant has
    its limit waiting, or a pool that would run it is short of memory. A job id already accepted
    is never refused: the re-submit returns its handle as above.

    A family whose request has ``as_pipeline`` (``dialogue``) is sent as its plan: several jobs
    and a fan-in job (:func:`send_plan`, ``tasks.wire.plan``); the handle returned is a ``PipelineHandle``.
    """
    steps = trace.Trace()  # the submit's side of the job's trace, kept on its handle
    spec = registry.get(family)
    priority = checked_priority(priority)
    hook = webhooks.checked(webhook, webhook_events, get_settings().webhook_allow)
    request = spec.parse_request(fields)
    kwargs = request.model_dump(mode="json", exclude_unset=True, by_alias=True)
    as_pipeline = getattr(request, "as_pipeline", None)
    client = app.backend.client
    steps.mark("validated")
    # A queue the producer names is kept; else the pool that runs the job's best rung (tasks.producer.routing).
    route, wants = _route(spec, kwargs, _language(spec, request)) if queue is None and not callable(as_pipeline) \
        else (None, [])  # fmt: skip
    if route is not None:
        queue = route.queue
    steps.mark("routed")
    wrote_key = False
    if job_id is not None:
        try:
            ArtifactStore(get_settings().storage_dir, job_id)
        except UnsafeArtifactName as exc:
            raise ValueError(str(exc)) from None
        fingerprint = json.dumps({"family": spec.name, "fields": kwargs, **_hooked(hook)}, sort_keys=True)
        key = keys.submitted(job_id)
        first = client.get(key)
        if first is None:
            plan = as_pipeline(job_id) if callable(as_pipeline) else None
            # Refused before the key is written: a refused job leaves nothing behind.
            try:
                admitted = _admit(spec, queue, job_id, tenant, plan, kwargs)
            except Overloaded:
                # A racing submit of the same id may have been accepted meanwhile (taking the last
                # place): an accepted id is never refused, its re-submit gets the handle below.
                first = client.get(key)
                if first is None:
                    raise
        if first is None:
            wrote_key = bool(client.set(key, fingerprint, nx=True, ex=int(app.conf.result_expires)))
            if not wrote_key:  # a racing submit of the same id took it first
                # Its queue places only: the tenant's place is held under the id, the job's own.
                admission.Admitted(queue_sets=admitted.queue_sets).release(client)
                first = client.get(key)
        if first is not None:
            if first.decode() != fingerprint:
                raise ValueError(f"job id {job_id!r} was already submitted with another family or other fields")
            if callable(as_pipeline):
                return PipelineHandle(id=job_id, family=spec.name)
            return JobHandle(id=job_id, family=spec.name)
    else:
        job_id = str(uuid.uuid4()) if callable(as_pipeline) or tenant else None
        plan = as_pipeline(job_id) if callable(as_pipeline) else None
        admitted = _admit(spec, queue, job_id or "", tenant, plan, kwargs)
    steps.mark("admitted")  # with a job id: its idempotency key written too
    try:
        if plan is not None:
            # A pipeline family (the dialogue): its parts and fan-in job go as one chord, the
            # handle is the fan-in job's. Admitted above, with its parts.
            return _send_plan(plan, queue, priority, hook)
        # Explicit None: the worker's limits rule. Otherwise Celery stamps the limits of a task
        # registered in this process onto the message, and those override the worker's.
        async_result = app.send_task(
            spec.task_name, kwargs=kwargs, task_id=job_id, queue=queue or spec.queue,
            soft_time_limit=None, time_limit=None, priority=_wire(priority), headers=_headers(hook, route),
        )  # fmt: skip
        steps.mark("sent")
    except BaseException:
        try:
            if wrote_key:  # nothing was sent: the key must not stand for a job that never was
                client.delete(keys.submitted(job_id))
        finally:
            admitted.release(client)
        raise
    _want(wants, async_result.id)
    return JobHandle(id=async_result.id, family=spec.name, trace=steps)


def _hooked(hook: webhooks.Webhook | None) -> dict[str, Any]:
    """The webhook in a submit's fingerprint: none adds nothing (fingerprints from before stay valid)."""
    return {} if hook is None else {"webhook": hook.to_header()}


def _headers(hook: webhooks.Webhook | None, route: routing.Route | None = None) -> dict[str, Any] | None:
    """The job message's custom headers: its webhook (``tasks.producer.webhooks.HEADER``) and why it goes
    to its queue (``tasks.producer.routing.ROUTE_HEADER``), if any."""
    headers = {}
    if hook is not None:
        headers[webhooks.HEADER] = hook.to_header()
    if route is not None:
        headers[routing.ROUTE_HEADER] = route.reason
    return headers or None


def _language(spec: FamilySpec, request: Any) -> str | None:
    """The job's language (given, or told by its text), normalised; None where not known."""
    language = spec.language(request) if spec.language is not None else None
    return normalize_language(language) if language else None


def _route(
    spec: FamilySpec, fields: Mapping[str, Any], language: str | None
) -> tuple[routing.Route | None, list[wake.Want]]:
    """Where a job of ``spec`` with ``fields`` in ``language`` goes by the live capability records
    (``tasks.producer.routing.choose``: a pool whose worker's rung handles the language; None: its family's
    queue, routing off or no live pool advertising a rung of it), and the pools with no live worker
    that would start it on a better rung (``tasks.producer.wake``). A broker away is no reason to fail the
    submit here: the send below says so."""
    settings = get_settings()
    if not settings.routing:
        return None, []
    ladder_name = fields.get(spec.ladder_field) if spec.ladder_field else None
    try:
        ladder = registry.ladder_for(spec, ladder_name if isinstance(ladder_name, str) else None)
    except (KeyError, ValueError):
        return None, []  # a ladder the request names that does not exist: the worker rejects it, naming it
    named = registry.recorded_ladder(spec, ladder)
    rungs = [r.name for r in ladder.rungs]
    try:
        live = _cached("live", capability.live)
        route = routing.choose(family=spec.name, family_queue=spec.queue, ladder=named, rungs=rungs, records=live,
                               depths=lambda queues: admission.queue_depths(queues, app),
                               spill_depth=settings.route_spill_depth, language=language)  # fmt: skip
        if settings.wake_window <= 0 or not settings.wake_pools:
            return route, []
        dormant = wake.dormant_records(settings.wake_pools, live, _cached("known", capability.known_pools),
                                       get_pools(), _declared_record)  # fmt: skip
    except (*admission.away_errors(), RedisError) as exc:
        # Routing is an optimisation of where a job waits: a Redis that refuses a read here (a
        # failover's read-only replica, no script) leaves the job to its family's queue.
        log.warning("%s job: not routed (%s: %s); sent to its family's queue", spec.name, type(exc).__name__, exc)
        return None, []
    wants = wake.wanting(family=spec.name, family_queue=spec.queue, ladder=named, rungs=rungs, dormant=dormant,
                         chosen=rungs.index(route.rung) if route is not None else None, language=language)  # fmt: skip
    if route is not None and wants:
        route = dataclasses.replace(route, reason=route.reason + wake.note(wants))
    return route, wants


@functools.lru_cache(maxsize=64)
def _declared_record(pool: Pool) -> capability.WorkerCapability:
    """A declared pool never seen live, judged by its declaration: once per process and pool."""
    return wake.declared_record(pool, registry.load(), registry.ladders_of, registry.default_queues())


def _want(wants: list[wake.Want], job_id: str) -> None:
    """Count the job sent as wanting the pools of ``wants`` (``tasks.producer.wake``). The job is sent: a
    Redis away here costs only its part in waking a pool, logged, never the submit."""
    if not wants:
        return
    try:
        wake.want(app.backend.client, [w.pool for w in wants], job_id, get_settings().wake_window)
    except Exception as exc:  # noqa: BLE001 - the job is sent: nothing here may fail its submit
        log.warning("job %s: not counted as wanting pool(s) %s: %s: %s", job_id, ", ".join(w.pool for w in wants),
                    type(exc).__name__, exc)  # fmt: skip


def _cached(name: str, read: Callable[[Any], Any]) -> Any:
    """``read(the backend's client)``, read at most once a second per process and ``name`` (a
    gateway submitting a burst reads the capability records once)."""
    now = time.monotonic()
    cache = _records_cache.get(os.getpid())
    if cache is None:  # none yet, or a forked child's copy of its parent's: not its own
        _records_cache.clear()
        cache = _records_cache[os.getpid()] = {}
    cached = cache.get(name)
    if cached is None or now - cached[0] >= RECORDS_TTL_S:
        cached = cache[name] = (now, read(app.backend.client))
    return cached[1]


# How long a producer reuses the capability records it read; a worker's record lapses after
# capability.STALE_S, so a second adds little to what routing may be behind by.
RECORDS_TTL_S = 1.0
_records_cache: dict[int, dict[str, tuple[float, Any]]] = {}


def _wire(priority: int) -> int:
    return wire_priority(priority, get_settings().broker_is_rabbitmq)


def _admit(
    spec: FamilySpec, queue: str | None, job_id: str, tenant: str | None, plan: Plan | None, fields: dict[str, Any]
) -> Any:
    """Admission control for one submit: a pipeline family's every job (its plan), else the one
    (with the ladder its fields name: a ladder may step down under pressure instead)."""
    if plan is not None:
        jobs = [_job(registry.get(p.family), queue, p.fields) for p in (*plan.parts, plan.then)]
    else:
        jobs = [_job(spec, queue, fields)]
    return admission.admit(jobs, job_id=job_id, tenant=tenant, app=app)


def _job(spec: FamilySpec, queue: str | None, fields: Mapping[str, Any]) -> tuple[FamilySpec, str | None, Any]:
    """(family, queue, the ladder the fields name) as admission control takes a job."""
    ladder = fields.get(spec.ladder_field) if spec.ladder_field else None
    return spec, queue, ladder if isinstance(ladder, str) else None


def handle(job_id: str, family: str = "") -> JobHandle:
    """A handle for a job submitted elsewhere (by id)."""
    return JobHandle(id=job_id, family=family)


def _checked(part: Part) -> dict[str, Any]:
    """The part's fields as its family's request (InvalidRequest naming the part if they do not fit)."""
    try:
        folder_name(part.job_id)
        request = registry.get(part.family).parse_request(part.fields)
    except (InvalidRequest, UnsafeArtifactName, ValueError) as exc:
        raise InvalidRequest(f"{part.label or part.job_id}: {exc}") from None
    return request.model_dump(mode="json", exclude_unset=True, by_alias=True)


def send_plan(
    plan: Plan, queue: str | None = None, *, priority: int = DEFAULT_PRIORITY, tenant: str | None = None,
    webhook: str | None = None, webhook_events: Iterable[str] | str | None = None,
) -> PipelineHandle:
    """Check every job of ``plan``, store the plan, send it as one chord; the handle of the fan-in job.

    ``queue`` sends every job of the plan there (a worker consuming it runs them all); by default
    each goes to its family's queue. Nothing is sent if a job's fields do not fit its family, or if
    admission control refuses one of its jobs (``Overloaded``, as :func:`submit`). ``priority``
    and ``tenant``: as for :func:`submit`, for every job of the plan; ``webhook`` and
    ``webhook_events`` as for :func:`submit`, the fan-in job's (the pipeline's end is its end).
    What a plan is, and why its chord survives the farm's kills: ``tasks.wire.plan``.
    """
    priority = checked_priority(priority)
    hook = webhooks.checked(webhook, webhook_events, get_settings().webhook_allow)
    jobs = [_job(registry.get(p.family), queue, p.fields) for p in (*plan.parts, plan.then)]
    admitted = admission.admit(jobs, job_id=plan.then.job_id, tenant=tenant, app=app)
    try:
        return _send_plan(plan, queue, priority, hook)
    except BaseException:
        admitted.release(app.backend.client)
        raise


def _send_plan(plan: Plan, queue: str | None, priority: int, hook: webhooks.Webhook | None = None) -> PipelineHandle:
    if not plan.parts:
        raise InvalidRequest(f"pipeline {plan.then.job_id}: a plan needs at least one part")
    ids = [p.job_id for p in (*plan.parts, plan.then)]
    if len(set(ids)) != len(ids):
        raise InvalidRequest(f"pipeline {plan.then.job_id}: two jobs of the plan share an id")
    checked = [(_checked(p), p) for p in (*plan.parts, plan.then)]

    def signature(fields: dict[str, Any], part: Part, **options: Any) -> Any:
        spec = registry.get(part.family)
        # Explicit None limits: the worker's rule (see submit).
        return app.signature(spec.task_name, kwargs=fields, task_id=part.job_id, queue=queue or spec.queue,
                             soft_time_limit=None, time_limit=None, priority=_wire(priority), **options)  # fmt: skip

    *header, (then_fields, then) = checked
    ttl = int(app.conf.result_expires)
    app.backend.client.set(keys.pipeline_plan(then.job_id), json.dumps(plan.to_json()), ex=ttl)
    body = signature(then_fields, then, immutable=True, **({"headers": _headers(hook)} if hook else {}))
    parts = group([signature(f, p) for f, p in header], app=app)
    chord(parts, body, app=app).apply_async(task_id=then.job_id)
    return PipelineHandle(id=then.job_id, family=then.family)
