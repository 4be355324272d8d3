"""Start one Celery worker per declared pool, pinned to its GPUs before anything imports torch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from mediafarm.config.pools import Pool, expand_queues
from mediafarm.tasks import registry

APP = "mediafarm.workers.app"


def node_name(pool: Pool) -> str:
    return f"{pool.name}@{socket.gethostname()}"


def pool_environment(pool: Pool, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a pool's worker must start with.

    CUDA_VISIBLE_DEVICES is decided here, before the worker process exists, so no library can
    initialise CUDA on the wrong device first. A pool without GPUs sees none; a pool spanning
    several GPUs exposes all of them to the main process (which never touches CUDA) and each
    child narrows it to one (``workers.guards``).
    """
    env = dict(os.environ if base is None else base)
    env["FARM_POOL"] = pool.name
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in pool.gpus)
    # A pool's GPU numbers are nvidia-smi's and NVML's (PCI bus order), which the pressure reading
    # and the GPU metrics use; CUDA numbers fastest-first unless told, so on a host with mixed GPUs
    # the pool would run on one GPU and watch another.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    # glibc malloc arenas multiply RSS in threaded children (the TTS story's saw-tooth); glibc
    # reads this at process start, so it goes in now and the children inherit it. The pool's
    # setting decides (the image's ENV too): 0 or None gives glibc's own default.
    if not pool.malloc_arena_max:
        env.pop("MALLOC_ARENA_MAX", None)
    else:
        env["MALLOC_ARENA_MAX"] = str(pool.malloc_arena_max)
    return env


def worker_argv(
    pool: Pool,
    *,
    queues: Sequence[str] | None = None,
    concurrency: int | None = None,
    loglevel: str = "INFO",
    node: str | None = None,
    include: Sequence[str] = (),
) -> list[str]:
    """``python -m celery ... worker`` arguments for ``pool``; queue patterns (``*``) expanded."""
    argv = [
        sys.executable, "-m", "celery", "-A", APP, "worker",
        "-n", node or f"{pool.name}@%h",
        "-Q", ",".join(expand_queues(queues or pool.queues, registry.default_queues())),
        "-c", str(concurrency or pool.concurrency),
        "-P", "prefork",
        "-E",
        # Gossip and mingle are worker-to-worker chatter the farm does not use: cancelling is the
        # cancel flag in Redis plus a broadcast revoke (pidbox), which neither needs, and a worker
        # started after a revoke discards the job's output by the flag. Gossip logged an
        # AttributeError traceback when Redis restarted under a worker holding jobs; mingle cost
        # a second at each start.
        "--without-gossip",
        "--without-mingle",
        "--loglevel", loglevel,
    ]  # fmt: skip
    if include:
        argv += ["--include", ",".join(include)]
    if pool.max_tasks_per_child:
        argv += ["--max-tasks-per-child", str(pool.max_tasks_per_child)]
    if pool.max_memory_per_child_mb:
        argv += ["--max-memory-per-child", str(pool.max_memory_per_child_mb * 1024)]  # KiB
    return argv


def exec_worker(pool: Pool, **options: Any) -> None:
    """Replace this process with the pool's worker (signals then go straight to Celery)."""
    argv = worker_argv(pool, **options)
    os.execvpe(argv[0], argv, pool_environment(pool))


def spawn_worker(
    pool: Pool, *, env: Mapping[str, str] | None = None, logfile: Any = None, **options: Any
) -> subprocess.Popen[bytes]:
    """Start the pool's worker as a child process of this one (``farm up``, tests).

    Its output goes to ``logfile``, or to this process's own stdout/stderr when there is none.
    """
    argv = worker_argv(pool, **options)
    return subprocess.Popen(
        argv,
        env=pool_environment(pool, env),
        stdin=subprocess.DEVNULL,
        stdout=logfile,
        stderr=subprocess.STDOUT if logfile else None,
        start_new_session=True,  # Ctrl-C reaches us, and we stop the worker in order
    )


def wait_ready(app: Any, node: str, process: subprocess.Popen[bytes] | None = None, timeout: float = 60) -> None:
    """Block until ``node`` answers a ping; raise if its process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"worker {node} exited with code {process.returncode} before it was ready")
        if app.control.ping(destination=[node], timeout=0.5):
            return
    raise RuntimeError(f"worker {node} did not answer within {timeout} s")


def stop_worker(process: subprocess.Popen[bytes], timeout: float = 30) -> int:
    """SIGTERM (the worker drains: ``workers.drain``), then SIGKILL if it has not stopped in ``timeout``.

    A second Ctrl-C while waiting skips the wait; the worker is never left running behind us.
    """
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            process.kill()
            process.wait()
    return process.returncode
