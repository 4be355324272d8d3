"""Pipelines, the producer's side: send a plan (:func:`send_plan`), follow it (:class:`PipelineHandle`).

What a plan is, and why a chord survives the farm's kills: ``tasks.plan``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery.exceptions import ChordError
from celery.result import AsyncResult

from mediafarm.tasks import families as registry
from mediafarm.tasks import keys
from mediafarm.tasks.app import app
from mediafarm.tasks.artifacts import UnsafeArtifactName, folder_name
from mediafarm.tasks.client import JobHandle
from mediafarm.tasks.errors import InvalidRequest, JobFailed
from mediafarm.tasks.plan import READY, Part, Plan, metas, read_plan, state
from mediafarm.tasks.records import Progress


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
    app.backend.client.set(keys.pipeline_plan(then.job_id), json.dumps(plan.to_json()), ex=ttl)
    body = signature(then_fields, then, immutable=True)
    parts = group([signature(f, p) for f, p in header], app=app)
    chord(parts, body, app=app).apply_async(task_id=then.job_id)
    return PipelineHandle(id=then.job_id, family=then.family)


@dataclass(frozen=True)
class PipelineHandle(JobHandle):
    """The handle of a pipeline: its fan-in job (``id``), with the stages of the whole.

    ``wait(on_progress=...)`` reports the parts first (``lines 3/6``, fraction counting each part
    and the fan-in job as one step each), then the fan-in job's own progress. A part that failed
    for good comes back as that part's failure (``JobRejected`` ...), its label in the reason.
    """

    def plan(self) -> Plan:
        plan = read_plan(app.backend, self.id)
        if plan is None:
            raise RuntimeError(f"no pipeline plan is stored for job {self.id} (expired, or not a pipeline)")
        return plan

    def stages(self) -> dict[str, Any]:
        """``{"parts": {"total", "done", "failed"}, "then": state}``: where the pipeline stands."""
        plan = self.plan()
        states = [state(m) for m in metas(app.backend, [p.job_id for p in plan.parts])]
        return {
            "parts": {"total": len(states), "done": sum(s == "SUCCESS" for s in states),
                      "failed": sum(s in READY and s != "SUCCESS" for s in states)},
            "then": self.state(),
        }  # fmt: skip

    def cancel(self) -> None:
        """Cancel every part not finished, and the fan-in job."""
        plan = self.plan()
        for part, meta in zip(plan.parts, metas(app.backend, [p.job_id for p in plan.parts]), strict=True):
            if state(meta) not in READY:
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
                stored = metas(app.backend, waiting)
                waiting = [i for i, m in zip(waiting, stored, strict=True) if state(m) not in READY]
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
            for part, meta in zip(plan.parts, metas(app.backend, [p.job_id for p in plan.parts]), strict=True):
                if state(meta) in READY and state(meta) != "SUCCESS":
                    try:
                        JobHandle(part.job_id, part.family)._raise_failure(AsyncResult(part.job_id, app=app))
                    except JobFailed as exc:
                        reason = f"{part.label} ({part.job_id}) failed, so {plan.then_stage} never ran: {exc.reason}"
                        raise type(exc)(self.id, reason, exc.attempts) from None
        super()._raise_failure(result)
