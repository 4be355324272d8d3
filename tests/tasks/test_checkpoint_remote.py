"""A job's checkpoint in the object store (issue #30 item 5), on the seam, against a real SeaweedFS:
what one host keeps, another host with a folder of its own takes and resumes from; a store that
fails costs the copy, never the local checkpoint or the engine's time."""

from __future__ import annotations

import time
import uuid

import pytest

from mediafarm.config.storage_url import S3Place
from mediafarm.tasks.wire import object_store
from mediafarm.tasks.wire.artifacts import ArtifactStore
from mediafarm.tasks.wire.checkpoint import (
    MANIFEST,
    CheckpointWriter,
    Made,
    RemoteCheckpoint,
    UnusableCheckpoint,
    store_for,
)
from tests.support.seaweed import BUCKET

FIELDS = {"media": "talk.wav", "formats": ["vtt"]}


def host(tmp_path, name: str, job_id: str, remote_place: S3Place) -> tuple[ArtifactStore, RemoteCheckpoint]:
    """One host's view of the job: its own storage folder, the shared store."""
    return ArtifactStore(tmp_path / name, job_id), RemoteCheckpoint(object_store.store_at(), remote_place, job_id)


def test_a_checkpoint_kept_on_one_host_is_resumed_on_another(seaweed, tmp_path) -> None:
    job_id, place = f"cross-host-{uuid.uuid4()}", S3Place(BUCKET, "checkpoints")
    a_files, a_remote = host(tmp_path, "a", job_id, place)
    a_files.write_text("chunks/0000.vtt", "WEBVTT\n\none\n")
    a_files.write_text("chunks/0001.vtt", "WEBVTT\n\ntwo\n")
    writer = CheckpointWriter(store_for(a_files, "subtitle", FIELDS, a_remote), "seconds", "tiny-a", interval=0.0)
    writer.write(20.0, {"cues": [1]}, files=["chunks/0000.vtt"])
    writer.write(41.5, {"cues": [1, 2]}, files=["chunks/0000.vtt", "chunks/0001.vtt"])

    # Host B has never seen the job: its folder is empty; the stored checkpoint is the newest one.
    b_files, b_remote = host(tmp_path, "b", job_id, place)
    b_store = store_for(b_files, "subtitle", FIELDS, b_remote)
    loaded = b_store.load()
    assert loaded is not None and (loaded.position, loaded.rung, loaded.state) == (41.5, "tiny-a", {"cues": [1, 2]})
    assert loaded.made == (Made(0.0, 41.5, "tiny-a"),)
    b_store.restore(loaded)
    assert b_files.path("chunks/0000.vtt").read_text() == "WEBVTT\n\none\n"
    assert b_files.path("chunks/0001.vtt").read_text() == "WEBVTT\n\ntwo\n"
    # Host B goes on from there, and its own writes reach the store too.
    b_writer = CheckpointWriter(b_store, "seconds", "tiny-b", interval=0.0, resumed=loaded)
    b_writer.write(60.0, {"cues": [1, 2, 3]}, files=["chunks/0001.vtt"])
    c_files, c_remote = host(tmp_path, "c", job_id, place)
    again = store_for(c_files, "subtitle", FIELDS, c_remote).load()
    assert again is not None and again.made == (Made(0.0, 41.5, "tiny-a"), Made(41.5, 60.0, "tiny-b"))

    # The job's end removes the stored copy: a fourth host finds nothing.
    b_store.remove()
    d_files, d_remote = host(tmp_path, "d", job_id, place)
    assert store_for(d_files, "subtitle", FIELDS, d_remote).load() is None


def test_a_stored_checkpoint_of_another_request_is_refused(seaweed, tmp_path) -> None:
    job_id, place = f"reused-{uuid.uuid4()}", S3Place(BUCKET, "checkpoints")
    a_files, a_remote = host(tmp_path, "a", job_id, place)
    a_files.write_text("chunks/0000.vtt", "WEBVTT\n")
    CheckpointWriter(store_for(a_files, "subtitle", FIELDS, a_remote), "seconds", "r", interval=0.0).write(
        5.0, {}, files=["chunks/0000.vtt"])  # fmt: skip
    b_files, b_remote = host(tmp_path, "b", job_id, place)
    with pytest.raises(UnusableCheckpoint, match="another request"):
        store_for(b_files, "subtitle", {**FIELDS, "formats": ["srt"]}, b_remote).load()


def test_a_failing_store_costs_the_copy_not_the_checkpoint(seaweed, tmp_path) -> None:
    job_id = f"store-away-{uuid.uuid4()}"
    away = S3Place(BUCKET, "checkpoints")
    # A store nobody serves: every call fails at once (connection refused).
    dead = RemoteCheckpoint(object_store.ObjectStore("http://127.0.0.1:9"), away, job_id)
    files = ArtifactStore(tmp_path / "a", job_id)
    files.write_text("chunks/0000.vtt", "WEBVTT\n")
    writer = CheckpointWriter(store_for(files, "subtitle", FIELDS, dead), "seconds", "r", interval=0.0)
    writer.write(5.0, {"n": 1}, files=["chunks/0000.vtt"])
    assert (files.folder / ".checkpoint" / MANIFEST).is_file()  # kept locally all the same
    started = time.monotonic()
    writer.write(6.0, {"n": 2}, files=["chunks/0000.vtt"])  # the store is left alone a while: no wait
    assert time.monotonic() - started < 1.0
    assert store_for(files, "subtitle", FIELDS, dead).load().state == {"n": 2}
