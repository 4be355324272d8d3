"""Retention of artifacts: a job's folder lives as long as its result, then ``farm gc`` removes it.

The rule: ``<FARM_STORAGE_DIR>/<job id>/`` is removed when the result backend holds neither the
job's result nor its attempt history (both expire after ``result_expires``, 7 days by default),
and nothing in the folder changed for ``grace`` seconds (a job that is about to start, or whose
result write is in flight, keeps its folder). Hidden partial files left by killed writers are
removed from any folder once they are older than ``grace``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mediafarm.tasks import keys
from mediafarm.tasks.artifacts import PARTIAL_MARK


@dataclass(frozen=True)
class Removal:
    """Attributes: path (what goes), reason (why), size (bytes freed)."""

    path: Path
    reason: str
    size: int


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _newest_change(path: Path) -> float:
    return max([path.stat().st_mtime] + [p.stat().st_mtime for p in path.rglob("*")])


def expired(storage_dir: Path, backend: Any, *, grace: float = 3600.0, now: float | None = None) -> Iterator[Removal]:
    """What ``farm gc`` removes. ``backend`` is the Celery result backend (its ``client`` and key names)."""
    now = time.time() if now is None else now
    if not storage_dir.is_dir():
        return
    for folder in sorted(p for p in storage_dir.iterdir() if p.is_dir()):
        job_id = folder.name
        if now - _newest_change(folder) < grace:
            continue
        known = backend.client.exists(backend.get_key_for_task(job_id), keys.history(job_id))
        if not known:
            yield Removal(folder, "result and history expired", _size(folder))
            continue
        for partial in folder.rglob(f".*{PARTIAL_MARK}*"):
            if now - partial.stat().st_mtime >= grace:
                yield Removal(partial, "partial file of an attempt that never finished", _size(partial))


def remove(removal: Removal) -> None:
    if removal.path.is_dir():
        shutil.rmtree(removal.path, ignore_errors=True)
    else:
        removal.path.unlink(missing_ok=True)
