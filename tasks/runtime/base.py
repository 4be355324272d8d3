"""FarmTask, the Celery task every family runs as, and :func:`make_task`, which builds one per family.

A family declares no task of its own: the registry hands its spec to :func:`make_task`, and the
task it gets validates the job's fields against the spec's request model, picks the rung
(``tasks.runtime.downgrade``), gives the engine its :class:`~mediafarm.tasks.runtime.context.EngineContext`,
drains a generator engine inside the same exception mapping, and turns a ``RetryRequest`` into
Celery's retry under the same id. A ``MemoryError`` never reaches Celery (which would shut the
whole worker down), and what does reach it is always a class the client has (``wire_exception``).
"""

from __future__ import annotations

import dataclasses
import inspect
import shutil
from collections.abc import Generator, Mapping
from functools import partial
from typing import Any, NoReturn

from celery import Celery, Task
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded
from celery.utils.log import get_task_logger
from kombu.exceptions import OperationalError
from pydantic import BaseModel
from redis.exceptions import RedisError

from mediafarm.config.ladder_policy import ladder_policy
from mediafarm.config.ladders import Ladder, Rung
from mediafarm.config.pools import POOL_QUEUE_SEP, pool_queue
from mediafarm.config.settings import FarmSettings, get_settings
from mediafarm.config.storage_url import S3Place
from mediafarm.tasks import registry
from mediafarm.tasks.producer import routing
from mediafarm.tasks.producer.admission import pool_under_pressure, queue_depths
from mediafarm.tasks.producer.webhooks import HEADER as WEBHOOK_HEADER
from mediafarm.tasks.producer.webhooks import JobEvents, Webhook
from mediafarm.tasks.runtime import liveness, reroute, soft_time_limit
from mediafarm.tasks.runtime.breaker import pool_breakers
from mediafarm.tasks.runtime.context import EngineContext, JobChannel
from mediafarm.tasks.runtime.downgrade import LadderRun, RetryRequest, run_ladder
from mediafarm.tasks.runtime.media_fetch import MediaFetcher
from mediafarm.tasks.runtime.rung_guard import RungGuard
from mediafarm.tasks.runtime.rung_policies import Availability, Breaker, Language, RungPolicy
from mediafarm.tasks.wire import capability, keys, object_store, trace
from mediafarm.tasks.wire.artifacts import ArtifactStore
from mediafarm.tasks.wire.checkpoint import (
    Checkpoint,
    CheckpointWriter,
    RemoteCheckpoint,
    UnusableCheckpoint,
    store_for,
)
from mediafarm.tasks.wire.errors import (
    Cancelled,
    EngineError,
    FarmError,
    InvalidRequest,
    NoRungLeft,
    PermanentFailure,
    ResourceFailure,
    StaleAttempt,
    TransientFailure,
    wire_exception,
)
from mediafarm.tasks.wire.family import FamilySpec
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.languages import LanguageCheck
from mediafarm.tasks.wire.records import ArtifactInfo, Attempt, Envelope, Outcome
from mediafarm.tasks.wire.upload_objects import uploads_place

logger = get_task_logger("mediafarm.task")

# A retry sent on a Redis error carries this header: Celery retry count → the error, for every such
# delivery of the job so far. That delivery's attempt may have no outcome written, and without the
# header the next delivery would take the moved-on retry count for a lost child (next rung).
UNWRITTEN_HEADER = "farm_unwritten"


# How often a job's message goes back for a retry its worker could not send (``send_retry``).
UNSENT_HANDBACKS = 3

# Stored ends after which a delivery of the job runs nothing (a stored SUCCESS is returned instead).
ENDED_BADLY = frozenset({"FAILURE", "REVOKED"})

class FarmTask(Task):
    """Base of the farm's tasks. Class attribute ``spec``: the family it runs."""

    spec: FamilySpec
    # Celery's per-task default is 180 s: a downgrade should run at once. FARM_RETRY_DELAY.
    default_retry_delay = 0
    # Set per family in ``make_task``; bounded by the ladder in any case.
    max_retries = 8
    # The attempt record written as the job starts replaces Celery's STARTED write (one Redis round
    # trip a job saved): JobHandle.state() reports STARTED from it, and the worker still sends
    # task-started events for Flower.
    track_started = False
    # What Celery logs and sends Flower (task-succeeded) of a job's result: a repr of its envelope,
    # cut at this many characters. At Celery's 1,024 the repr (a safe one, a token at a time) cost
    # a no-op job's child 0.16 ms and a TTS job's 0.31 ms; at 256, 0.08 ms, and it still shows the
    # job id, family, rung and variant (issue #34). The whole envelope is the stored result.
    resultrepr_maxsize = 256
    # Enforced by the worker's watchdog with a SIGKILL, so an overrun moves the job down a rung
    # (``workers.guards``). Celery's own ``time_limit`` would fail the job instead.
    farm_hard_limit: float | None = None
    # A child silent this long (no sign of life, ``tasks.runtime.liveness``) is killed by the watchdog:
    # the attempt is ``stalled``. The family's ``TimeLimits.stall``.
    farm_stall_timeout: float | None = None
    # Celery logs these as "raised expected" at INFO, without a traceback: a rejection is the
    # input's fault, a cancel the producer's will and an exhausted ladder the pool's lack of
    # resources (its history says which), each logged in one line of ours (run_job). ERROR with a
    # traceback stays for engine errors and the farm's own bugs.
    throws = (PermanentFailure, Cancelled, NoRungLeft)
    # Request: Celery's own here. The worker entry (``workers.app``) sets the metered one, which
    # counts a finished job's frame counters in the worker's main process (``workers.metrics``).

    def run_job(self, fields: Mapping[str, Any], positional: tuple[Any, ...] = ()) -> dict[str, Any]:
        """Run this job on its rung and return the envelope (JSON). ``positional``: arguments
        the message had beside its fields, which refuse the job."""
        liveness.beat()  # the child has started the job it received
        request = self.request
        # Every publish stamps its message (a retry's too, ``tasks.app``); a redelivered message
        # keeps the stamp of a send long past: its trace starts here.
        redelivered = bool((request.delivery_info or {}).get("redelivered"))
        trace.begin(None if redelivered else getattr(request, trace.SENT_HEADER, None))
        soft_time_limit.arm()
        try:
            if positional:
                raise InvalidRequest(
                    f"{self.spec.name} request: farm jobs take keyword arguments only, got {len(positional)} positional"
                )
            return self._run_job(fields)
        except StaleAttempt as exc:
            # Celery stores nothing and retries nothing for Ignore: the job's state is another
            # worker's now, and this process's message is acked and forgotten.
            logger.warning("job %s: %s", self.request.id, exc)
            raise Ignore() from exc
        except Cancelled as exc:
            soft_time_limit.disarm()  # what is left is storing the state (see finally)
            logger.info("job %s cancelled: family %s, rung %s: %s", self.request.id, self.spec.name,
                        exc.rung or "-", exc)  # fmt: skip
            self._store_revoked(str(exc))
            events = self._webhook_events()
            if events is not None:
                events.completed("REVOKED", failure=str(exc))
            raise Ignore() from exc
        except FarmError as exc:
            if isinstance(exc, PermanentFailure):
                logger.warning("job %s rejected: family %s, rung %s: %s: %s", self.request.id, self.spec.name,
                               exc.rung or "-", type(exc).__name__, exc)  # fmt: skip
            elif isinstance(exc, NoRungLeft):
                logger.warning("job %s failed: family %s: %s", self.request.id, self.spec.name, exc)
            wired = wire_exception(exc)
            if wired is exc:
                raise
            raise wired from exc
        finally:
            # The job's work is over; what is left is Celery storing its state (or sending its
            # retry), which may wait out a broker outage. A soft limit firing there would turn a
            # finished job into a FAILURE of SoftTimeLimitExceeded (found by the chaos suite).
            soft_time_limit.disarm()
            trace.end()

    def after_return(self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        """The job's state is stored (Celery calls this after it, never for a retry or an Ignore):
        its ``completed`` webhook event goes in the outbox now, so a receiver reading the job sees it ended."""
        if status not in ("SUCCESS", "FAILURE"):
            return
        events = self._webhook_events()
        if events is None:
            return
        if status == "SUCCESS":
            events.completed(status, retval if isinstance(retval, Mapping) else None)
        else:
            events.completed(status, failure=f"{type(retval).__name__}: {retval}")

    def _webhook_events(self) -> JobEvents | None:
        """This delivery's webhook events, if its job asked for a webhook (its message's header)."""
        hook = Webhook.from_header(getattr(self.request, WEBHOOK_HEADER, None))
        if hook is None:
            return None
        settings = get_settings()
        return JobEvents(self.backend.client, self.request.id, self.spec.name, hook, base_url=settings.public_url,
                         progress_s=settings.webhook_progress_s)  # fmt: skip

    def _store_revoked(self, reason: str) -> None:
        """Store the cancelled job as REVOKED, as Celery stores one revoked before it ran, so that
        the client, ``farm status`` and Flower all read it as cancelled (a raised Cancelled would be
        stored FAILURE). Celery stores nothing over it: the caller raises Ignore."""
        # mark_as_revoked also counts a pipeline's part in its chord (on_chord_part_return), as a
        # FAILURE would be: the fan-in job then fails naming this part instead of waiting forever.
        self.backend.mark_as_revoked(self.request.id, reason, request=self.request)
        # Flower's state machine takes REVOKED from this event (the worker sends none for Ignore).
        self._progress_event("task-revoked", terminated=False, signum=None, expired=False)

    def _run_job(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        settings = get_settings()
        request = self.request
        spec = self.spec
        redelivered = bool((request.delivery_info or {}).get("redelivered"))
        options: dict[str, Any] = {}  # of the retry, if one is sent
        fresh = not (redelivered or request.retries)
        try:
            if not fresh:
                stored = self.backend.get_task_meta(request.id)
                if stored.get("status") == "SUCCESS":
                    # Its worker died between storing the result and acking the message: the job
                    # is done, and running it again would only redo the work.
                    return stored["result"]
                if stored.get("status") in ENDED_BADLY:
                    # Its end is stored (a stale copy's retry: a paused worker's child killed after
                    # another worker ended the job). Acked, nothing stored, nothing run again.
                    logger.warning("job %s: already ended %s; this delivery runs nothing", request.id, stored["status"])
                    self._end_event(stored)
                    raise Ignore()
            ladder_name = fields.get(spec.ladder_field) if spec.ladder_field else None
            if ladder_name is not None and not isinstance(ladder_name, str):
                raise InvalidRequest(f"{spec.name} request: {spec.ladder_field} must name a ladder")
            ladder = registry.ladder_for(spec, ladder_name)
            ttl = int(self.app.conf.result_expires)
            store = ArtifactStore(settings.storage_dir, request.id)
            events = self._webhook_events()
            channel = JobChannel(self.backend.client, request.id, ttl, self._progress_event,
                                 on_progress=events.progress if events is not None else None)  # fmt: skip
            resuming = Resuming(spec, store, fields)
            # Before anything runs: a job whose language no rung handles is rejected here.
            languages = LanguageCheck.of(spec, ladder, fields, settings.models_dir)
            def run_rung(rung: Rung, index: int, attempt: int) -> tuple[dict[str, Any], tuple[ArtifactInfo, ...]]:
                if attempt > 0 or not fresh:
                    # Every attempt but a job's very first starts clean: no file and no partial
                    # output of an earlier one (killed, or a rung skipped earlier in this run),
                    # but for the checkpoint it resumes from.
                    store.clear()
                    channel.reset()
                if events is not None:  # into the outbox only: the dispatcher posts (tasks.producer.webhooks)
                    events.attempt_began(rung.name)
                liveness.beat()
                uploads = _uploads(store, attempt, rung, request.hostname or "")
                ctx = EngineContext(request.id, attempt, index, rung.name, rung.device, store,
                                    settings.models_dir, channel, redis=self.backend.client,
                                    backend=self.backend, settings=settings, uploads=uploads)  # fmt: skip
                resuming.prepare(ctx, rung, settings.checkpoint_interval)
                output = run_engine(spec, rung, ctx, fields, settings.input_roots)
                infos = store.list()
                return output, tuple(uploads.artifacts(infos) if uploads is not None else infos)

            job = self._ladder_run(ladder, fresh, ttl, languages, resuming, channel)
            trace.mark("ready")  # the delivery's setup: ladder, language check, policies
            try:
                outcome: Envelope | RetryRequest = run_ladder(job, run_rung)
            except StaleAttempt:
                raise  # the job is another worker's now, and so is its checkpoint
            except FarmError:
                resuming.ended()  # rejected, cancelled, failed for good: nothing will resume
                raise
            if isinstance(outcome, Envelope):
                resuming.ended()
                if settings.storage_url:
                    # Every file is in the store now, which readers read: this worker's copies would
                    # only fill its disk, where no `farm gc` of the store looks.
                    shutil.rmtree(store.folder, ignore_errors=True)
                return dataclasses.replace(outcome, trace=trace.end()).to_json()
        except MemoryError:
            # Outside the engine (the engine's own are mapped in run_ladder); Celery must never see
            # one. The open attempt, if any, is settled by the next run as a lost child: one rung down.
            outcome = RetryRequest("MemoryError outside the engine", ResourceFailure("MemoryError", Outcome.OOM))
        except SoftTimeLimitExceeded:
            # Outside the engine (the engine's own are mapped in run_ladder): the bookkeeping
            # around it waited out a slow or absent Redis. The attempt is settled by the next
            # run as a lost child, one rung down, as for a MemoryError here.
            outcome = RetryRequest(
                "soft time limit outside the engine", ResourceFailure("soft time limit", Outcome.TIMEOUT)
            )
        except RedisError as exc:
            # The attempt log or result backend failed (a broker hiccup), not the job: same rung,
            # bounded by max_retries; the retry itself goes through the same Redis, so a Redis that
            # stays down ends the job FAILED rather than looping.
            outcome = RetryRequest(f"Redis error: {exc}", TransientFailure(f"Redis error: {exc}"))
            # The attempt's outcome may be unwritten: the retry says so, or the next delivery would
            # judge the open attempt a lost child and move the job down (settle_open_attempts).
            unwritten = {**_unwritten(request), request.retries: f"Redis error: {exc}"[:300]}
            # Celery's retry sends this delivery's custom headers on unless given others: keep them.
            header = {str(retries): why for retries, why in unwritten.items()}
            options["headers"] = {**(request.headers or {}), UNWRITTEN_HEADER: header}
        if outcome.queue is not None:
            logger.warning("job %s: %s", request.id, outcome.reason)
        self.send_retry(exc=outcome.exc, countdown=settings.retry_delay, queue=outcome.queue, **options)

    def send_retry(self, **options: Any) -> NoReturn:
        """Raise Celery's Retry once the retry (``Task.retry`` options) is sent, or hand the message
        back when this process could not send it.

        Celery fails the job for good when the retry's publish raises (Reject, requeue=False).
        Where the broker stays unreachable past the publish retry policy, that bounded end is kept.
        Any other publish error is this process's producer's, and the next publish may work: after
        a network cut a child's pooled kombu producer kept a channel its closed connection had let
        go (AttributeError in the Redis transport's ``_connparams``), and a moved job failed (found
        by the chaos suite's two pools). Handed back, the message is delivered again, and that
        delivery goes on from the history: a recorded move is not made twice, a failed rung not run again.
        """
        try:
            raise self.retry(**options)
        except Reject as unsent:
            if isinstance(unsent.reason, (OperationalError, RedisError, OSError)) or not self._hand_back_unsent():
                raise
            raise Reject(unsent.reason, requeue=True) from unsent

    def _hand_back_unsent(self) -> bool:
        """May this job's message go back once more for a retry it could not send? At most
        :data:`UNSENT_HANDBACKS` times a job: an error that comes back at every publish (a bug, not
        a stale producer) must end the job, not deliver it again for ever."""
        key = keys.unsent_retries(self.request.id)
        try:
            pipe = self.backend.client.pipeline()
            count = pipe.incr(key).expire(key, 86400).execute()[0]
        except RedisError:
            return False
        return int(count) <= UNSENT_HANDBACKS

    def _ladder_run(self, ladder: Ladder, fresh: bool, ttl: int, languages: LanguageCheck | None,
                    resuming: Resuming, channel: JobChannel) -> LadderRun:  # fmt: skip
        """This delivery of the job as ``run_ladder`` needs it: its records, its rung policies
        (:meth:`_policies`), where else it may go before a rung runs (sent back, or moved), and
        the channel its engines check the cancel flag through."""
        settings, request, spec = get_settings(), self.request, self.spec
        return LadderRun(
            job_id=request.id,
            ladder=ladder,
            engines=spec.engines,
            log=AttemptLog(self.backend.client, request.id, ttl=ttl),
            retries=request.retries,
            worker=request.hostname or "",
            transient_budget=settings.transient_retries,
            fresh=fresh,
            result_key=self.backend.get_key_for_task(request.id).decode(),
            stale_after=_stale_after(settings),
            unwritten=_unwritten(request),
            policies=self._policies(ladder, languages, resuming),
            reroute=reroute.sender(ladder, spec.engines, settings.models_dir,
                                   partial(_reroute, spec, ladder, request.hostname or "", self.backend.client)),
            move=_mover(spec, ladder, request, fresh, self.app, languages),
            route=_route_note(request),
            recorded=channel.attempt_began,
        )

    def _policies(self, ladder: Ladder, languages: LanguageCheck | None, resuming: Resuming) -> list[RungPolicy]:
        """What this delivery asks before each rung and tells after each attempt (``tasks.runtime.rung_policies``),
        in order: this pool can run the rung, the rung handles the job's language, its breaker and
        the pool's memory pressure let it run; then the attempt's checkpoint."""
        settings = get_settings()
        guard = RungGuard(
            ladder,
            ladder_policy(ladder.identity),
            self.request.id,
            pool_breakers(self.backend.client, settings.pool),
            # A probe's claim outlives its longest attempt; a claim its lost worker left lapses then.
            probe_s=float(self.farm_hard_limit or 3600) + 60,
            pressure=partial(pool_under_pressure, settings.pool, self.backend.client),
            # Waiting for a breaker's cool-down must leave the attempt most of its soft limit.
            max_wait_s=float(self.soft_time_limit or 600) / 4,
        )
        policies: list[RungPolicy] = [Availability(settings.models_dir)]
        if languages is not None:
            policies.append(Language(languages.why_not))
        policies.append(Breaker(guard))
        if self.spec.resume is not None:
            policies.append(resuming)
        return policies

    def _end_event(self, stored: Mapping[str, Any]) -> None:
        """The event of the job's stored end, for a delivery that runs nothing: Flower's state
        follows the events, and would show this delivery started for good (none is sent for Ignore)."""
        if stored.get("status") == "REVOKED":
            self._progress_event("task-revoked", terminated=False, signum=None, expired=False)
        else:
            self._progress_event("task-failed", exception=str(stored.get("result")), traceback=None)

    def _progress_event(self, event: str, **fields: Any) -> None:
        if self.app.conf.worker_send_task_events:
            self.send_event(event, **fields)


class Resuming(RungPolicy):
    """One delivery's side of the job's checkpoint (``tasks.wire.checkpoint``): what each attempt is
    offered (a rung policy: its record says what it resumes from before it is written), the files
    put back, the checkpoint removed when the job ends for good."""

    def __init__(self, spec: FamilySpec, store: ArtifactStore, fields: Mapping[str, Any]) -> None:
        self.spec = spec
        self.store = store_for(store, spec.name, fields, _remote_checkpoint(store.job_id)) \
            if spec.resume is not None else None  # fmt: skip
        self.offered: Checkpoint | None = None

    def offer(self, rung: Rung) -> tuple[dict[str, Any] | None, str]:
        """The checkpoint the attempt on ``rung`` goes on from, for its record: (what it resumes
        from, or None; why a checkpoint there is was ignored, or "")."""
        self.offered = None
        if self.store is None or self.spec.resume is None:
            return None, ""
        try:
            checkpoint = self.store.load()
        except UnusableCheckpoint as exc:
            logger.warning("job %s: checkpoint ignored, starting over: %s", self.store.artifacts.folder.name, exc)
            self.store.remove()
            return None, str(exc)
        if checkpoint is None:
            return None, ""
        why_not = self.spec.resume.why_not(checkpoint, rung.name)
        if why_not:
            return None, why_not
        self.offered = checkpoint
        return checkpoint.record(), ""

    def starting(self, rung: Rung, attempt: Attempt) -> None:
        attempt.resumed_from, attempt.checkpoint_ignored = self.offer(rung)

    def prepare(self, ctx: EngineContext, rung: Rung, interval: float) -> None:
        """Give the attempt's context its checkpoint (files back in place) and its writer."""
        if self.store is None or self.spec.resume is None:
            return
        if self.offered is not None:
            try:
                self.store.restore(self.offered)
                ctx.resume = self.offered
            except (OSError, UnusableCheckpoint) as exc:  # its files went between the look and now: start over
                logger.warning("job %s: checkpoint lost before it could be used, starting over: %s", ctx.job_id, exc)
                self.store.remove()
                ctx.artifacts.clear()
                self.offered = None
        ctx.checkpoints = CheckpointWriter(self.store, self.spec.resume.unit, rung.name, interval, self.offered)

    def ended(self) -> None:
        if self.store is not None:
            self.store.remove()


def _reroute(spec: FamilySpec, ladder: Any, node: str, client: Any, why_not_here: dict[str, str],
             attempts: list[Any]) -> reroute.Reroute:  # fmt: skip
    """Where a job this worker can run no rung of goes (``tasks.runtime.reroute``), by the live capability
    records; a ladder started from one of its rungs is named in them as the family's own."""
    return reroute.decide(node=node, family=spec.name, family_queue=spec.queue,
                          ladder=registry.recorded_ladder(spec, ladder),
                          why_not_here=why_not_here, attempts=attempts, records=capability.live(client))  # fmt: skip


def _mover(spec: FamilySpec, ladder: Any, request: Any, fresh: bool, app: Any, languages: Any) -> Any:
    """What asks whether this delivery's job goes to another pool (``tasks.producer.routing.move``); None
    where it runs here without asking: routing off, a job routed to this pool at submit on its
    first delivery (the hot path reads nothing more), or a queue its producer named (a GPU
    affinity queue, an operator's own), which is kept."""
    settings = get_settings()
    came_from = str((request.delivery_info or {}).get("routing_key") or "")
    if not settings.routing or not (came_from == spec.queue or came_from.startswith(spec.queue + POOL_QUEUE_SEP)):
        return None
    if fresh and came_from == pool_queue(settings.pool, spec.queue):
        return None
    client = app.backend.client
    rungs = [r.name for r in ladder.rungs]
    recorded = registry.recorded_ladder(spec, ladder)
    why_not = (lambda i: languages.why_not(ladder.rungs[i])) if languages is not None else None

    def move(index: int, attempts: list[Any]) -> routing.Route | None:
        return routing.move(pool=settings.pool, family=spec.name, family_queue=spec.queue,
                            ladder=recorded, rungs=rungs, index=index, attempts=attempts,
                            records=capability.live(client), depths=lambda qs: queue_depths(qs, app),
                            spill_depth=settings.route_spill_depth, why_not=why_not)  # fmt: skip

    return move


def _route_note(request: Any) -> str:
    """Why the job was sent to the queue it came from (the submit's ``ROUTE_HEADER``), or ''."""
    note = getattr(request, routing.ROUTE_HEADER, None)
    return note if isinstance(note, str) else ""


def _unwritten(request: Any) -> dict[int, str]:
    """The ``UNWRITTEN_HEADER`` of this delivery: retry count → Redis error (empty if none)."""
    header = getattr(request, UNWRITTEN_HEADER, None)
    if not isinstance(header, Mapping):
        return {}
    return {int(k): str(v) for k, v in header.items() if str(k).isdigit()}


def _uploads(store: ArtifactStore, attempt: int, rung: Rung, worker: str) -> object_store.AttemptPublisher | None:
    """What copies the attempt's files into the object store where the farm keeps them there
    (FARM_STORAGE_URL), each under this attempt's own key (``tasks.wire.object_store``): those a
    partial output announces as it is made, every finished artifact at the attempt's success."""
    url = get_settings().storage_url
    if not url:
        return None
    return object_store.AttemptPublisher(store.folder, S3Place.parse(url), store.job_id, attempt,
                                         {"rung": rung.name, "worker": worker}, object_store.store_at(),
                                         waiting=liveness.beat)  # fmt: skip


def _remote_checkpoint(job_id: str) -> RemoteCheckpoint | None:
    """The job's checkpoint in the object store, where the farm keeps its files there: an attempt
    on another host resumes from it (``tasks.wire.checkpoint``)."""
    url = get_settings().storage_url
    return RemoteCheckpoint(object_store.store_at(), S3Place.parse(url), job_id) if url else None


def _stale_after(settings: Any) -> float:
    """Seconds a successful attempt may run before it must check that the job is still its own.

    Redis gives an unacked job to another worker only after the visibility timeout, or once the
    worker has been silent past the handback grace (``workers.handback``): an attempt shorter
    than half of either cannot have been handed out again. RabbitMQ does as soon as it drops the
    worker's connection (missed heartbeats while the worker is paused or cut off), which can be
    any time: every success is checked there.
    """
    if settings.broker_is_rabbitmq:
        return 0.0
    return min(settings.visibility_timeout, settings.handback_grace or settings.visibility_timeout) / 2


def _media_urls(settings: FarmSettings) -> list[str]:
    """Where a job's media may be fetched from: FARM_MEDIA_URLS, and the gateway's uploads in the
    object store where the farm keeps its files there (the gateway lets only ``upload:<id>`` name one)."""
    if not settings.storage_url:
        return list(settings.media_urls)
    place = uploads_place(settings.storage_url)
    return [*settings.media_urls, place.url(place.prefix)]


def run_engine(
    spec: FamilySpec, rung: Rung, ctx: EngineContext, fields: Mapping[str, Any], media_roots: list[Any]
) -> dict[str, Any]:
    """One rung: validate the request in the worker (media resolved, media named by URL fetched),
    look at its input (``FamilySpec.probe``) before the engine's module and model load, call the
    engine, drain it if it is a generator, check and dump its result. Raises what the engine raises."""
    settings = ctx.settings
    fetcher = MediaFetcher(ctx.artifacts, _media_urls(settings), settings.media_url_max_mb << 20,
                           settings.media_url_timeout, on_chunk=lambda done, total: _fetching(ctx, done, total))
    try:
        request = spec.parse_request(fields, media_roots, fetcher)
        if spec.probe is not None:
            spec.probe(request)
            liveness.beat()
        engine = spec.engines[rung.engine]
        params = engine.parse_params(rung)
        function = engine.function()  # imports the engine's module: a model runtime's import is long
        liveness.beat()
        trace.mark("engine")  # what it took to get here: validation, media fetch, probe, import
        result = function(ctx, request, params)
        if inspect.isgenerator(result):
            result = drain(result, ctx)
        trace.mark("engine_end")
    finally:
        fetcher.remove()  # the engine is done with the fetched media, whatever it did
    if isinstance(result, spec.result):
        return result.model_dump(mode="json")
    if isinstance(result, BaseModel) or not isinstance(result, Mapping):
        raise EngineError(f"engine {rung.engine!r} returned {type(result).__name__}, not {spec.result.__name__}")
    return spec.result.model_validate(dict(result)).model_dump(mode="json")


def _fetching(ctx: EngineContext, done: int, total: int | None) -> None:
    """A media URL's download as the attempt's progress; a cancel stops it (Cancelled)."""
    ctx.check_cancelled()
    ctx.progress(None, stage=f"fetching media: {done / (1 << 20):.0f}"
                 + (f" of {total / (1 << 20):.0f} MB" if total else " MB"))  # fmt: skip


def drain(stream: Generator[Any, None, Any], ctx: EngineContext) -> Any:
    """Run a generator engine to its end: each yielded item is published as a partial output, the
    generator's return value is the result. The caller's exception mapping sees whatever it
    raises mid-stream (a ``MemoryError`` after three chunks still moves the job down), and the
    generator is closed on every path, so its own ``finally`` blocks (closing PyAV containers)
    run before the next rung starts in this child."""
    try:
        while True:
            try:
                item = next(stream)
            except StopIteration as stop:
                return stop.value
            ctx.publish(item)
            ctx.check_cancelled()
    finally:
        stream.close()


def register_tasks(app: Celery) -> None:
    """Give ``app`` the task of every family the registry knows, once (the worker entry calls it).

    The app itself registers none, so a producer that imports it loads nothing of this package.
    """
    for spec in registry.load().values():
        if spec.task_name not in app.tasks:
            make_task(app, spec)


def make_task(app: Celery, spec: FamilySpec) -> Task:
    """Register the family's Celery task on ``app``: its name, limits and retry bound from the spec."""
    limits = registry.limits_for(spec)
    longest = max(len(ladder) for ladder in registry.ladders_of(spec))

    def run(self: FarmTask, *args: Any, **fields: Any) -> dict[str, Any]:
        return self.run_job(fields, args)

    # Celery builds a signature checker from the function's name: it must be an identifier.
    run.__name__ = run.__qualname__ = spec.name.replace("-", "_")
    run.__doc__ = spec.description
    return app.task(
        bind=True,
        base=FarmTask,
        name=spec.task_name,
        spec=spec,
        soft_time_limit=limits.soft,
        farm_hard_limit=limits.hard,
        farm_stall_timeout=limits.stall,
        # One attempt per rung, one more per rung after a stall, plus the same-rung budget, plus one
        # to report the exhausted ladder.
        max_retries=2 * longest + get_settings().transient_retries,
        default_retry_delay=get_settings().retry_delay,
    )(run)
