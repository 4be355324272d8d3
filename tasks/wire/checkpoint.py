"""Checkpoints: how far a long job got, so that its next attempt continues instead of starting over.

A family that resumes declares it (``FamilySpec.resume``, a :class:`Resume`). Its engine then
records, at most every ``FARM_CHECKPOINT_INTERVAL`` seconds, how far into the media or text it is
and its output up to there (:meth:`EngineContext.checkpoint`): a small JSON state, and artifact
files it has finished (chunks, segments) kept beside it. When the same job runs again (its child
was killed, a worker died, the job moved down its ladder), the farm hands the engine the last
checkpoint (``ctx.resume``) with those files back in the job's folder, and the engine continues
from there. The attempt history says what each attempt resumed from (``resumed_from``: position,
unit, and which rung made which part so far) or why a checkpoint was ignored
(``checkpoint_ignored``).

Where and how it is written: ``<job folder>/.checkpoint/``, hidden, so it is no artifact of the
job and survives :meth:`ArtifactStore.clear` between attempts. Kept files are hard links of the
finished artifacts (no copy; an artifact is only ever replaced by a rename, so a link keeps the
content it had), stored under names that include their inode. The manifest ``checkpoint.json`` is
written last, atomically (a temporary file, fsynced, renamed over the old one): a child killed at
any moment of a write leaves the previous checkpoint whole. Links the new manifest no longer
names are removed after it is in place.

When a checkpoint is ignored (the job restarts from the beginning, and says so):

* it was made for another request: the job id was reused with other fields (the manifest holds a
  fingerprint of the family and the request's fields);
* it is unreadable or names files that are gone or changed (a disk fault, a hand edit);
* the family refuses it for the rung about to run (``Resume.refuses``: the TTS voice of another
  rung would not be the same speaker's).

Across hosts (FARM_STORAGE_URL, ``tasks.wire.object_store``): each checkpoint is also copied to
the object store (:class:`RemoteCheckpoint`), its kept files by their sha256 first, the manifest
last, so a stored manifest names only files already there. An attempt that finds no checkpoint
in its own folder (its job was redelivered from a host that died, disk and all) takes the stored
one. A store that fails costs the copy, not the attempt: the local checkpoint is kept, and the
store is not tried again for :data:`REMOTE_BACKOFF_S` seconds, so an engine is never held up
at each checkpoint while the store is away.

Retention: the folder goes when the job ends for good (success, rejection, cancel, an exhausted
ladder), and with the job's folder in ``farm gc``; so does the stored copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mediafarm.config.storage_url import S3Place
from mediafarm.tasks.wire.artifacts import CHECKPOINT_FOLDER as FOLDER
from mediafarm.tasks.wire.artifacts import PARTIAL_MARK, ArtifactStore, folder_name, sha256_of, sync_file
from mediafarm.tasks.wire.object_store import ObjectMissing, ObjectStore, StoreUnavailable

MANIFEST = "checkpoint.json"
FILES = "files"
# The manifest's own format; an engine's state carries its own version if it needs one.
FORMAT = 1
UNITS = ("seconds", "characters")
# Seconds a checkpoint is not copied to an object store after a copy failed.
REMOTE_BACKOFF_S = 30.0

log = logging.getLogger(__name__)


class UnusableCheckpoint(Exception):
    """A checkpoint that cannot be resumed from (another request's, unreadable, files gone)."""


def fingerprint(family: str, fields: Mapping[str, Any]) -> str:
    """Identifies the request a checkpoint was made for: the family and every field of the job."""
    text = json.dumps({"family": family, "fields": dict(fields)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Made:
    """One stretch of the output, [start, end) in the family's unit, and the rung that made it: the
    farm's one record of who made what, in checkpoints and in the results that list it (VAD's,
    subtitle's ``made``; YOLO's adds the model)."""

    start: float
    end: float
    rung: str

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "rung": self.rung}


@dataclass(frozen=True)
class Checkpoint:
    """The last checkpoint of a job, as the next attempt is handed it (``ctx.resume``).

    Attributes:
        position: How far the output goes, in ``unit`` (media seconds, characters of text).
        unit: ``seconds`` or ``characters``, as the family declares.
        rung: The rung whose attempt wrote it.
        state: The engine's own JSON state (what it needs to go on: spans so far, cue rules ...).
        files: Artifact names kept with it; they are back in the job's folder when the engine runs.
        made: Which rung made which stretch of the output, from the start to ``position``.
        written: Unix time of the write.
        kept: Artifact name -> the name its file is kept under in the checkpoint folder, as the
            manifest this checkpoint was loaded from says (the one :meth:`CheckpointStore.restore`
            puts back: another worker may have written a newer manifest since).
    """

    position: float
    unit: str
    rung: str
    state: Mapping[str, Any]
    files: tuple[str, ...] = ()
    made: tuple[Made, ...] = ()
    written: float = 0.0
    kept: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def record(self) -> dict[str, Any]:
        """What the attempt history says the attempt resumed from."""
        return {"position": self.position, "unit": self.unit, "rung": self.rung,
                "made": [m.to_json() for m in self.made]}  # fmt: skip


@dataclass(frozen=True)
class Resume:
    """How a family's jobs resume (``FamilySpec.resume``; None: every attempt starts over).

    Attributes:
        unit: What a position counts: ``seconds`` of media or ``characters`` of text.
        rule: One line for ``farm families`` and the docs: from where, and across which rungs.
        across_rungs: Whether a checkpoint made on one rung is resumed on another (the next one
            down). False: only an attempt on the rung that made it resumes.
        refuses: The family's own say, given the checkpoint and the name of the rung about to
            run: why that rung cannot go on from it (None: it can). Called in the pool child
            before the attempt is recorded; keep it cheap and import nothing heavy.
    """

    unit: str
    rule: str
    across_rungs: bool = True
    refuses: Callable[[Checkpoint, str], str | None] | None = None

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"resume unit must be one of {UNITS}, not {self.unit!r}")

    def why_not(self, checkpoint: Checkpoint, rung: str) -> str | None:
        """Why the attempt on ``rung`` does not resume from ``checkpoint``; None if it does."""
        if checkpoint.unit != self.unit:
            return f"checkpoint counts {checkpoint.unit}, the family counts {self.unit}"
        if not self.across_rungs and checkpoint.rung != rung:
            return f"made on rung {checkpoint.rung}, and this family resumes on the same rung only"
        return self.refuses(checkpoint, rung) if self.refuses is not None else None


class CheckpointStore:
    """The checkpoint folder of one job: load, save, restore the kept files, remove; each also in
    the object store when the job has a ``remote`` copy there."""

    def __init__(self, artifacts: ArtifactStore, fingerprint: str, remote: RemoteCheckpoint | None = None) -> None:
        self.artifacts, self.fingerprint, self.remote = artifacts, fingerprint, remote
        self.folder = artifacts.folder / FOLDER
        self._kept: set[str] = set()  # stored names this store's own manifests named

    def load(self) -> Checkpoint | None:
        """The last checkpoint, or None if there is none.

        Raises:
            UnusableCheckpoint: it is another request's, unreadable, or its files are gone.
        """
        path = self.folder / MANIFEST
        if self.remote is not None and not path.exists():
            self.remote.pull(self.folder)  # another host's, if it kept one there
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UnusableCheckpoint(f"cannot read {MANIFEST}: {exc}") from None
        try:
            data = json.loads(raw)
            if data.get("format") != FORMAT:
                raise UnusableCheckpoint(f"format {data.get('format')!r}, this farm reads {FORMAT}")
            if data.get("fingerprint") != self.fingerprint:
                raise UnusableCheckpoint("it was made for another request under the same job id")
            files = data["files"]
            checkpoint = Checkpoint(
                position=float(data["position"]), unit=str(data["unit"]), rung=str(data["rung"]),
                state=dict(data["state"]), files=tuple(files),
                made=tuple(Made(float(m["start"]), float(m["end"]), str(m["rung"])) for m in data["made"]),
                written=float(data["written"]),
                kept={str(name): str(kept["stored"]) for name, kept in files.items()},
            )  # fmt: skip
        except UnusableCheckpoint:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UnusableCheckpoint(f"{MANIFEST} is corrupt: {type(exc).__name__}: {exc}") from None
        for name, kept in files.items():
            stored = self.folder / FILES / str(kept.get("stored", ""))
            try:
                size = stored.stat().st_size
            except OSError:
                raise UnusableCheckpoint(f"its file {name!r} is gone") from None
            if size != kept.get("size"):
                raise UnusableCheckpoint(f"its file {name!r} has {size} bytes, the checkpoint says {kept.get('size')}")
        # The attempt that loads it takes it over: its next write may drop what this one kept.
        self._kept = set(checkpoint.kept.values())
        return checkpoint

    def save(self, checkpoint: Checkpoint) -> None:
        """Write ``checkpoint``, keeping its files (artifact names, finished) by hard links; the
        previous checkpoint stays whole until the new manifest replaces it."""
        files_folder = self.folder / FILES
        self.artifacts.ensure_folder()
        files_folder.mkdir(parents=True, exist_ok=True)
        kept: dict[str, dict[str, Any]] = {}
        for name in checkpoint.files:
            source = self.artifacts.path(name)
            status = source.stat()
            stored = f"{status.st_ino}-{status.st_size}"
            target = files_folder / stored
            if not target.exists():
                _link_or_copy(source, target)
                if not _same_file(target, status):
                    # Replaced between the look and the link (another attempt of a redelivered job
                    # writing the same name): the kept file is not the one its name says.
                    target.unlink(missing_ok=True)
                    raise OSError(f"artifact {name!r} was replaced while it was being kept; checkpoint not written")
                # On disk before the manifest names it: partial outputs are written unsynced
                # (ArtifactStore.writing, durable=False).
                sync_file(target)
            kept[name] = {"stored": stored, "size": status.st_size}
            if self.remote is not None:
                kept[name]["sha256"] = self.remote.digest(target, stored)
        manifest = {
            "format": FORMAT, "fingerprint": self.fingerprint, "position": checkpoint.position,
            "unit": checkpoint.unit, "rung": checkpoint.rung, "state": dict(checkpoint.state), "files": kept,
            "made": [m.to_json() for m in checkpoint.made], "written": checkpoint.written or time.time(),
        }  # fmt: skip
        # Unique per writer: workers on other hosts sharing this storage may have the same pid.
        temp = self.folder / f".{MANIFEST}{PARTIAL_MARK}{uuid.uuid4().hex}"
        with temp.open("w", encoding="utf-8") as fh:
            json.dump(manifest, fh, separators=(",", ":"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, self.folder / MANIFEST)
        if self.remote is not None:
            self.remote.push(manifest, files_folder)
        # Only what this store kept for its own earlier manifests and no longer needs goes: a file
        # in the folder it did not keep may be another attempt's (a redelivered job running twice
        # for a while), and its manifest must keep finding it.
        wanted = {k["stored"] for k in kept.values()}
        for stale in self._kept - wanted:
            (files_folder / stale).unlink(missing_ok=True)
        self._kept = wanted

    def restore(self, checkpoint: Checkpoint) -> None:
        """Put the checkpoint's kept files back in the job's folder under their artifact names.

        The files are the ones the manifest it was loaded from names, not whatever manifest is
        there now: a redelivered job's other attempt may have written a newer one meanwhile, whose
        files belong to another position (putting those back would repeat or lose output).

        Raises:
            UnusableCheckpoint: a file is not in the checkpoint (it was not loaded), or is gone.
        """
        for name in checkpoint.files:
            stored = checkpoint.kept.get(name)
            if stored is None:
                raise UnusableCheckpoint(f"it does not say where its file {name!r} is kept")
            target = self.artifacts.path(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            try:
                _link_or_copy(self.folder / FILES / stored, target)
            except FileNotFoundError:
                raise UnusableCheckpoint(f"its file {name!r} is gone") from None

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.remote is not None:
            self.remote.remove()


class RemoteCheckpoint:
    """One job's checkpoint in the object store: ``<prefix>/<job folder>/.checkpoint/``, with
    ``files/<sha256>`` (each written once, create-only) and the manifest (replaced at each write,
    after its files)."""

    def __init__(self, store: ObjectStore, place: S3Place, job_id: str) -> None:
        self.store, self.bucket = store, place.bucket
        self.prefix = place.key(folder_name(job_id), FOLDER)
        self._digests: dict[str, str] = {}  # local stored name -> sha256, hashed once
        self._sent: set[str] = set()  # digests already in the store
        self._quiet_until = 0.0

    def digest(self, path: Path, stored: str) -> str:
        if stored not in self._digests:
            self._digests[stored] = sha256_of(path)
        return self._digests[stored]

    def push(self, manifest: Mapping[str, Any], files_folder: Path) -> None:
        """Copy a manifest just written locally and its kept files; a failing store is logged and
        left alone for a while (the local checkpoint stands)."""
        if time.monotonic() < self._quiet_until:
            return
        try:
            for kept in manifest["files"].values():
                digest = kept["sha256"]
                if digest not in self._sent:
                    self.store.put_new(files_folder / kept["stored"], self.bucket, f"{self.prefix}/{FILES}/{digest}",
                                       {"sha256": digest}, "application/octet-stream")  # fmt: skip
                    self._sent.add(digest)
            self.store.put_bytes(json.dumps(manifest, separators=(",", ":")).encode(), self.bucket,
                                 f"{self.prefix}/{MANIFEST}", "application/json")  # fmt: skip
        except StoreUnavailable as exc:
            self._quiet_until = time.monotonic() + REMOTE_BACKOFF_S
            log.warning("checkpoint not copied to the object store (kept locally; next try in %g s): %s",
                        REMOTE_BACKOFF_S, exc)  # fmt: skip

    def pull(self, folder: Path) -> bool:
        """Put the stored checkpoint in ``folder`` (which has no manifest): its files under their
        digests, then the manifest naming them. False when the store holds none or cannot be read
        (the attempt starts over: the same as a host with no checkpoint)."""
        try:
            manifest = json.loads(self.store.read(self.bucket, f"{self.prefix}/{MANIFEST}"))
            files = folder / FILES
            files.mkdir(parents=True, exist_ok=True)
            for kept in manifest["files"].values():
                digest = str(kept["sha256"])
                temp = files / f".{digest}{PARTIAL_MARK}{uuid.uuid4().hex}"
                self.store.download(self.bucket, f"{self.prefix}/{FILES}/{digest}", temp)
                os.replace(temp, files / digest)
                kept["stored"] = digest
                self._sent.add(digest)
        except ObjectMissing:
            return False
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("the stored checkpoint could not be taken; starting over: %s", exc)
            return False
        temp = folder / f".{MANIFEST}{PARTIAL_MARK}{uuid.uuid4().hex}"
        temp.write_text(json.dumps(manifest, separators=(",", ":")), encoding="utf-8")
        os.replace(temp, folder / MANIFEST)
        return True

    def remove(self) -> None:
        try:
            self.store.delete_prefix(self.bucket, f"{self.prefix}/")
        except StoreUnavailable as exc:  # the store's lifecycle rule removes it in the end
            log.warning("stored checkpoint not removed: %s", exc)


def _same_file(kept: Path, status: os.stat_result) -> bool:
    """Does the kept file hold what ``status`` saw: the same inode if a link, the same size if a copy?"""
    now = kept.stat()
    return now.st_size == status.st_size and (now.st_nlink == 1 or now.st_ino == status.st_ino)


def _link_or_copy(source: Path, target: Path) -> None:
    # A hard link costs nothing; a file system without them (some network mounts) gets a copy.
    try:
        os.link(source, target)
    except OSError:
        temp = target.with_name(f".{target.name}{PARTIAL_MARK}{os.getpid()}")
        shutil.copyfile(source, temp)
        os.replace(temp, target)


@dataclass
class CheckpointWriter:
    """An attempt's side of checkpoints (``EngineContext.checkpoint``): throttled writes, and
    which rung made which part.

    Attributes:
        store: The job's checkpoint folder.
        unit: The family's unit.
        rung: The rung this attempt runs.
        interval: Seconds between two writes at most as often (``FARM_CHECKPOINT_INTERVAL``).
        resumed: The checkpoint this attempt resumed from, if any: its ``made`` comes first.
    """

    store: CheckpointStore
    unit: str
    rung: str
    interval: float = 5.0
    resumed: Checkpoint | None = None
    _last: float = field(default_factory=time.monotonic)
    writes: int = 0

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.interval

    def write(self, position: float, state: Mapping[str, Any], files: Iterable[str] = ()) -> Checkpoint:
        made = made_until(self.resumed, self.rung, float(position))
        checkpoint = Checkpoint(float(position), self.unit, self.rung, dict(state), tuple(files), made, time.time())
        try:
            self.store.save(checkpoint)
        finally:  # a failed write (a full disk) is not tried again at every step until the next interval
            self._last = time.monotonic()
        self.writes += 1
        return checkpoint


def made_until(resumed: Checkpoint | None, rung: str, position: float) -> tuple[Made, ...]:
    """The parts made so far: the resumed checkpoint's (none: this attempt started over), then this
    attempt's on ``rung`` from where it took over to ``position``."""
    before: Sequence[Made] = resumed.made if resumed is not None else ()
    start = resumed.position if resumed is not None else 0.0
    if before and before[-1].rung == rung:  # the same rung went on: one stretch, not two
        return (*before[:-1], Made(before[-1].start, position, rung))
    return (*before, Made(start, position, rung))


def store_for(
    artifacts: ArtifactStore, family: str, fields: Mapping[str, Any], remote: RemoteCheckpoint | None = None
) -> CheckpointStore:
    return CheckpointStore(artifacts, fingerprint(family, fields), remote)

