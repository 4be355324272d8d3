"""The ``farm`` commands that run or steer the farm's processes: ``worker``, ``up``, ``gateway``,
``demo``, ``drain``, ``pools`` and ``gc``.

They are the ``control`` app, which ``cli/app.py`` imports by name when one of them runs (or
``farm --help`` lists them): a producer's ``farm submit`` never loads this module. The Celery app
(``mediafarm.tasks.app``) is imported inside the commands on purpose: ``farm up`` and ``farm demo``
set FARM_* variables before the app reads them. So is the worker side (``workers.guards``: psutil,
prometheus-client), which a producer's core install lacks: the commands that start a worker name
the extra that brings it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterable
from contextlib import ExitStack, suppress
from functools import partial
from importlib.resources import files
from itertools import chain
from pathlib import Path
from types import ModuleType
from typing import Annotated

import typer
from redis.exceptions import RedisError

from mediafarm.cli.console import console, err, fail, need_broker
from mediafarm.cli.job_view import follow, print_envelope
from mediafarm.config.admission import admission_problems
from mediafarm.config.celery import celery_config
from mediafarm.config.file import ConfigFileError
from mediafarm.config.pools import expand_queues, get_pool
from mediafarm.config.settings import get_settings
from mediafarm.config.storage_url import S3Place
from mediafarm.tasks import registry
from mediafarm.tasks.wire import object_store
from mediafarm.tasks.wire.errors import JobFailed
from mediafarm.tasks.wire.upload_objects import uploads_place
from mediafarm.workers.embedded import EmbeddedRedis
from mediafarm.workers.launch import exec_worker, spawn_worker, stop_worker, wait_ready
from mediafarm.workers.retention import (
    Removal,
    WrongBackend,
    expired,
    expired_objects,
    expired_upload_objects,
    expired_uploads,
    remove,
)

# Imported by the worker side only (the `worker` extra): a producer's install has none of them.
WORKER_PACKAGES = ("psutil", "prometheus_client", "standardwebhooks")
# Imported by the HTTP gateway only (the `gateway` extra).
GATEWAY_PACKAGES = ("fastapi", "starlette", "uvicorn", "sse_starlette", "python_multipart")

# Mounted on `farm` by cli/app.py, which names these commands (CONTROL_COMMANDS) to load them when used.
control = typer.Typer()


def _sample() -> Path:
    """The bundled demo clip: three espeak-ng sentences with 1-2.5 s of silence between them."""
    return Path(str(files("mediafarm.tasks.media") / "samples" / "speech.ogg"))


# The drain deadline of `farm up`'s worker, under the 30 s stop_worker gives it before a kill.
LOCAL_DRAIN_SECONDS = 20


def _settings_env(**values: str) -> None:
    """Set FARM_* variables for this process before the app is imported, and forget cached settings."""
    os.environ.update(values)
    get_settings.cache_clear()


def _worker_side() -> ModuleType:
    """``workers.guards``, what every worker runs; exit naming the extra if this install lacks it."""
    try:
        from mediafarm.workers import guards
    except ModuleNotFoundError as exc:
        if exc.name not in WORKER_PACKAGES:
            raise
        fail(
            f"this install cannot run a worker: the Python package {exc.name!r} is missing. Install the "
            r"worker side with pip install 'mediafarm\[worker]' (or a pool's extra, e.g. 'mediafarm\[vad]', "
            "which includes it)"
        )
    return guards


def _gateway_side() -> ModuleType | None:
    """``gateway.server``, or None if this install lacks the ``gateway`` extra."""
    try:
        from mediafarm.gateway import server
    except ModuleNotFoundError as exc:
        if exc.name not in GATEWAY_PACKAGES:
            raise
        return None
    return server


def _start_gateway(stack: ExitStack, port: int | None) -> str | None:
    """``farm up``'s gateway on loopback, on a thread of this process; its URL (None: not installed)."""
    server = _gateway_side()
    if server is None:
        console.print(r"no HTTP gateway: pip install 'mediafarm\[gateway]' to have `farm up` start one")
        return None
    wanted = get_settings().gateway_port if port is None else port
    try:
        sock = server.bind("127.0.0.1", wanted)
    except OSError as exc:
        sock = server.bind("127.0.0.1", 0)
        console.print(f"port {wanted} is taken ({exc.strerror}); the gateway took {sock.getsockname()[1]}")
    gateway = server.GatewayThread(sock).start()
    stack.callback(gateway.stop)
    return gateway.url


@control.command()
def worker(
    pool: Annotated[str, typer.Option(help="Pool name from config.pools / FARM_CONFIG_FILE")] = "cpu",
    queues: Annotated[str | None, typer.Option(help="Comma-separated queues (default: the pool's)")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Children (default: the pool's)")] = None,
    name: Annotated[
        str | None, typer.Option(help="Node name before @host (default: the pool's), for two workers of a pool")
    ] = None,
    loglevel: str = "INFO",
) -> None:
    """Run one pool's worker against the configured broker (FARM_BROKER_URL)."""
    if name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        fail(f"--name {name!r}: letters, digits, '.', '_' and '-' only (the host is added after '@')")
    try:
        selected = get_pool(pool)
        problems = _worker_side().startup_problems(celery_config(get_settings()))
    except ConfigFileError as exc:
        fail(str(exc))
    if problems:
        fail("refusing to start:\n  - " + "\n  - ".join(problems))
    exec_worker(
        selected, queues=queues.split(",") if queues else None, concurrency=concurrency, loglevel=loglevel,
        node=f"{name}@%h" if name else None,
    )  # fmt: skip


class LocalFarm:
    """An embedded Redis (unless FARM_BROKER_URL is set) and one worker consuming every queue."""

    def __init__(self, stack: ExitStack, *, concurrency: int | None, loglevel: str, quiet: bool) -> None:
        _worker_side()  # before anything starts: the worker would only die of it
        if not get_settings().broker_url:
            redis = stack.enter_context(EmbeddedRedis())
            _settings_env(FARM_BROKER_URL=redis.url, FARM_RESULT_BACKEND=redis.url)
            if not quiet:
                console.print(f"embedded Redis on {redis.url} (data in {redis.data_dir})")
        # The worker gets the storage folder as this process resolved it (an absolute path), so
        # it writes where this shell's `farm submit --out` and any producer will look.
        _settings_env(FARM_STORAGE_DIR=str(get_settings().storage_dir))
        # Only now: the app reads the broker URL set just above.
        from mediafarm.tasks.app import app

        self.app = app
        self.pool = get_pool(get_settings().pool)
        self.logfile = None if not quiet else stack.enter_context(tempfile.TemporaryFile())
        name = f"{self.pool.name}-local-{os.getpid()}"
        # Stopped by SIGTERM, which drains it: its deadline ends before stop_worker's kill, so a job
        # still running is handed back with its checkpoint rather than killed (unless one is given).
        env = {"FARM_DRAIN_SECONDS": str(LOCAL_DRAIN_SECONDS), **os.environ}
        self.process = spawn_worker(
            self.pool, env=env, concurrency=concurrency, loglevel=loglevel, logfile=self.logfile, node=f"{name}@%h"
        )
        stack.callback(stop_worker, self.process)
        self.node = f"{name}@{socket.gethostname()}"
        try:
            wait_ready(app, self.node, self.process, timeout=120)
        except RuntimeError as exc:
            if self.logfile is not None:
                self.logfile.seek(0)
                err.print(self.logfile.read().decode(errors="replace")[-3000:])
            fail(str(exc), code=1)


@control.command()
def up(
    concurrency: Annotated[int | None, typer.Option(help="Children (default: the pool's)")] = None,
    loglevel: str = "INFO",
    gateway: Annotated[bool, typer.Option("--gateway/--no-gateway", help="Serve the HTTP gateway on loopback")] = True,
    gateway_port: Annotated[
        int | None, typer.Option(help="The gateway's port (default FARM_GATEWAY_PORT; a free one if it is taken)")
    ] = None,
) -> None:
    """A local farm: embedded Redis if no broker is configured, one worker on every queue, the HTTP
    gateway on loopback. Ctrl-C stops it."""
    with ExitStack() as stack:
        farm = LocalFarm(stack, concurrency=concurrency, loglevel=loglevel, quiet=False)
        url = _start_gateway(stack, gateway_port) if gateway else None
        queues = expand_queues(farm.pool.queues, registry.default_queues())
        broker = os.environ.get("FARM_BROKER_URL", "")
        console.print(
            f"[green]farm up[/]: worker {farm.node} on {', '.join(queues)}; "
            f"broker {broker}; storage {get_settings().storage_dir}. Ctrl-C to stop."
        )
        if url:
            console.print(f"gateway {url} (API docs at {url}/docs)", highlight=False)
        backend = get_settings().result_backend
        also = f" FARM_RESULT_BACKEND={backend}" if backend and backend != broker else ""
        console.print(f"farm commands in another shell: export FARM_BROKER_URL={broker}{also}", highlight=False,
                      soft_wrap=True)  # fmt: skip
        try:
            code = farm.process.wait()
        except KeyboardInterrupt:
            console.print(f"stopping the worker (draining: running jobs get {LOCAL_DRAIN_SECONDS} s, then go back "
                          "to their queue; Ctrl-C again to kill it) ...")
            code = None
    if code:
        fail(f"the worker exited with code {code}; farm stopped", code=1)
    console.print("farm stopped")


@control.command(name="gateway")
def serve_gateway(
    host: Annotated[str | None, typer.Option(help="Address to listen on (default FARM_GATEWAY_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default FARM_GATEWAY_PORT, 8000; 0 takes a free one)")] = None,
) -> None:
    """Serve the HTTP gateway: jobs over HTTP, events as they happen (docs/gateway.md). Ctrl-C stops it."""
    need_broker()
    server = _gateway_side()
    if server is None:
        fail(r"this install has no HTTP gateway: pip install 'mediafarm\[gateway]'")
    from mediafarm.gateway.settings import GatewayConfig, bind_problem

    settings = get_settings()
    host = settings.gateway_host if host is None else host
    port = settings.gateway_port if port is None else port
    config = GatewayConfig.from_settings(settings)
    problem = bind_problem(host, config) or next(iter(admission_problems()), None)
    if problem:
        fail(problem)
    try:
        sock = server.bind(host, port)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    url = server.url_of(sock)
    access = f"bearer tokens ({len(config.tokens)})" if config.tokens else "loopback clients, no token"
    console.print(f"gateway on {url} (API docs at {url}/docs); serving {access}. Ctrl-C to stop.", highlight=False)
    with suppress(KeyboardInterrupt):  # uvicorn stops in order, then raises the signal again: the plan
        server.serve(sock, config)
    console.print("gateway stopped")


@control.command()
def drain(
    worker: Annotated[
        str, typer.Argument(help="The worker's node name (cpu@host), or the part before @ if one worker has it")
    ],
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until the worker has stopped")] = False,
) -> None:
    """Drain a worker: it takes no new job, gives its running jobs FARM_DRAIN_SECONDS to end, hands
    the rest back to their queues (checkpoints kept, they resume elsewhere) and exits 0."""
    need_broker()
    from mediafarm.tasks.app import app
    from mediafarm.workers.drain_request import NoSuchWorker, find_worker, request_drain, wait_gone

    try:
        node = find_worker(app, worker)
        answer = request_drain(app, node)
    except NoSuchWorker as exc:
        fail(str(exc))
    running = ", ".join(answer["running"]) or "none"
    said = "already draining" if answer["already"] else "draining"
    console.print(f"{node}: {said}; running jobs: {running}; hands back what still runs in {answer['left_s']:g} s",
                  highlight=False)  # fmt: skip
    if wait:
        # Its deadline, then the handback and the stop: a few seconds.
        if not wait_gone(app, node, timeout=float(answer["left_s"]) + 60):
            fail(f"{node} still answers {answer['left_s']:g} s + 60 s after the drain began", code=1)
        console.print(f"{node}: stopped")


@control.command()
def pools(as_json: Annotated[bool, typer.Option("--json", help="The pools and live records as JSON")] = False) -> None:
    """The declared pools, their live workers, what each can run now (the records the workers keep
    in Redis: the queues they consume and leave out, the rungs they can run and why not others), and
    each pool's scaling signal (queued, reserved, running, slots, load)."""
    need_broker()
    from mediafarm.config.pools import get_pools
    from mediafarm.tasks.app import app
    from mediafarm.tasks.producer import scaling
    from mediafarm.tasks.producer.admission import away_errors, queue_depths
    from mediafarm.tasks.wire import capability
    from mediafarm.workers.pools_view import pools_json, print_pools

    try:
        declared = get_pools()
    except ConfigFileError as exc:
        fail(str(exc))
    try:
        records = capability.live(app.backend.client)
        signals = scaling.read_signals(app.backend.client, lambda queues: queue_depths(queues, app))
    except (RedisError, *away_errors()) as exc:
        fail(f"cannot read the workers' records or the queues' depths: {exc}", code=1)
    if as_json:
        print(pools_json(declared, records, signals))
    else:
        print_pools(console, declared, records, signals)


@control.command()
def gc(
    grace: Annotated[float, typer.Option(help="Keep folders changed within this many seconds")] = 3600.0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would go")] = False,
) -> None:
    """Remove artifacts and uploads of jobs whose results have expired (see workers/retention.py for the rule)."""
    need_broker()
    from mediafarm.tasks.app import app

    freed = 0
    count = 0
    settings = get_settings()
    uploads = partial(expired_uploads, settings.uploads_folder, app.backend, ttl=float(app.conf.result_expires))
    objects: Iterable[Removal] = ()
    if settings.storage_url:  # the object store's job folders and uploads, after the local ones
        place, store, ttl = S3Place.parse(settings.storage_url), object_store.store_at(), float(app.conf.result_expires)
        objects = chain(expired_objects(place, store, app.backend, grace=grace),
                        expired_upload_objects(uploads_place(settings.storage_url), store, app.backend, ttl=ttl,
                                               grace=grace))  # fmt: skip
    try:
        for removal in chain(expired(settings.storage_dir, app.backend, grace=grace), uploads(grace=grace), objects):
            console.print(f"{'would remove' if dry_run else 'removed'} {removal.path} ({removal.reason})")
            if not dry_run:
                remove(removal)
            freed += removal.size
            count += 1
    except (WrongBackend, object_store.StoreUnavailable) as exc:
        fail(str(exc), code=1)
    console.print(f"{count} {'to remove' if dry_run else 'removed'}, {freed / 1e6:.1f} MB")


@control.command()
def demo(
    media: Annotated[Path | None, typer.Argument(help="A file to analyse instead of the bundled sample")] = None,
    timeout: float = 300.0,
) -> None:
    """Bring up a local farm, run a VAD job, print the speech spans, shut everything down."""
    source = media or _sample()
    if not source.is_file():
        fail(f"no such file: {source}")
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mediafarm-demo-")))
        (workdir / "media").mkdir()
        target = workdir / "media" / source.name
        shutil.copyfile(source, target)
        _settings_env(FARM_MEDIA_ROOTS=str(workdir / "media"), FARM_STORAGE_DIR=str(workdir / "storage"))
        console.print(f"starting a local farm (worker log hidden) to analyse {source.name} ...")
        LocalFarm(stack, concurrency=1, loglevel="WARNING", quiet=True)
        from mediafarm.tasks.producer.client import submit as submit_job

        job = submit_job("vad", media=str(target))
        console.print(f"submitted VAD job {job.id}")
        try:
            print_envelope(follow(job, timeout), as_json=False)
        except (JobFailed, TimeoutError) as exc:
            fail(str(exc), code=1)
    console.print("[green]demo done[/]: farm stopped cleanly")


if __name__ == "__main__":  # `python -m mediafarm.workers.cli`, as tests and benchmarks run `farm`: all of it
    from mediafarm.cli.app import main

    sys.exit(main())
