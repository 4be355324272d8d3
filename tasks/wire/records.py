"""Typed records for everything the farm writes to Redis, and their JSON forms.

Writers and readers share these types: the watchdog writes a :class:`KillRecord` that the
downgrade policy reads, the worker writes :class:`Attempt`, :class:`Progress` and the
:class:`Envelope` that the client reads. JSON is explicit (``to_json``/``from_json``) so that
the wire form is visible here and a record from an older or newer farm still loads: unknown keys
are ignored, missing ones take their defaults.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from mediafarm.tasks.wire.trace import Trace

HOST = socket.gethostname()


class Outcome(StrEnum):
    """How one attempt ended."""

    OK = "ok"
    # Resource failures: the job moves one rung down.
    KILLED = "killed"
    OOM = "oom"
    CUDA_OOM = "cuda_oom"
    TIMEOUT = "timeout"
    # The rung cannot run on this pool (package, weights or GPU missing): skipped, no attempt spent.
    UNAVAILABLE = "unavailable"
    # Not tried now, by the farm's choice: the rung's breaker is open on this pool, or the pool is
    # under memory pressure and the ladder steps down (``tasks.runtime.breaker``). Next rung, no attempt spent.
    SKIPPED = "skipped"
    # Terminal: bad input, a bug, or the producer cancelled it.
    REJECTED = "rejected"
    ERROR = "error"
    CANCELLED = "cancelled"
    # Nobody's fault: the same rung runs again, a bounded number of times.
    TRANSIENT = "transient"
    WORKER_LOST = "worker_lost"
    # The watchdog killed a child silent past its family's stall timeout (``tasks.runtime.liveness``): the
    # same rung runs once more; a second stall on that rung moves the job down (``tasks.runtime.downgrade``).
    STALLED = "stalled"
    # Not run: no rung it had left runs on this worker, and the job was sent back to be routed to
    # one that can (``tasks.runtime.reroute``). No rung spent.
    REROUTED = "rerouted"
    # Not run here: the rung it is to run next is another pool's best (or this pool cannot run
    # it), and the job was sent to that pool's queue, this slot freed (``tasks.producer.routing``). No rung spent.
    MOVED = "moved"

    @property
    def moves_down(self) -> bool:
        """Does this outcome cost the job its rung?"""
        return self in _MOVES_DOWN

    @classmethod
    def read(cls, value: Any) -> Outcome:
        """An outcome as stored; one this farm does not know (a newer farm's) reads as ``error``,
        which neither moves the job down nor runs its rung again."""
        try:
            return cls(value)
        except ValueError:
            return cls.ERROR


RESOURCE_OUTCOMES = frozenset({Outcome.KILLED, Outcome.OOM, Outcome.CUDA_OOM, Outcome.TIMEOUT})
_MOVES_DOWN = RESOURCE_OUTCOMES | {Outcome.UNAVAILABLE, Outcome.SKIPPED}


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


# The wire's names for a rung, version 2 (this release): ``rung`` is the rung's name and
# ``rung_index`` its place in the ladder. Version 1 had ``rung`` for the index and ``variant`` for
# the name. Records of either version load; this release still writes ``variant`` (the name) beside
# them, for readers of version 1 that read only the name (docs/operating.md, "Upgrading").


def rung_of(data: Mapping[str, Any]) -> tuple[str, int]:
    """The rung a stored attempt, progress or envelope names: (name, index), in either version.
    A record is of version 2 when it has ``rung_index`` (every writer of this release writes it)."""
    if "rung_index" in data:
        return str(data.get("rung") or data.get("variant") or ""), _index(data["rung_index"])
    return str(data.get("variant") or ""), _index(data.get("rung"))


def _index(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: JSON's Infinity
        return 0


def in_current_names(data: dict[str, Any]) -> dict[str, Any]:
    """A stored attempt, progress or envelope dict with this release's rung names (``rung``,
    ``rung_index``, and ``variant`` as written for one release): what every reader of raw records
    sees, whichever release wrote them. Already current (and well typed): the same dict."""
    index, name = data.get("rung_index"), data.get("rung")
    if type(index) is int and isinstance(name, str) and data.get("variant") == name:
        return data
    name, index = rung_of(data)
    return {**data, "rung": name, "rung_index": index, "variant": name}


def rung_named(data: Any) -> Any:
    """A family result's record of a rung (a pydantic model's input, before validation) with its
    ``rung`` filled from ``variant`` where the release before wrote only that, and the attempts it
    lists, if any, in this release's names."""
    if not isinstance(data, dict):
        return data
    if "rung" not in data and "variant" in data:
        data = {**data, "rung": data["variant"]}
    if isinstance(data.get("attempts"), list):
        data = {**data, "attempts": attempts_in_current_names(data["attempts"])}
    return data


def attempts_in_current_names(attempts: Any) -> Any:
    """A list of stored attempts with this release's rung names (an entry that is not a dict, and
    anything but a list, as it is)."""
    if not isinstance(attempts, list):
        return attempts
    return [in_current_names(a) if isinstance(a, dict) else a for a in attempts]


def envelope_in_current_names(envelope: dict[str, Any]) -> dict[str, Any]:
    """A stored result envelope with this release's rung names, its attempts' too (anything but a
    dict, as it is)."""
    if not isinstance(envelope, dict):
        return envelope
    current = in_current_names(envelope)
    attempts = envelope.get("attempts")
    if not isinstance(attempts, list):
        return current
    listed = attempts_in_current_names(attempts)
    if current is envelope and all(a is b for a, b in zip(listed, attempts, strict=True)):
        return envelope  # all of it current already: the very same dict
    return {**current, "attempts": listed}


@dataclass
class Attempt:
    """One run (or skip) of one rung.

    Attributes:
        rung_index: The rung's place in the ladder.
        rung: The rung's name.
        outcome: How it ended; None while it runs.
        reason: Why it ended that way, in words an operator can act on.
        retries: Celery's ``request.retries`` when it started; tells a retry from a redelivery.
        started: Unix time.
        duration: Seconds, None for an attempt cut short.
        peak_rss_mb: The child's peak RSS during this attempt (for a killed one, what the
            watchdog saw).
        host: Machine name.
        worker: Celery node name.
        pid: Child process id.
        oom_counts: The kernel's OOM-kill count as the attempt began (its memory cgroup's, or the
            whole kernel's where it is in none that counts; ``tasks.runtime.oom_killer.snapshot``), so that
            a child lost without a watchdog record is told apart: OOM killer or an outside kill.
            None: unreadable here.
        resumed_from: The checkpoint this attempt went on from (``tasks.wire.checkpoint``): its
            position and unit, the rung that wrote it, and which rung made which part so far.
            None: it started from the beginning.
        checkpoint_ignored: Why a checkpoint the job had was not resumed from (another
            request's, corrupt, refused by the family for this rung); empty if none was.
        counted: Whether this failure counted against the rung's breaker (``tasks.runtime.attribution``):
            True only for what the rung itself caused. None: nothing to judge (it succeeded, was
            skipped, rejected ...) or a record from before this was kept.
        cause: Why it counted or not, as the attribution table names it (``watchdog_cap``,
            ``kernel_oom``, ``outside_kill`` ...); empty where ``counted`` is None.
        route: Why the job was sent to the queue it first ran from (``tasks.producer.routing.choose``):
            kept in the job's first attempt only; empty if it was not routed (a queue named by its
            producer, a farm with no live capability records).
    """

    rung_index: int
    rung: str
    outcome: Outcome | None = None
    reason: str = ""
    retries: int = 0
    started: float = field(default_factory=time.time)
    duration: float | None = None
    peak_rss_mb: float | None = None
    host: str = HOST
    worker: str = ""
    pid: int = field(default_factory=os.getpid)
    oom_counts: dict[str, Any] | None = None
    resumed_from: dict[str, Any] | None = None
    checkpoint_ignored: str = ""
    counted: bool | None = None
    cause: str = ""
    route: str = ""

    def __post_init__(self) -> None:
        if self.outcome is not None:
            self.outcome = Outcome.read(self.outcome)

    def to_json(self) -> dict[str, Any]:
        # Flat fields only, so a shallow copy is the JSON form (dataclasses.asdict deep-copies, 10x slower).
        data = dict(self.__dict__)
        data["variant"] = self.rung  # version 1's name of the rung, written for one release
        if self.outcome is not None:
            data["outcome"] = self.outcome.value
        # Only attempts that met a checkpoint say so: every other record stays as it was.
        if self.resumed_from is None:
            del data["resumed_from"]
        if not self.checkpoint_ignored:
            del data["checkpoint_ignored"]
        if self.counted is None:  # only failures the breaker judged say whether they counted
            del data["counted"], data["cause"]
        if not self.route:  # only a routed job's first attempt says why it went where it did
            del data["route"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attempt:
        return cls(**_known(cls, in_current_names(data)))


@dataclass(frozen=True)
class KillRecord:
    """Why the watchdog killed a child, written by the worker's main process before the SIGKILL.

    Attributes:
        pid: The child killed.
        worker: Its worker's node name (pids repeat across hosts and containers).
        at: Unix time of the decision.
        outcome: ``killed`` (over the RSS cap), ``timeout`` (past the hard time limit) or
            ``stalled`` (silent past the stall timeout).
        reason: The watchdog's words.
        rss_mb: The child's RSS when it was killed.
        cap_mb: The pool's cap, if any.
    """

    pid: int
    worker: str
    at: float
    outcome: Outcome = Outcome.KILLED
    reason: str = "killed by the watchdog"
    rss_mb: float | None = None
    cap_mb: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome.read(self.outcome))

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "outcome": self.outcome.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KillRecord:
        return cls(**_known(cls, data))

    def is_about(self, attempt: Attempt) -> bool:
        """Is this record about ``attempt``? Same child, same worker, killed after it started."""
        return self.pid == attempt.pid and self.worker == attempt.worker and self.at >= attempt.started


@dataclass(frozen=True)
class Progress:
    """The running attempt's latest progress, as an engine reported it.

    Attributes:
        fraction: 0..1 of the work, None when the engine cannot tell.
        stage: What it is doing (``decode``, ``synthesize chunk 3/9`` ...).
        media_seconds: Seconds of the input done, for media jobs.
        attempt: Index of the attempt in the history.
        rung_index: The attempt's rung, its place in the ladder.
        rung: The rung's name.
        updated: Unix time of the report.
    """

    fraction: float | None = None
    stage: str = ""
    media_seconds: float | None = None
    attempt: int = 0
    rung_index: int = 0
    rung: str = ""
    updated: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "variant": self.rung}  # version 1's name, written for one release

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Progress:
        return cls(**_known(cls, in_current_names(data)))


@dataclass(frozen=True)
class ArtifactInfo:
    """One file a job produced, under ``<FARM_STORAGE_DIR>/<job id>/``.

    Attributes:
        name: Path relative to the job's folder (``audio.wav``, ``chunks/0003.wav``).
        size: Bytes.
        media_type: MIME type guessed from the name (``application/octet-stream`` when unknown).
        sha256: Hex digest, checked again by ``JobHandle.download``.
        path: Where the worker wrote it: the absolute path on the worker's machine, under the
            worker's FARM_STORAGE_DIR (so a producer that cannot find it can say where to look).
            None in envelopes stored before it was recorded.
        url: ``s3://bucket/key`` of the object the attempt copied it to when the farm keeps
            artifacts in an object store (FARM_STORAGE_URL, ``tasks.wire.object_store``): readers
            read that, and need no folder shared with the worker. None with a storage folder.
    """

    name: str
    size: int
    media_type: str
    sha256: str
    path: str | None = None
    url: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArtifactInfo:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class Envelope:
    """What a successful job returns: its output, the rung that made it, and how it got there.

    Attributes:
        job_id: The Celery task id, the same on every rung.
        family: The job family (``vad``).
        rung: Name of the rung that produced the output.
        rung_index: Its place in the ladder.
        output: The family's result, as JSON.
        attempts: Every attempt, oldest first.
        artifacts: Files the job wrote, if any.
        trace: The worker's side of the successful delivery's trace (``tasks.wire.trace``): from
            the send (or from the delivery's start, after a retry) to the attempt's record.
    """

    job_id: str
    family: str
    rung: str
    rung_index: int
    output: dict[str, Any]
    attempts: tuple[Attempt, ...] = ()
    artifacts: tuple[ArtifactInfo, ...] = ()
    trace: Trace | None = None

    def to_json(self) -> dict[str, Any]:
        data = {
            "job_id": self.job_id,
            "family": self.family,
            "rung": self.rung,
            "rung_index": self.rung_index,
            "variant": self.rung,  # version 1's name of the rung, written for one release
            "output": self.output,
            "attempts": [a.to_json() for a in self.attempts],
            "artifacts": [a.to_json() for a in self.artifacts],
        }
        if self.trace is not None:  # a reader that does not know the key passes it by
            data["trace"] = self.trace.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Envelope:
        rung, rung_index = rung_of(data)
        return cls(
            job_id=data["job_id"],
            family=data["family"],
            rung=rung,
            rung_index=rung_index,
            output=data.get("output") or {},
            attempts=tuple(Attempt.from_json(a) for a in data.get("attempts", [])),
            artifacts=tuple(ArtifactInfo.from_json(a) for a in data.get("artifacts", [])),
            trace=Trace.from_json(data["trace"]) if isinstance(data.get("trace"), dict) else None,
        )
