"""farm gc: a job's folder goes when its result and history are gone and nothing changed for a while."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.artifacts import ArtifactStore
from mediafarm.workers.retention import WrongBackend, expired, remove

GRACE = 3600.0


@pytest.fixture(scope="module")
def backend() -> Iterator[Any]:
    from mediafarm.tasks.app import app

    # `farm gc` refuses a backend that holds no farm key at all; this one belongs to a farm.
    marker = keys.history(f"retention-test-{uuid.uuid4()}")
    app.backend.client.rpush(marker, "{}")
    yield app.backend
    app.backend.client.delete(marker)


@pytest.fixture()
def storage(tmp_path: Path) -> Path:
    path = tmp_path / "storage"
    path.mkdir()
    return path


@pytest.fixture()
def new_job(storage: Path, backend: Any) -> Iterator[Any]:
    """Factory: a job folder with one finished artifact, its Redis keys deleted afterwards."""
    made: list[str] = []

    def make(*files: str) -> Path:
        job_id = str(uuid.uuid4())
        made.append(job_id)
        store = ArtifactStore(storage, job_id)
        for name in files or ("out.wav",):
            store.write_bytes(name, b"RIFF" * 10)
        return store.folder

    yield make
    for job_id in made:
        backend.client.delete(backend.get_key_for_task(job_id), keys.history(job_id))


def _age(folder: Path, seconds: float) -> None:
    """Make the folder and everything in it look ``seconds`` old."""
    then = time.time() - seconds
    for path in [folder, *folder.rglob("*")]:
        os.utime(path, (then, then))


def test_folder_without_result_or_history_past_grace_is_removed(storage: Path, backend: Any, new_job: Any) -> None:
    folder = new_job()
    removals = list(expired(storage, backend, grace=GRACE, now=time.time() + 2 * GRACE))
    assert [(r.path, r.reason, r.size) for r in removals] == [(folder, "result and history expired", 40)]
    remove(removals[0])
    assert not folder.exists()


def test_folder_with_an_attempt_history_is_kept(storage: Path, backend: Any, new_job: Any) -> None:
    folder = new_job()
    backend.client.rpush(keys.history(folder.name), '{"rung": 0, "variant": "a"}')
    assert list(expired(storage, backend, grace=GRACE, now=time.time() + 2 * GRACE)) == []


def test_folder_with_a_stored_result_is_kept(storage: Path, backend: Any, new_job: Any) -> None:
    folder = new_job()
    backend.store_result(folder.name, {"ok": True}, "SUCCESS")
    assert list(expired(storage, backend, grace=GRACE, now=time.time() + 2 * GRACE)) == []


def test_folder_changed_within_the_grace_period_is_kept(storage: Path, backend: Any, new_job: Any) -> None:
    folder = new_job()
    _age(folder, 2 * GRACE)
    (folder / "late.wav").write_bytes(b"new")  # a write in flight keeps the whole folder
    assert list(expired(storage, backend, grace=GRACE)) == []
    assert list(expired(storage, backend, grace=GRACE, now=time.time() + GRACE / 2)) == []


def test_stale_partial_in_a_kept_folder_is_listed_alone(storage: Path, backend: Any, new_job: Any) -> None:
    folder = new_job("out.wav")
    (folder / ".out.partial-4242.wav").write_bytes(b"RIFF")  # what a killed writer leaves
    backend.client.rpush(keys.history(folder.name), "{}")
    removals = list(expired(storage, backend, grace=GRACE, now=time.time() + 2 * GRACE))
    assert [(r.path, r.reason) for r in removals] == [
        (folder / ".out.partial-4242.wav", "partial file of an attempt that never finished")
    ]
    remove(removals[0])
    assert sorted(p.name for p in folder.iterdir()) == [".mediafarm-job", "out.wav"]


def test_missing_storage_dir_has_nothing_to_remove(tmp_path: Path, backend: Any) -> None:
    assert list(expired(tmp_path / "absent", backend, grace=GRACE)) == []


def test_folders_the_farm_did_not_make_are_never_touched(storage: Path, backend: Any, new_job: Any) -> None:
    other = storage / "lost+found"
    other.mkdir()
    (other / "keep.bin").write_bytes(b"x")
    unmarked = storage / str(uuid.uuid4())  # looks like a job id, but no farm marker inside
    unmarked.mkdir()
    job = new_job()
    for folder in (other, unmarked, job):
        _age(folder, 2 * GRACE)
    assert [r.path for r in expired(storage, backend, grace=GRACE)] == [job]


def test_a_backend_with_no_farm_keys_is_refused(storage: Path, backend: Any, redis_url: str, new_job: Any) -> None:
    import redis

    class EmptyBackend:
        # An unused database of the session's Redis: what a wrong FARM_RESULT_BACKEND points at.
        client = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/13")

        def get_key_for_task(self, job_id: str) -> bytes:
            return backend.get_key_for_task(job_id)

    EmptyBackend.client.flushdb()
    _age(new_job(), 2 * GRACE)
    with pytest.raises(WrongBackend, match="FARM_RESULT_BACKEND"):
        list(expired(storage, EmptyBackend(), grace=GRACE))


def test_farm_gc_lists_then_removes_only_expired_folders(storage: Path, backend: Any, new_job: Any) -> None:
    """The command as an operator runs it: --dry-run lists and keeps, a plain run removes."""
    import subprocess
    import sys

    from tests.conftest import REPO

    gone, kept = new_job(), new_job()
    backend.store_result(kept.name, {"ok": True}, "SUCCESS")
    for folder in (gone, kept):
        _age(folder, 2 * GRACE)
    env = {**os.environ, "FARM_STORAGE_DIR": str(storage), "COLUMNS": "400"}

    def farm_gc(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "mediafarm.workers.cli", "gc", *args], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    listed = farm_gc("--dry-run")
    assert f"would remove {gone}" in listed and str(kept) not in listed and "1 to remove" in listed
    assert gone.exists()
    removed = farm_gc()
    assert f"removed {gone}" in removed and "1 removed" in removed
    assert not gone.exists() and kept.exists()


def test_farm_gc_removes_uploads_whose_jobs_results_expired(storage: Path, backend: Any, new_job: Any) -> None:
    import subprocess
    import sys

    from mediafarm.tasks.wire.upload_store import UploadStore
    from tests.conftest import REPO

    store = UploadStore(storage / ".uploads", max_bytes=1000, max_count=10)  # the default FARM_UPLOADS_DIR

    def uploaded(job_id: str) -> Path:
        writer = store.begin("local", "clip.wav")
        writer.write(b"RIFF....")
        upload = writer.finish()
        store.attach(upload, job_id)
        return upload.path.parent

    forgotten = uploaded(str(uuid.uuid4()))  # a job whose result and history are gone
    living = new_job()  # its job still has a result
    backend.store_result(living.name, {"ok": True}, "SUCCESS")
    kept = uploaded(living.name)
    for folder in (forgotten, kept, living):
        _age(folder, 2 * GRACE)
    env = {**os.environ, "FARM_STORAGE_DIR": str(storage), "COLUMNS": "400"}
    env.pop("FARM_UPLOADS_DIR", None)
    proc = subprocess.run([sys.executable, "-m", "mediafarm.workers.cli", "gc"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"removed {forgotten} (upload whose jobs' results expired)" in proc.stdout, proc.stdout
    assert not forgotten.exists() and kept.exists() and living.exists()


def test_an_upload_deleted_while_gc_looks_at_it_is_passed_over(
    storage: Path, backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's DELETE may take an upload's folder while ``farm gc`` reads it: that upload is
    passed over and the others are still judged (the scan once ended on FileNotFoundError)."""
    import shutil

    from mediafarm.tasks.wire.upload_store import UploadStore
    from mediafarm.workers import retention

    store = UploadStore(storage / ".uploads", max_bytes=1000, max_count=10)
    folders = []
    for _ in range(2):
        writer = store.begin("local", "clip.wav")
        writer.write(b"RIFF....")
        upload = writer.finish()
        store.attach(upload, str(uuid.uuid4()))  # jobs whose results are long gone
        folders.append(upload.path.parent)
        _age(folders[-1], 2 * GRACE)
    deleted, is_finished = folders[0], retention.is_finished

    def deleted_meanwhile(folder: Path) -> bool:
        finished = is_finished(folder)
        if folder == deleted:  # between its record being found and read
            shutil.rmtree(folder)
        return finished

    monkeypatch.setattr(retention, "is_finished", deleted_meanwhile)
    removals = list(retention.expired_uploads(storage / ".uploads", backend, ttl=7 * 86400, grace=GRACE))
    assert [r.path for r in removals] == [folders[1]], removals
    assert removals[0].reason == "upload whose jobs' results expired"


def test_the_checkpoint_of_an_ended_job_goes_and_a_running_jobs_stays(
    storage: Path, backend: Any, new_job: Any
) -> None:
    ended, running = new_job("out.wav"), new_job("out.wav")
    for folder in (ended, running):
        checkpoint = folder / ".checkpoint"
        (checkpoint / "files").mkdir(parents=True)
        (checkpoint / "checkpoint.json").write_text("{}")
        _age(folder, 2 * GRACE)
    backend.store_result(ended.name, {"ok": True}, "SUCCESS")
    backend.store_result(running.name, None, "RETRY")  # lost an attempt, about to run again
    removals = list(expired(storage, backend, grace=GRACE))
    assert [(r.path, r.reason) for r in removals] == [(ended / ".checkpoint", "checkpoint of a job that has ended")]
    remove(removals[0])
    assert not (ended / ".checkpoint").exists() and (ended / "out.wav").is_file()


def test_media_fetched_for_an_ended_job_goes_and_a_running_jobs_stays(
    storage: Path, backend: Any, new_job: Any
) -> None:
    # A child killed on the job's last attempt leaves what it fetched (tasks.runtime.media_fetch).
    ended, running = new_job("out.wav"), new_job("out.wav")
    for folder in (ended, running):
        (folder / ".inputs").mkdir()
        (folder / ".inputs" / "0123abcd.mp4").write_bytes(b"\0" * 100)
        _age(folder, 2 * GRACE)
    backend.store_result(ended.name, ValueError("bad media"), "FAILURE")
    backend.store_result(running.name, None, "RETRY")
    removals = list(expired(storage, backend, grace=GRACE))
    assert [(r.path, r.reason) for r in removals] == [(ended / ".inputs", "media fetched for a job that has ended")]
    remove(removals[0])
    assert not (ended / ".inputs").exists() and (ended / "out.wav").is_file() and (running / ".inputs").is_dir()
