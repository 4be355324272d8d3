"""ArtifactStore: names stay inside the job's folder, writes are atomic, listing is exact."""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path, PurePosixPath

import pytest

from mediafarm.tasks.wire.artifacts import (
    ArtifactStore,
    UnsafeArtifactName,
    check_name,
    job_folder,
    job_id_of,
    missing_artifact,
)
from mediafarm.tasks.wire.errors import PermanentFailure


@pytest.fixture()
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "storage", "job-1")


@pytest.mark.parametrize(
    "name",
    ["../x", "a/../../x", "/etc/passwd", "C:\\x", "C:/x", "a\\b", "a\x00b", "", ".hidden", "a/.hidden", "a//b", "./a"],
)
def test_check_name_refuses_names_that_could_leave_the_folder(name: str) -> None:
    with pytest.raises(UnsafeArtifactName):
        check_name(name)


def test_unsafe_name_is_a_permanent_failure() -> None:
    # A job that asks for such a name fails for good; it is not retried on another rung.
    assert issubclass(UnsafeArtifactName, PermanentFailure)


def test_check_name_accepts_nested_relative_names() -> None:
    assert check_name("chunks/0001.wav") == PurePosixPath("chunks", "0001.wav")


@pytest.mark.parametrize("job_id", ["../x", "a/b", "..", "a..b", ".x", "abc\n", "cam1:2026-11-29", "/etc"])
def test_any_job_id_names_a_folder_directly_under_storage(tmp_path: Path, job_id: str) -> None:
    folder = job_folder(tmp_path, job_id)
    assert folder.parent == tmp_path and "." not in folder.name and "/" not in folder.name
    assert job_id_of(folder.name) == job_id  # reversible, so `farm gc` can ask Redis about it


@pytest.mark.parametrize("job_id", ["", "x" * 201])
def test_job_folder_refuses_ids_that_cannot_name_a_folder(tmp_path: Path, job_id: str) -> None:
    with pytest.raises(UnsafeArtifactName):
        job_folder(tmp_path, job_id)


def test_names_the_farm_would_not_write_decode_to_no_job() -> None:
    assert job_id_of("lost+found") is None and job_id_of("a.b") is None and job_id_of("abc") == "abc"


def test_job_folder_is_the_id_under_storage(tmp_path: Path) -> None:
    job_id = "3f2a9c1e-0d4b-4c59-9b1a-7e6f5d4c3b2a"
    assert job_folder(tmp_path, job_id) == tmp_path / job_id


def test_symlinked_subfolder_pointing_outside_is_refused(store: ArtifactStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    store.folder.mkdir(parents=True)
    os.symlink(outside, store.folder / "link")
    with pytest.raises(UnsafeArtifactName, match="outside the job's folder"):
        store.path("link/x.bin")
    with pytest.raises(UnsafeArtifactName):
        store.write_bytes("link/x.bin", b"data")
    assert list(outside.iterdir()) == []


def test_a_writer_killed_mid_write_leaves_only_a_hidden_partial(store: ArtifactStore) -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: write half, tell the parent, wait to be killed
        try:
            os.close(read_end)
            with store.open("out.bin") as fh:
                fh.write(b"x" * 4096)
                fh.flush()
                os.write(write_end, b"1")
                signal.pause()
        finally:
            os._exit(1)
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"1"
    finally:
        os.close(read_end)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert not (store.folder / "out.bin").exists()
    assert sorted(p.name for p in store.folder.iterdir()) == [".mediafarm-job", f".out.partial-{pid}.bin"]
    assert (store.folder / f".out.partial-{pid}.bin").stat().st_size == 4096
    assert store.list() == []


def test_list_reports_finished_files_with_size_type_and_sha256(store: ArtifactStore) -> None:
    data = b'{"spans": []}'
    store.write_bytes("result.json", data)
    store.write_text("notes.txt", "héllo")
    store.write_bytes("blob.zzzunknown", b"\x00\x01")
    (store.folder / ".result.partial-99.json").write_bytes(b"half")
    infos = {info.name: info for info in store.list()}
    assert sorted(infos) == ["blob.zzzunknown", "notes.txt", "result.json"]
    assert infos["result.json"].size == len(data)
    assert infos["result.json"].sha256 == hashlib.sha256(data).hexdigest()
    assert infos["result.json"].media_type == "application/json"
    assert infos["notes.txt"].size == len("héllo".encode())
    assert infos["notes.txt"].media_type == "text/plain"
    assert infos["blob.zzzunknown"].media_type == "application/octet-stream"


def test_list_of_a_job_that_wrote_nothing_is_empty_and_creates_no_folder(store: ArtifactStore) -> None:
    assert store.list() == []
    assert not store.folder.exists()


def test_nested_names_are_written_and_listed(store: ArtifactStore) -> None:
    path = store.write_bytes("chunks/0001.wav", b"RIFF")
    assert path == store.folder / "chunks" / "0001.wav"
    assert path.read_bytes() == b"RIFF"
    assert [info.name for info in store.list()] == ["chunks/0001.wav"]


def test_an_exception_inside_writing_removes_the_temp_file_and_goes_on(store: ArtifactStore) -> None:
    with pytest.raises(RuntimeError, match="encoder crashed"):
        with store.writing("audio.wav") as temp:
            temp.write_bytes(b"partial")
            assert temp.name.startswith(".audio.partial-") and temp.suffix == ".wav"
            raise RuntimeError("encoder crashed")
    assert [p.name for p in store.folder.iterdir()] == [".mediafarm-job"]  # the job folder's marker only


def test_writing_renames_into_place_only_at_the_end(store: ArtifactStore) -> None:
    with store.writing("audio.wav") as temp:
        temp.write_bytes(b"done")
        assert not (store.folder / "audio.wav").exists()
    assert (store.folder / "audio.wav").read_bytes() == b"done"
    assert not temp.exists()


def test_open_refuses_read_and_append_modes(store: ArtifactStore) -> None:
    for mode in ("rb", "ab", "r+"):
        with pytest.raises(ValueError):
            with store.open("x.bin", mode):
                pass


def test_clear_removes_finished_and_partial_files(store: ArtifactStore) -> None:
    store.write_bytes("a.bin", b"1")
    store.write_bytes("chunks/b.bin", b"2")
    (store.folder / ".c.partial-7.bin").write_bytes(b"3")
    store.clear()
    assert not store.folder.exists()
    assert store.list() == []


def test_list_records_where_the_worker_wrote_each_file(store: ArtifactStore) -> None:
    store.write_bytes("chunks/0001.wav", b"RIFF")
    (info,) = store.list()
    assert info.path == str((store.folder / "chunks" / "0001.wav").absolute()) and Path(info.path).is_absolute()


def test_a_missing_artifact_names_where_it_was_looked_for_and_where_the_worker_wrote_it(tmp_path: Path) -> None:
    worker = ArtifactStore(tmp_path / "a" / "storage", "job-1")
    worker.write_bytes("chunks/playlist.m3u8", b"#EXTM3U\n")
    (info,) = worker.list()
    mine = ArtifactStore(tmp_path / "b" / "storage", "job-1")
    message = missing_artifact("job-1", info, mine.path(info.name), tmp_path / "b" / "storage")
    assert f"is not at {mine.path(info.name)}" in message
    assert f"this process's FARM_STORAGE_DIR is {tmp_path / 'b' / 'storage'}" in message
    assert f"the worker wrote it at {info.path} (its FARM_STORAGE_DIR is {tmp_path / 'a' / 'storage'})" in message
    # Same folder, file gone: removed since, or another machine's folder.
    assert "removed since" in missing_artifact("job-1", info, Path(info.path), tmp_path / "a" / "storage")
    # An envelope stored before the path was recorded.
    old = type(info)(info.name, info.size, info.media_type, info.sha256)
    assert "does not say where the worker wrote it" in missing_artifact("job-1", old, mine.path(info.name), tmp_path)
