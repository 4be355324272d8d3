"""Pipelines: several farm jobs run in parallel, then one job that combines what they made.

    parts (each its own farm job: own id, ladder, history)  ──►  then (the fan-in job)

A plan is sent as one Celery chord: the parts are its header, the fan-in job its body, an
*immutable* signature (Celery would otherwise pass it the parts' results as a positional argument,
which farm tasks refuse), so the fan-in job reads its parts' results and artifacts by id, in plan
order, never in completion order. What the plan says (every part's family, id, label and fields)
is stored once in Redis beside the results (:func:`manifest_key`), so neither the messages nor the
fan-in job's arguments grow with the number of parts: every header message carries a copy of the
body's signature, and a body holding the whole plan would make a 500-part plan cost 500 copies.

Why a chord survives the farm's kills (Celery 5.7, Redis result backend; checked by
``tests/integration/test_dialogue_jobs.py`` with real SIGKILLs and by
``tests/tasks/families/test_dialogue_script.py`` on the backend's counting):

- A part moves down its ladder by Celery's retry under the same id, and a SIGKILLed child is
  retried the same way (``task_retry_on_worker_lost``). A retry carries the request's ``chord``,
  ``group_id`` and ``group_index`` along (``Context.as_execution_options``) and stores RETRY,
  which is not a chord event: the header counts a part only when it stores SUCCESS or FAILURE.
- The count is kept per part id in a Redis set, so a part whose SUCCESS is reported twice (a
  worker lost after storing it) counts once, and the body is published once (a claim key).
- With ``task_acks_late`` the last part's child publishes the body (inside Celery's result write)
  before its own message is acked. A child killed between the two is not retried: Celery 5.7 sees
  the stored SUCCESS and acks. A whole worker dying there hands the part back after the
  visibility timeout; the farm returns its stored result without running it, and the chord,
  already dispatched (a done marker, then its keys gone), sends nothing more.
- A part that fails for good fails the body without running it (Celery's ``ChordError``, stored
  as the fan-in job's FAILURE, once every part has ended); :class:`PipelineHandle` turns that into
  the part's own failure, named by its label.
- The fan-in job is a farm job like any other: a killed one runs again on its own next rung,
  under its own id; the parts are not run again.

A family whose request model has an ``as_pipeline(job_id) -> Plan`` method is submitted as its
plan by :func:`mediafarm.submit` (``farm submit`` included): the dialogue job is one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import ChordError
from celery.result import AsyncResult

from mediafarm.tasks import families as registry
from mediafarm.tasks import keys
from mediafarm.tasks.app import app
from mediafarm.tasks.artifacts import UnsafeArtifactName, folder_name
from mediafarm.tasks.client import JobHandle
from mediafarm.tasks.errors import InvalidRequest, JobFailed, PermanentFailure
from mediafarm.tasks.records import Progress

READY = frozenset({"SUCCESS", "FAILURE", "REVOKED"})


def manifest_key(job_id: str) -> str:
    """The plan of the pipeline whose fan-in job is ``job_id`` (JSON; lives as long as results)."""
    return f"{keys.PREFIX}:pipeline:{job_id}"


@dataclass(frozen=True)
class Part:
    """One job of a plan. Attributes: family, job_id, fields (its request, JSON-safe), label
    (how errors and progress name it: ``line 3 (alice)``)."""

    family: str
    job_id: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "job_id": self.job_id, "fields": dict(self.fields), "label": self.label}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Part:
        return cls(data["family"], data["job_id"], data.get("fields") or {}, data.get("label") or data["job_id"])


@dataclass(frozen=True)
class Plan:
    """Parts run in parallel, then one fan-in job. ``parts_stage``/``then_stage`` name the two
    stages in progress reports (``lines 3/6``, ``assemble``)."""

    parts: tuple[Part, ...]
    then: Part
    parts_stage: str = "parts"
    then_stage: str = "combine"

    def to_json(self) -> dict[str, Any]:
        return {"parts": [p.to_json() for p in self.parts], "then": self.then.to_json(),
                "parts_stage": self.parts_stage, "then_stage": self.then_stage}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        return cls(tuple(Part.from_json(p) for p in data["parts"]), Part.from_json(data["then"]),
                   data.get("parts_stage", "parts"), data.get("then_stage", "combine"))  # fmt: skip


def read_plan(job_id: str, client: Any = None) -> Plan | None:
    """The stored plan of the pipeline whose fan-in job is ``job_id``, or None."""
    raw = (client or app.backend.client).get(manifest_key(job_id))
    return Plan.from_json(json.loads(raw)) if raw else None


def _checked(part: Part) -> dict[str, Any]:
    """The part's fields as its family's request (InvalidRequest naming the part if they do not fit)."""
    try:
        folder_name(part.job_id)
        request = registry.get(part.family).parse_request(part.fields)
    except (InvalidRequest, UnsafeArtifactName, ValueError) as exc:
        raise InvalidRequest(f"{part.label or part.job_id}: {exc}") from None
    return request.model_dump(mode="json", exclude_unset=True, by_alias=True)


def send_plan(plan: Plan, queue: str | None = None) -> PipelineHandle:
    """Check every job of ``plan``, store the plan, send it as one chord; the handle of the fan-in job.

    ``queue`` sends every job of the plan there (a worker consuming it runs them all); by default
    each goes to its family's queue. Nothing is sent if a job's fields do not fit its family.
    """
    from celery import chord, group

    if not plan.parts:
        raise InvalidRequest(f"pipeline {plan.then.job_id}: a plan needs at least one part")
    ids = [p.job_id for p in (*plan.parts, plan.then)]
    if len(set(ids)) != len(ids):
        raise InvalidRequest(f"pipeline {plan.then.job_id}: two jobs of the plan share an id")
    checked = [(_checked(p), p) for p in (*plan.parts, plan.then)]

    def signature(fields: dict[str, Any], part: Part, **options: Any) -> Any:
        spec = registry.get(part.family)
        # Explicit None limits: the worker's rule (see client.submit).
        return app.signature(spec.task_name, kwargs=fields, task_id=part.job_id, queue=queue or spec.queue,
                             soft_time_limit=None, time_limit=None, **options)  # fmt: skip

    *header, (then_fields, then) = checked
    ttl = int(app.conf.result_expires)
    app.backend.client.set(manifest_key(then.job_id), json.dumps(plan.to_json()), ex=ttl)
    body = signature(then_fields, then, immutable=True)
    parts = group([signature(f, p) for f, p in header], app=app)
    chord(parts, body, app=app).apply_async(task_id=then.job_id)
    return PipelineHandle(id=then.job_id, family=then.family)


def _metas(ids: Sequence[str]) -> list[dict[str, Any] | None]:
    """Celery's stored meta of each job (one MGET): ``status``, ``result`` ...; None if nothing stored."""
    if not ids:
        return []
    raw = app.backend.client.mget([app.backend.get_key_for_task(i) for i in ids])
    return [json.loads(r) if r else None for r in raw]


def _state(meta: dict[str, Any] | None) -> str:
    return meta.get("status", "PENDING") if meta else "PENDING"


@dataclass(frozen=True)
class Collected:
    """A finished part, as the fan-in job reads it. Attributes: part, envelope (its result)."""

    part: Part
    envelope: dict[str, Any]


def collect(job_id: str, *, timeout: float = 30.0, poll: float = 0.2,
            on_wait: Callable[[Part], Any] | None = None) -> list[Collected]:  # fmt: skip
    """Every part's result envelope, in plan order: called by the fan-in job.

    The chord runs the fan-in job only once every part stored its final state, so normally
    nothing waits. Should a part still be running (a fan-in job sent by hand), it is waited for up
    to ``timeout`` seconds, then the job fails naming it.

    Raises:
        PermanentFailure: No plan is stored for ``job_id``; a part failed; a part did not finish.
    """
    plan = read_plan(job_id)
    if plan is None:
        raise PermanentFailure(
            f"no pipeline plan is stored for job {job_id} (expired, or the job was sent without its parts: "
            "submit it with mediafarm.submit, which stores the plan and sends the parts)"
        )
    deadline = time.monotonic() + timeout
    metas = _metas([p.job_id for p in plan.parts])
    while True:
        waiting = [i for i, m in enumerate(metas) if _state(m) not in READY]
        failed = [plan.parts[i] for i, m in enumerate(metas) if _state(m) in READY and _state(m) != "SUCCESS"]
        if failed:
            names = ", ".join(f"{p.label} ({p.job_id}): {_state(metas[plan.parts.index(p)])}" for p in failed)
            raise PermanentFailure(f"{len(failed)} of {len(plan.parts)} {plan.parts_stage} failed: {names}")
        if not waiting:
            return [Collected(p, m["result"]) for p, m in zip(plan.parts, metas, strict=True) if m]
        if time.monotonic() > deadline:
            part = plan.parts[waiting[0]]
            raise PermanentFailure(
                f"{part.label} ({part.job_id}) has not finished after {timeout:g} s (state {_state(metas[waiting[0]])})"
            )
        if on_wait is not None:
            on_wait(plan.parts[waiting[0]])
        time.sleep(poll)
        fresh = _metas([plan.parts[i].job_id for i in waiting])
        for i, meta in zip(waiting, fresh, strict=True):
            metas[i] = meta


@dataclass(frozen=True)
class PipelineHandle(JobHandle):
    """The handle of a pipeline: its fan-in job (``id``), with the stages of the whole.

    ``wait(on_progress=...)`` reports the parts first (``lines 3/6``, fraction counting each part
    and the fan-in job as one step each), then the fan-in job's own progress. A part that failed
    for good comes back as that part's failure (``JobRejected`` ...), its label in the reason.
    """

    def plan(self) -> Plan:
        plan = read_plan(self.id)
        if plan is None:
            raise RuntimeError(f"no pipeline plan is stored for job {self.id} (expired, or not a pipeline)")
        return plan

    def stages(self) -> dict[str, Any]:
        """``{"parts": {"total", "done", "failed"}, "then": state}``: where the pipeline stands."""
        plan = self.plan()
        states = [_state(m) for m in _metas([p.job_id for p in plan.parts])]
        return {
            "parts": {"total": len(states), "done": sum(s == "SUCCESS" for s in states),
                      "failed": sum(s in READY and s != "SUCCESS" for s in states)},
            "then": self.state(),
        }  # fmt: skip

    def cancel(self) -> None:
        """Cancel every part not finished, and the fan-in job."""
        plan = self.plan()
        for part, meta in zip(plan.parts, _metas([p.job_id for p in plan.parts]), strict=True):
            if _state(meta) not in READY:
                JobHandle(part.job_id, part.family).cancel()
        super().cancel()

    def _follow(self, result: AsyncResult, timeout: float | None, poll: float,
                on_progress: Callable[[Progress], Any]) -> None:  # fmt: skip
        deadline = None if timeout is None else time.monotonic() + timeout
        plan = self.plan()
        total = len(plan.parts)
        waiting = [p.job_id for p in plan.parts]
        seen: Progress | None = None
        while not result.ready():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} not finished after {timeout} s ({len(waiting)} of {total} "
                                   f"{plan.parts_stage} still running; state {result.state})")  # fmt: skip
            if waiting:
                waiting = [i for i, m in zip(waiting, _metas(waiting), strict=True) if _state(m) not in READY]
            done = total - len(waiting)
            if waiting:
                progress = Progress(done / (total + 1), f"{plan.parts_stage} {done}/{total}")
            else:
                own = self.progress()
                fraction = (total + ((own.fraction or 0.0) if own else 0.0)) / (total + 1)
                stage = f"{plan.then_stage}" + (f" {own.stage}" if own and own.stage else "")
                progress = Progress(fraction, stage, own.media_seconds if own else None,
                                    variant=own.variant if own else "")  # fmt: skip
            if seen is None or (progress.fraction, progress.stage) != (seen.fraction, seen.stage):
                seen = progress
                on_progress(progress)
            time.sleep(poll)

    def _raise_failure(self, result: AsyncResult) -> None:
        if isinstance(result.result, ChordError):
            # The fan-in job never ran: a part failed. Raise that part's own failure.
            plan = self.plan()
            for part, meta in zip(plan.parts, _metas([p.job_id for p in plan.parts]), strict=True):
                if _state(meta) in READY and _state(meta) != "SUCCESS":
                    try:
                        JobHandle(part.job_id, part.family)._raise_failure(AsyncResult(part.job_id, app=app))
                    except JobFailed as exc:
                        reason = f"{part.label} ({part.job_id}) failed, so {plan.then_stage} never ran: {exc.reason}"
                        raise type(exc)(self.id, reason, exc.attempts) from None
        super()._raise_failure(result)
