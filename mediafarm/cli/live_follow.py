"""``farm submit ... --live --out DIR``: copy a live job's WebVTT segments and playlist as they are written.

A live subtitle job announces each segment as a partial output after writing it and the playlist
that lists it (segments first, every file replaced by a rename), so a follower that copies the
announced segments and then the playlist never holds a playlist naming a segment it lacks: a
player pointed at ``DIR/chunks/playlist.m3u8`` follows the stream from there. Files are read from
the shared storage folder, as ``JobHandle.download`` reads them. A lost attempt's successor starts
a fresh partial list; names already copied are not copied again.

Where the farm keeps its files in an object store (FARM_STORAGE_URL), each segment is read from
the object its announcement names, and the playlist from the copy the announcement names
(``playlist``: the attempt copies it after writing it, before announcing the segments it lists).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mediafarm.config.settings import get_settings
from mediafarm.tasks.wire import object_store
from mediafarm.tasks.wire.artifacts import ArtifactStore
from mediafarm.tasks.wire.plan import READY

PLAYLIST = "chunks/playlist.m3u8"


def follow_live(job: Any, out: Path, *, timeout: float | None, poll: float = 0.25,
                on_segment: Callable[[str], Any] = lambda name: None) -> None:  # fmt: skip
    """Copy ``job``'s announced segments, then its playlist, into ``out`` until the job ends (the
    caller then waits for its result and downloads the final files). TimeoutError after ``timeout``."""
    store = ArtifactStore(get_settings().storage_dir, job.id)
    copied: set[str] = set()
    deadline = None if timeout is None else time.monotonic() + timeout
    while job.state() not in READY:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"job {job.id} still running after {timeout} s (it goes on)")
        fresh = [p for p in job.partials() if isinstance(p, dict) and p.get("segment") not in copied]
        for partial in fresh:
            name = partial["segment"]
            _write(job.partial_file(partial, None) or b"", out / name)
            copied.add(name)
            on_segment(name)
        if fresh:  # the playlist that lists them: its copy in the store, or the file in the folder
            listed = fresh[-1].get("playlist")
            data = object_store.store_at().read(*object_store.split_url(listed)) if listed \
                else store.path(PLAYLIST).read_bytes()  # fmt: skip
            # Written over `DIR`'s only when DIR holds every segment it names: the playlist may be
            # newer than the announcements read (the next look brings the segments it lists).
            if all((out / "chunks" / line).is_file() for line in _segments(data)):
                _write(data, out / PLAYLIST)
        time.sleep(poll)


def _segments(playlist: bytes) -> list[str]:
    """The segment files an HLS playlist lists (its lines that are not tags), as written beside it."""
    lines = playlist.decode("utf-8", "replace").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _write(data: bytes, target: Path) -> None:
    # Beside the target, then renamed over it: a player reading DIR never sees half a file.
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.part-{os.getpid()}")
    try:
        temp.write_bytes(data)
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)
