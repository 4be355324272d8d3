"""What the benches share: a farm of their own (an embedded Redis and the farm's settings pointing
at it), one worker of a pool started and stopped, and the sentences the TTS benches speak.

    with farm(workdir, config=workdir / "farm.toml", pool="bench", families="tests.support.chaos"):
        from mediafarm.tasks.app import app  # only now: the farm reads its settings once

        with worker("bench", workdir) as process:
            ...

or, for the chaos family, ``with chaos_farm(CONFIG) as workdir, worker("bench", workdir):``.

Nothing here reaches another Redis: the broker and backend are always the bench's own, and a
config file, pool, family modules or models folder the bench does not give is removed from this
process's environment rather than inherited from the shell.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# Short English sentences of everyday words, for the TTS benches' texts.
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.", "Please leave the package at the front door.",
    "Someone is walking across the garden now.", "Turn off the lights before you go to sleep.",
    "We will meet again early in the evening.", "The train to the coast leaves every hour on the hour.",
    "She read the letter twice before she put it away.", "Rain is expected later, so bring a coat.",
)  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, interpolated linearly between the two nearest
    ranks (numpy's default); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@contextlib.contextmanager
def farm(
    workdir: Path,
    *,
    config: Path | None = None,
    pool: str | None = None,
    families: str | None = None,
    models: Path | None = None,
) -> Iterator[Any]:
    """An embedded Redis in ``workdir/redis``, stopped on the way out, and this process's farm
    settings pointing at it (inherited by the workers it spawns): ``workdir`` is the media root,
    ``workdir/storage`` the store; ``config`` the farm.toml, ``pool`` the worker's pool,
    ``families`` extra family modules, ``models`` the models folder, each unset when not given.
    Enter it before any farm module is imported. Yields the ``EmbeddedRedis``."""
    from mediafarm.workers.embedded import EmbeddedRedis

    # A SIGTERM (a timeout, a supervisor's stop) must still stop the worker and Redis we started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    redis = EmbeddedRedis(data_dir=workdir / "redis").start()
    try:
        os.environ.update(
            FARM_BROKER_URL=redis.url, FARM_RESULT_BACKEND=redis.url, FARM_MEDIA_ROOTS=str(workdir),
            FARM_STORAGE_DIR=str(workdir / "storage"),
            # The worker imports the test families and bench tasks from the repository.
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        )  # fmt: skip
        optional = {"FARM_CONFIG_FILE": config, "FARM_POOL": pool, "FARM_FAMILY_MODULES": families,
                    "FARM_MODELS_DIR": models}  # fmt: skip
        for name, value in optional.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = str(value)
        yield redis
    finally:
        redis.stop()


@contextlib.contextmanager
def chaos_farm(config: str, pool: str = "bench") -> Iterator[Path]:
    """A farm of the chaos test family (``tests/support/chaos.py``: engines that sleep, fail or eat
    memory on purpose) in a fresh temporary folder, ``config`` its farm.toml, ``pool`` the pool of
    the workers it starts. Yields the folder, kept afterwards for the worker's log."""
    workdir = Path(tempfile.mkdtemp(prefix="mediafarm-bench-"))
    (workdir / "farm.toml").write_text(config)
    with farm(workdir, config=workdir / "farm.toml", pool=pool, families="tests.support.chaos"):
        yield workdir


@contextlib.contextmanager
def worker(
    pool: str,
    logdir: Path,
    *,
    node: str | None = None,
    log: str = "worker.log",
    timeout: float = 60,
    **options: Any,
) -> Iterator[subprocess.Popen[bytes]]:
    """A worker of ``pool`` (``farm worker``'s launch; ``options`` go to ``spawn_worker``), its
    output in ``logdir/log``, waited for until it answers a ping, stopped on the way out.
    Yields its process."""
    from mediafarm.config.pools import get_pool
    from mediafarm.tasks.app import app
    from mediafarm.workers.launch import spawn_worker, stop_worker, wait_ready

    node = node or f"bench-{os.getpid()}@{os.uname().nodename}"
    with (logdir / log).open("wb") as logfile:
        process = spawn_worker(get_pool(pool), logfile=logfile, node=node, loglevel="WARNING", **options)
    try:
        wait_ready(app, node, process, timeout=timeout)
        yield process
    finally:
        stop_worker(process)
