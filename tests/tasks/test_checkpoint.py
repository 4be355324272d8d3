"""The checkpoint seam on its own: what is kept, what is refused, what survives a torn write."""

from __future__ import annotations

import json
import os

import pytest

from mediafarm.config.ladders import rung
from mediafarm.tasks.runtime.base import Resuming
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.wire.artifacts import ArtifactStore
from mediafarm.tasks.wire.checkpoint import (
    FOLDER,
    MANIFEST,
    Checkpoint,
    CheckpointStore,
    CheckpointWriter,
    Made,
    Resume,
    UnusableCheckpoint,
    fingerprint,
    store_for,
)

FIELDS = {"media": "talk.wav", "formats": ["vtt"]}


@pytest.fixture
def store(tmp_path):
    return ArtifactStore(tmp_path, "job-1")


def test_a_checkpoint_round_trips_with_its_files_kept_across_a_cleared_folder(store):
    store.write_text("chunks/0000.vtt", "WEBVTT\n\none\n")
    store.write_text("chunks/0001.vtt", "WEBVTT\n\ntwo\n")
    checkpoints = store_for(store, "subtitle", FIELDS)
    writer = CheckpointWriter(checkpoints, "seconds", "whisper-small", interval=0.0)
    writer.write(61.5, {"cues": [1, 2]}, files=["chunks/0000.vtt", "chunks/0001.vtt"])

    store.clear()  # the next attempt's clean start
    assert store.list() == []
    loaded = checkpoints.load()
    assert loaded is not None and loaded.position == 61.5 and loaded.unit == "seconds"
    assert loaded.state == {"cues": [1, 2]} and loaded.rung == "whisper-small"
    assert loaded.made == (Made(0.0, 61.5, "whisper-small"),)
    checkpoints.restore(loaded)
    assert store.path("chunks/0001.vtt").read_text() == "WEBVTT\n\ntwo\n"
    assert [a.name for a in store.list()] == ["chunks/0000.vtt", "chunks/0001.vtt"]


def test_a_rewritten_artifact_keeps_the_content_the_checkpoint_saw(store):
    # Artifacts are replaced by renames: the checkpoint's link still holds the old bytes.
    store.write_text("playlist.m3u8", "first")
    checkpoints = store_for(store, "subtitle", FIELDS)
    CheckpointWriter(checkpoints, "seconds", "r", interval=0.0).write(10, {}, files=["playlist.m3u8"])
    store.write_text("playlist.m3u8", "second, longer")
    store.clear()
    checkpoints.restore(checkpoints.load())
    assert store.path("playlist.m3u8").read_text() == "first"


def test_a_partial_output_written_unsynced_is_synced_before_a_manifest_names_it(store, monkeypatch):
    # A TTS chunk is written without its own fsync (ArtifactStore.writing, durable=False): the
    # checkpoint that keeps it must put it on disk before its manifest points at it.
    events: list[tuple[str, object]] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.fstat(fd).st_ino)), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace",
                        lambda a, b: (events.append(("replace", os.path.basename(b))), real_replace(a, b))[1])
    with store.writing("chunks/chunk_00000.wav", durable=False) as temp:
        temp.write_bytes(b"RIFF....WAVE")
    chunk = store.path("chunks/chunk_00000.wav").stat().st_ino
    assert ("fsync", chunk) not in events  # the write itself did not sync it
    with store.writing("speech.wav") as temp:
        temp.write_bytes(b"RIFF")
    assert ("fsync", store.path("speech.wav").stat().st_ino) in events  # the default still does

    events.clear()
    CheckpointWriter(store_for(store, "tts", FIELDS), "chars", "espeak", interval=0.0).write(
        400, {}, files=["chunks/chunk_00000.wav"])
    assert ("fsync", chunk) in events and ("replace", MANIFEST) in events
    assert events.index(("fsync", chunk)) < events.index(("replace", MANIFEST))


def test_made_says_which_rung_made_which_part_across_resumes(store):
    checkpoints = store_for(store, "subtitle", FIELDS)
    first = CheckpointWriter(checkpoints, "seconds", "big", interval=0.0).write(30, {})
    again = CheckpointWriter(checkpoints, "seconds", "big", interval=0.0, resumed=first).write(50, {})
    assert again.made == (Made(0.0, 50.0, "big"),)
    lower = CheckpointWriter(checkpoints, "seconds", "small", interval=0.0, resumed=again).write(80, {})
    assert lower.made == (Made(0.0, 50.0, "big"), Made(50.0, 80.0, "small"))
    assert checkpoints.load().record()["made"] == [
        {"start": 0.0, "end": 50.0, "rung": "big"}, {"start": 50.0, "end": 80.0, "rung": "small"}]  # fmt: skip


def test_another_requests_checkpoint_under_the_same_id_is_refused(store):
    CheckpointWriter(store_for(store, "subtitle", FIELDS), "seconds", "r", interval=0.0).write(5, {})
    other = store_for(store, "subtitle", {**FIELDS, "formats": ["srt"]})
    with pytest.raises(UnusableCheckpoint, match="another request"):
        other.load()
    assert fingerprint("subtitle", FIELDS) != fingerprint("vad", FIELDS)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda folder: (folder / MANIFEST).write_text("{not json"), "corrupt"),
        (lambda folder: (folder / MANIFEST).write_text(json.dumps({"format": 99})), "format"),
        (lambda folder: [p.unlink() for p in (folder / "files").iterdir()], "gone"),
        (lambda folder: [p.write_text("x") for p in (folder / "files").iterdir()], "bytes"),
    ],
    ids=["unparsable", "unknown-format", "file-gone", "file-changed"],
)
def test_a_damaged_checkpoint_is_refused_naming_the_damage(store, damage, message):
    store.write_text("a.txt", "some output")
    checkpoints = store_for(store, "subtitle", FIELDS)
    CheckpointWriter(checkpoints, "seconds", "r", interval=0.0).write(5, {}, files=["a.txt"])
    damage(store.folder / FOLDER)
    with pytest.raises(UnusableCheckpoint, match=message):
        checkpoints.load()


def test_a_write_torn_before_its_manifest_leaves_the_previous_checkpoint_whole(store, monkeypatch):
    store.write_text("a.txt", "one")
    checkpoints = store_for(store, "subtitle", FIELDS)
    writer = CheckpointWriter(checkpoints, "seconds", "r", interval=0.0)
    writer.write(5, {"n": 1}, files=["a.txt"])
    store.write_text("b.txt", "two")

    def killed(*args, **kwargs):  # the child dies where the manifest would be renamed into place
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        writer.write(9, {"n": 2}, files=["a.txt", "b.txt"])
    monkeypatch.undo()
    loaded = checkpoints.load()
    assert loaded.position == 5 and loaded.state == {"n": 1} and loaded.files == ("a.txt",)


def test_writes_are_throttled_by_the_interval(store):
    writer = CheckpointWriter(store_for(store, "vad", FIELDS), "seconds", "r", interval=3600.0)
    assert not writer.due()
    ctx = EngineContext.local(storage_dir=store.folder.parent, job_id="job-1")
    assert not ctx.checkpoint_due()  # no writer: never due, and checkpoint() keeps nothing
    ctx.checkpoint(4.0, {"x": 1})
    assert not (store.folder / FOLDER).exists()
    ctx.checkpoints = CheckpointWriter(store_for(store, "vad", FIELDS), "seconds", "r", interval=0.0)
    assert ctx.checkpoint_due()
    ctx.checkpoint(4.0, {"x": 1})
    assert CheckpointStore(store, fingerprint("vad", FIELDS)).load().state == {"x": 1}


class _Spec:
    def __init__(self, resume: Resume) -> None:
        self.name, self.resume = "subtitle", resume


def test_the_offer_records_what_the_attempt_resumes_from_or_why_not(store):
    resume = Resume(unit="seconds", rule="from the last window, on any rung")
    resuming = Resuming(_Spec(resume), store, FIELDS)
    assert resuming.offer(rung("big", "whisper")) == (None, "")  # nothing to resume from yet
    CheckpointWriter(resuming.store, "seconds", "big", interval=0.0).write(42.0, {"k": 1})
    record, ignored = resuming.offer(rung("small", "whisper"))
    assert ignored == "" and record["position"] == 42.0 and record["rung"] == "big"
    assert resuming.offered is not None

    same_rung_only = Resuming(_Spec(Resume(unit="seconds", rule="same rung", across_rungs=False)), store, FIELDS)
    record, ignored = same_rung_only.offer(rung("small", "whisper"))
    assert record is None and "same rung only" in ignored

    refusing = Resume(unit="seconds", rule="r", refuses=lambda cp, name: f"{name} speaks with another voice")
    record, ignored = Resuming(_Spec(refusing), store, FIELDS).offer(rung("small", "whisper"))
    assert record is None and ignored == "small speaks with another voice"

    (store.folder / FOLDER / MANIFEST).write_text("torn")
    record, ignored = Resuming(_Spec(resume), store, FIELDS).offer(rung("small", "whisper"))
    assert record is None and "corrupt" in ignored
    assert not (store.folder / FOLDER).exists()  # removed: the next attempt's writes start clean


def test_the_checkpoint_goes_when_the_job_ends(store):
    resuming = Resuming(_Spec(Resume(unit="characters", rule="r")), store, FIELDS)
    CheckpointWriter(resuming.store, "characters", "r", interval=0.0).write(100, {})
    resuming.ended()
    assert not (store.folder / FOLDER).exists()


def test_a_resume_unit_is_checked():
    with pytest.raises(ValueError, match="unit"):
        Resume(unit="frames", rule="")
    mismatch = Resume(unit="characters", rule="").why_not(Checkpoint(1.0, "seconds", "r", {}), "r")
    assert mismatch and "seconds" in mismatch


def test_restore_puts_back_the_loaded_checkpoints_files_not_a_newer_manifests(store):
    # A redelivered job runs on two workers at once: the other attempt writes a newer checkpoint
    # between this attempt's offer (load) and its restore. Putting back the newer manifest's files
    # under the older state would repeat or lose output (or fail the job on a name it lacks).
    resume = Resume(unit="seconds", rule="r")
    resuming = Resuming(_Spec(resume), store, FIELDS)
    store.write_text("chunks/0000.vtt", "WEBVTT\n\none\n")
    CheckpointWriter(resuming.store, "seconds", "big", interval=0.0).write(10.0, {"n": 1}, files=["chunks/0000.vtt"])
    record, _ = resuming.offer(rung("big", "whisper"))
    assert record is not None and record["position"] == 10.0

    other = CheckpointStore(store, resuming.store.fingerprint)  # the other worker's: same job, same request
    store.write_text("chunks/0000.vtt", "WEBVTT\n\none, redone longer\n")
    store.write_text("chunks/0001.vtt", "WEBVTT\n\ntwo\n")
    CheckpointWriter(other, "seconds", "big", interval=0.0).write(20.0, {"n": 2},
                                                                   files=["chunks/0000.vtt", "chunks/0001.vtt"])
    store.clear()
    ctx = EngineContext.local(job_id="job-1")
    ctx.artifacts = store
    resuming.prepare(ctx, rung("big", "whisper"), 5.0)  # no KeyError, no newer file under the older state
    if ctx.resume is not None:
        assert ctx.resume.position == 10.0
        assert store.path("chunks/0000.vtt").read_text() == "WEBVTT\n\none\n"
    else:  # its file went with the newer write: the attempt starts over, with a clean folder
        assert store.list() == []
    assert ctx.checkpoints is not None


def test_restore_of_a_checkpoint_whose_kept_file_is_gone_is_unusable(store):
    checkpoints = store_for(store, "subtitle", FIELDS)
    store.write_text("a.vtt", "one")
    CheckpointWriter(checkpoints, "seconds", "r", interval=0.0).write(1.0, {}, files=["a.vtt"])
    loaded = checkpoints.load()
    for kept in (store.folder / FOLDER / "files").iterdir():
        kept.unlink()
    with pytest.raises(UnusableCheckpoint, match="gone"):
        checkpoints.restore(loaded)


def test_a_failed_write_waits_for_the_next_interval_before_trying_again(store, monkeypatch):
    # A full disk must not turn every step of the engine's loop into a failing write and a logged traceback.
    checkpoints = store_for(store, "vad", FIELDS)
    writer = CheckpointWriter(checkpoints, "seconds", "r", interval=3600.0)
    writer._last -= 3600.0
    ctx = EngineContext.local(job_id="job-1")
    ctx.checkpoints = writer
    assert ctx.checkpoint_due()

    def full(checkpoint):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoints, "save", full)
    ctx.checkpoint(4.0, {"x": 1})  # logged, not raised
    assert not ctx.checkpoint_due()


def test_an_artifact_replaced_while_it_is_kept_is_not_kept_under_the_name_of_another(store, monkeypatch):
    # Two attempts of a redelivered job write the same artifact names: one may replace a file between
    # this save's look at it (its inode names the kept file) and its link.
    from mediafarm.tasks.wire import checkpoint as module

    store.write_text("a.vtt", "one")
    checkpoints = store_for(store, "subtitle", FIELDS)
    real = module._link_or_copy

    def replaced_first(source, target):
        store.write_text("a.vtt", "other, longer")
        real(source, target)

    monkeypatch.setattr(module, "_link_or_copy", replaced_first)
    with pytest.raises(OSError, match="replaced"):
        CheckpointWriter(checkpoints, "seconds", "r", interval=0.0).write(1.0, {}, files=["a.vtt"])
    assert checkpoints.load() is None
    assert list((store.folder / FOLDER / "files").iterdir()) == []


def test_a_write_never_removes_files_another_attempts_manifest_names(store):
    # A redelivered job may run twice for a while: each attempt's writes drop only what its own
    # earlier manifests kept, so whichever manifest is in place finds its files.
    def stored(name: str) -> str:
        status = store.path(name).stat()
        return f"{status.st_ino}-{status.st_size}"

    store.write_text("x.txt", "from the first attempt")
    first = CheckpointWriter(store_for(store, "subtitle", FIELDS), "seconds", "r", interval=0.0)
    first.write(5, {"by": "first"}, files=["x.txt"])
    store.write_text("y.txt", "from the second attempt")
    second = CheckpointWriter(store_for(store, "subtitle", FIELDS), "seconds", "r", interval=0.0)
    second.write(6, {"by": "second"}, files=["y.txt"])
    store.write_text("z.txt", "the first goes on")
    first.write(7, {"by": "first"}, files=["z.txt"])  # drops its own x, not the second's y
    kept = {p.name for p in (store.folder / FOLDER / "files").iterdir()}
    assert kept == {stored("y.txt"), stored("z.txt")}
    second.write(8, {"by": "second"}, files=["y.txt"])
    loaded = store_for(store, "subtitle", FIELDS).load()
    assert loaded.state == {"by": "second"} and loaded.files == ("y.txt",)
