"""What each live worker can run: the capability record, how it is judged, written and read.

A worker judges, for each family whose queues its pool names, every rung of every ladder of that
family with the rung's own check (``EngineSpec.unavailable``: the engine's packages installed, a
GPU for a ``cuda`` rung, the weights in ``FARM_MODELS_DIR``), leaves out the queues of a family of
which it can run no rung, and publishes the lot in the broker's Redis (``keys.capabilities``) every
few seconds (``workers.capability``), so that a weights folder added or a package removed shows
within one beat, and a dead worker's record lapses :data:`STALE_S` after its last write. Readers
(``farm pools``, the gateway's ``/v1/models``, a job that reached a worker that cannot run it)
take the cluster's capability from the live records, never from the declared ladders.

The record keeps rungs by family, ladder and rung name, as the operator declares them, with the
reason a rung cannot run here (empty: it runs); routing by capability (a queue per family and
capability) can be built on the same record.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mediafarm.config.ladders import Ladder, Rung
from mediafarm.config.pools import POOL_QUEUE_SEP
from mediafarm.tasks.wire import keys, timed_records
from mediafarm.tasks.wire.family import EngineSpec, FamilySpec
from mediafarm.tasks.wire.languages import languages_or_any

# A worker writes its record this often; a record not rewritten for STALE_S is a dead worker's.
INTERVAL_S = 5.0
STALE_S = 3 * INTERVAL_S
# A field this old is removed by the next writer (a worker killed without its stop step).
FORGET_AFTER_S = 3600
# How long a pool with no live worker is still known by its last worker's record (``known_pools``).
POOL_MEMORY_S = 7 * 24 * 3600
_GPU_QUEUE = re.compile(r"^gpu\d+\.")

# Family -> ladder -> rung -> why the rung cannot run ('' : it runs).
Rungs = Mapping[str, Mapping[str, Mapping[str, str]]]
# Family -> ladder -> rung -> the languages it handles here, for the rungs that declare some.
RungLanguages = Mapping[str, Mapping[str, Mapping[str, tuple[str, ...]]]]


@dataclass(frozen=True)
class WorkerCapability:
    """One worker's record.

    Attributes:
        node: The worker's node name (``cpu@host``).
        pool: Its pool.
        queues: The queues it consumes.
        left_out: Queue -> why the worker does not consume it (a family of which it can run no rung).
        served: The families whose jobs reach it: one of its queues is the family's own or a
            GPU-affinity queue of it (``gpu<N>.<queue>``).
        rungs: Family -> ladder -> rung -> why the rung cannot run on this worker, '' if it can; the
            families whose queues the pool names (consumed or left out).
        at: The Redis server's time of the write (readers compare it with the server's clock,
            so hosts' clocks do not matter); 0 before it is written.
        languages: Family -> ladder -> rung -> the languages (normalised codes) the rung handles
            on this worker, as its engine tells from this worker's models (``tasks.wire.languages``: a
            multilingual Whisper folder, a Piper voice, espeak-ng's voice list); a rung absent
            handles any language.
    """

    node: str
    pool: str
    queues: tuple[str, ...]
    left_out: Mapping[str, str] = field(default_factory=dict)
    served: tuple[str, ...] = ()
    rungs: Rungs = field(default_factory=dict)
    at: float = 0.0
    languages: RungLanguages = field(default_factory=dict)

    def runnable(self, family: str) -> dict[str, tuple[str, ...]]:
        """Ladder -> the rungs of it this worker can run, for a family whose queue it consumes
        (empty if it consumes none of the family's queues)."""
        if not self.serves(family):
            return {}
        ladders = self.rungs.get(family, {})
        return {name: tuple(r for r, why in rungs.items() if not why) for name, rungs in ladders.items()}

    def can_run(self, family: str, ladder: str, rung: str) -> bool:
        return rung in self.runnable(family).get(ladder, ())

    def handles(self, family: str, ladder: str, rung: str, language: str | None) -> bool:
        """Can the rung take a job in ``language`` (normalised; None: not known) on this worker?"""
        spoken = self.languages.get(family, {}).get(ladder, {}).get(rung)
        return language is None or spoken is None or language in spoken

    def serves(self, family: str) -> bool:
        """Does it consume a queue of the family (its own, or a GPU-affinity one)?"""
        return family in self.served

    def to_json(self) -> str:
        return json.dumps({"node": self.node, "pool": self.pool, "queues": list(self.queues),
                           "left_out": dict(self.left_out), "served": list(self.served), "rungs": self.rungs,
                           "at": self.at, "languages": self.languages})  # fmt: skip

    @classmethod
    def from_json(cls, raw: bytes | str) -> WorkerCapability:
        data = json.loads(raw)
        rungs = {f: {lad: {r: str(w) for r, w in rs.items()} for lad, rs in ls.items()}
                 for f, ls in dict(data.get("rungs") or {}).items()}  # fmt: skip
        languages = {f: {lad: {r: tuple(str(c) for c in codes) for r, codes in rs.items() if codes is not None}
                         for lad, rs in ls.items()}
                     for f, ls in dict(data.get("languages") or {}).items()}  # fmt: skip
        return cls(str(data["node"]), str(data["pool"]), tuple(data.get("queues") or ()),
                   dict(data.get("left_out") or {}), tuple(data.get("served") or ()), rungs,
                   float(data.get("at") or 0), languages)  # fmt: skip


def family_of_queue(queue: str, family_queues: Mapping[str, str]) -> str | None:
    """The family whose jobs ``queue`` carries (``family_queues``: family -> its queue): its own
    queue, ``gpu<N>.<queue>`` or a pool's ``<queue>@<pool>``; None for a queue of no family (an
    operator's own, whose jobs may be of any family)."""
    own = _GPU_QUEUE.sub("", queue).split(POOL_QUEUE_SEP, 1)[0]
    return next((family for family, q in family_queues.items() if q == own), None)


def served_families(queues: Iterable[str], family_queues: Mapping[str, str]) -> tuple[str, ...]:
    """The families whose queues are among ``queues``, in registry order."""
    found = {family_of_queue(q, family_queues) for q in queues}
    return tuple(f for f in family_queues if f in found)


def judge_rungs(
    specs: Iterable[FamilySpec], ladders_of: Any, models_dir: Path | None, gpu_lost: str | None = None
) -> dict[str, dict[str, dict[str, str]]]:
    """Family -> ladder -> rung -> why this process cannot run it ('' if it can), by each engine's
    own check. ``ladders_of``: a family's spec -> every ladder of it (``registry.ladders_of``).
    ``gpu_lost``: why the worker's GPU cannot be used now (``workers.nvml.lost_gpu``), the reason
    of every ``cuda`` rung then; None: as the start's device check found."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    missing: dict[tuple[str, ...], str | None] = {}  # packages looked up once per judgment: find_spec scans sys.path

    def why_not(engine: EngineSpec, rung: Rung) -> str:
        if engine.needs not in missing:
            missing[engine.needs] = engine.missing()
        if not missing[engine.needs] and gpu_lost and rung.device == "cuda":
            return gpu_lost
        return missing[engine.needs] or engine.unavailable(rung, models_dir, packages_checked=True) or ""

    for spec in specs:
        ladders: list[Ladder] = ladders_of(spec)
        out[spec.name] = {
            ladder.name: {r.name: why_not(spec.engines[r.engine], r) for r in ladder.rungs} for ladder in ladders
        }
    return out


def judge_languages(
    specs: Iterable[FamilySpec], ladders_of: Any, models_dir: Path | None
) -> dict[str, dict[str, dict[str, tuple[str, ...]]]]:
    """Family -> ladder -> rung -> the languages it handles with this process's models, for each
    rung that declares some (``tasks.wire.languages.rung_languages``; a rung whose hook fails is left
    out: any language, as the worker's own check treats it; so is one whose languages the job's
    request adds to, ``EngineSpec.languages_by_request``)."""
    out: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {}
    for spec in specs:
        for ladder in ladders_of(spec):
            for rung in ladder.rungs:
                if rung.languages is None and spec.engines[rung.engine].languages_by_request:
                    continue
                spoken = languages_or_any(spec, rung, models_dir, None)
                if spoken is not None:
                    out.setdefault(spec.name, {}).setdefault(ladder.name, {})[rung.name] = tuple(sorted(spoken))
    return out


def why_none_runs(ladders: Mapping[str, Mapping[str, str]]) -> str | None:
    """Why no rung of a family runs here (its rungs' distinct reasons), or None if one does."""
    reasons = [why for rungs in ladders.values() for why in rungs.values()]
    if not reasons or not all(reasons):
        return None
    return "no rung runnable: " + "; ".join(dict.fromkeys(reasons))


def left_out_queues(queues: Sequence[str], rungs: Rungs, family_queues: Mapping[str, str]) -> dict[str, str]:
    """Queue -> why a worker that can run ``rungs`` leaves it out: each queue of a family of which
    it can run no rung. A queue of no family is kept: its jobs may be of any family, and a job that
    reaches a worker that cannot run it goes back to be routed again (``tasks.runtime.reroute``)."""
    out = {}
    for queue in queues:
        family = family_of_queue(queue, family_queues)
        why = why_none_runs(rungs.get(family, {})) if family is not None else None
        if why:
            out[queue] = f"{family}: {why}"
    return out


def advertise(client: Any, record: WorkerCapability, *, remember: bool = True) -> float:
    """Write ``record`` (its time the Redis server's now) and, with ``remember``, keep it among
    its pool's known records (:func:`known_pools`): not while the worker is degraded for a while
    only (its GPU lost), which would make its pool look unable for a week; the time written."""
    if remember:
        timed_records.write(client, keys.pool_capabilities(), record.node, record.to_json(), POOL_MEMORY_S)
    return timed_records.write(client, keys.capabilities(), record.node, record.to_json(), FORGET_AFTER_S)


def forget(client: Any, node: str) -> None:
    """Remove a worker's record (it stops: what it could run is gone with it)."""
    client.hdel(keys.capabilities(), node)


def live(client: Any) -> list[WorkerCapability]:
    """The records of the workers that wrote within :data:`STALE_S` (by the Redis server's clock),
    by node name; unreadable ones left out."""
    return timed_records.live(client, keys.capabilities(), WorkerCapability.from_json, STALE_S)


def known_pools(client: Any) -> dict[str, WorkerCapability]:
    """Pool -> what its workers could run when they were last live (within :data:`POOL_MEMORY_S`),
    merged (:func:`merged`): what a pool runs while none of its workers is live, a pool scaled to
    zero among them. A stopped worker removes its live record (:func:`forget`), not this one."""
    known = timed_records.live(client, keys.pool_capabilities(), WorkerCapability.from_json, POOL_MEMORY_S)
    pools: dict[str, list[WorkerCapability]] = {}
    for record in known:
        pools.setdefault(record.pool, []).append(record)
    return {pool: merged(pool, records) for pool, records in pools.items()}


def merged(pool: str, records: Sequence[WorkerCapability]) -> WorkerCapability:
    """One record for a pool's workers (``<pool>@known``): the pool counts as able to run what any
    of them can, as routing counts a live pool (a worker without a model folder does not make its
    pool unable). Queues and families: all of theirs; a rung: runnable where one worker runs it
    (else the first reason); its languages: all of theirs, or any where one worker records none."""
    queues = tuple(dict.fromkeys(q for r in records for q in r.queues))
    served = tuple(dict.fromkeys(f for r in records for f in r.served))
    rungs: dict[str, dict[str, dict[str, str]]] = {}
    spoken: dict[tuple[str, str, str], set[str] | None] = {}
    for record in records:
        for family, ladders in record.rungs.items():
            for ladder, reasons in ladders.items():
                mine = rungs.setdefault(family, {}).setdefault(ladder, {})
                for rung, why in reasons.items():
                    mine[rung] = "" if not why or mine.get(rung) == "" else mine.get(rung) or why
                    codes = record.languages.get(family, {}).get(ladder, {}).get(rung)
                    key = (family, ladder, rung)
                    if codes is None or spoken.get(key, set()) is None:
                        spoken[key] = None
                    else:
                        spoken[key] = {*spoken.get(key, set()), *codes}
    languages: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {}
    for (family, ladder, rung), codes in spoken.items():
        if codes is not None:
            languages.setdefault(family, {}).setdefault(ladder, {})[rung] = tuple(sorted(codes))
    return WorkerCapability(f"{pool}@known", pool, queues, {}, served, rungs, max(r.at for r in records), languages)


def can_run_any(
    records: Iterable[WorkerCapability], family: str, ladder: str, rungs: Iterable[str]
) -> list[WorkerCapability]:
    """The workers of ``records`` that consume a queue of ``family`` and can run one of ``rungs``
    of its ladder ``ladder``."""
    wanted = tuple(rungs)
    return [r for r in records if any(r.can_run(family, ladder, name) for name in wanted)]
