"""Pipelines, the side every process shares: what a plan is, and how its fan-in job reads its parts.

    parts (each its own farm job: own id, ladder, history)  ──►  then (the fan-in job)

A family whose request model has an ``as_pipeline(job_id) -> Plan`` method is submitted as its
plan by :func:`mediafarm.submit` (``farm submit`` included): the dialogue and the cam-filter are.
The producer sends a plan as one Celery chord (``tasks.producer.client.send_plan``) after storing what it
says (every part's family, id, label and fields) once in Redis beside the results
(``keys.pipeline_plan``), so neither the messages nor the fan-in job's arguments grow with the
number of parts: every header message carries a copy of the body's signature, and a body holding
the whole plan would make a 500-part plan cost 500 copies. The fan-in job reads the plan and its
parts' results by id, in plan order, never in completion order (:func:`collect`, which an engine
calls as ``ctx.collect()``); the producer follows it with ``tasks.producer.handles.PipelineHandle``.

Why a chord survives the farm's kills (Celery 5.7, Redis result backend; checked by
``tests/integration/test_dialogue_jobs.py`` with real SIGKILLs and by
``tests/tasks/families/test_dialogue_script.py`` on the backend's counting):

- The fan-in job's signature is *immutable*: Celery would otherwise pass it the parts' results as
  a positional argument, which farm tasks refuse.
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
  as the fan-in job's FAILURE, once every part has ended); ``PipelineHandle`` turns that into the
  part's own failure, named by its label.
- The fan-in job is a farm job like any other: a killed one runs again on its own next rung,
  under its own id; the parts are not run again.

Nothing here imports the Celery app or the client: the functions take the result backend
(Celery's, its ``client`` and key names) from their caller.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery.states import READY_STATES

from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.errors import PermanentFailure
from mediafarm.tasks.wire.records import envelope_in_current_names

# Celery states after which a job changes no more (SUCCESS, FAILURE, REVOKED).
READY = READY_STATES


@dataclass(frozen=True)
class Part:
    """One job of a plan.

    Attributes:
        family: The job's family.
        job_id: Its id (a pipeline's parts get ids derived from the fan-in job's).
        fields: Its request, JSON-safe.
        label: How errors and progress name it: ``line 3 (alice)``.
    """

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
    """Parts run in parallel, then one fan-in job.

    Attributes:
        parts: The jobs run in parallel.
        then: The fan-in job, run once every part has ended; its id is the pipeline's.
        parts_stage: How progress names the parts' stage (``lines 3/6``).
        then_stage: How progress names the fan-in job's stage (``assemble``).
    """

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


def read_plan(backend: Any, job_id: str) -> Plan | None:
    """The stored plan of the pipeline whose fan-in job is ``job_id``, or None."""
    raw = backend.client.get(keys.pipeline_plan(job_id))
    return Plan.from_json(json.loads(raw)) if raw else None


def metas(backend: Any, ids: Sequence[str]) -> list[dict[str, Any] | None]:
    """Celery's stored meta of each job (one MGET): ``status``, ``result`` ...; None if nothing stored."""
    if not ids:
        return []
    raw = backend.client.mget([backend.get_key_for_task(i) for i in ids])
    return [json.loads(r) if r else None for r in raw]


def state_of(meta: dict[str, Any] | None) -> str:
    """The Celery state a stored meta says (PENDING when nothing is stored)."""
    return meta.get("status", "PENDING") if meta else "PENDING"


@dataclass(frozen=True)
class Collected:
    """A finished part, as the fan-in job reads it.

    Attributes:
        part: The part, as the plan says it.
        envelope: Its result envelope (``output``, ``rung``, ``attempts``, ``artifacts`` ...).
    """

    part: Part
    envelope: dict[str, Any]


def collect(backend: Any, job_id: str, *, timeout: float = 30.0, poll: float = 0.2,
            on_wait: Callable[[Part], Any] | None = None) -> list[Collected]:  # fmt: skip
    """Every part's result envelope, in plan order: called by the fan-in job (``ctx.collect()``).

    The chord runs the fan-in job only once every part stored its final state, so normally
    nothing waits. Should a part still be running (a fan-in job sent by hand), it is waited for up
    to ``timeout`` seconds, then the job fails naming it.

    Raises:
        PermanentFailure: No plan is stored for ``job_id``; a part failed; a part did not finish.
    """
    plan = read_plan(backend, job_id)
    if plan is None:
        raise PermanentFailure(
            f"no pipeline plan is stored for job {job_id} (expired, or the job was sent without its parts: "
            "submit it with mediafarm.submit, which stores the plan and sends the parts)"
        )
    deadline = time.monotonic() + timeout
    stored = metas(backend, [p.job_id for p in plan.parts])
    while True:
        waiting = [i for i, m in enumerate(stored) if state_of(m) not in READY]
        failed = [plan.parts[i] for i, m in enumerate(stored) if state_of(m) in READY and state_of(m) != "SUCCESS"]
        if failed:
            names = ", ".join(f"{p.label} ({p.job_id}): {state_of(stored[plan.parts.index(p)])}" for p in failed)
            raise PermanentFailure(f"{len(failed)} of {len(plan.parts)} {plan.parts_stage} failed: {names}")
        if not waiting:
            # Each part stored by this release or the one before: read in this release's names.
            return [Collected(p, envelope_in_current_names(m["result"]))
                    for p, m in zip(plan.parts, stored, strict=True) if m]  # fmt: skip
        if time.monotonic() > deadline:
            part, meta = plan.parts[waiting[0]], stored[waiting[0]]
            raise PermanentFailure(
                f"{part.label} ({part.job_id}) has not finished after {timeout:g} s (state {state_of(meta)})"
            )
        if on_wait is not None:
            on_wait(plan.parts[waiting[0]])
        time.sleep(poll)
        fresh = metas(backend, [plan.parts[i].job_id for i in waiting])
        for i, meta in zip(waiting, fresh, strict=True):
            stored[i] = meta
