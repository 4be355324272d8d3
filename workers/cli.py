"""``farm``: run a local farm, run one pool's worker, submit jobs and follow them, clean up storage.

The Celery app (``mediafarm.tasks.app``, and the client built on it) is imported inside the
commands on purpose: ``farm up`` and ``farm demo`` set FARM_* variables before the app reads them.
So is the worker side (``workers.guards``: psutil, prometheus-client), which a producer's core
install lacks: ``farm submit`` and the other client commands run without it, and the commands
that start a worker name the extra that brings it. A family's own commands (TTS's ``farm speakers``)
come from its spec and are mounted here when this module is built (``workers/family_commands.py``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
from contextlib import ExitStack, suppress
from functools import partial
from importlib.resources import files
from itertools import chain
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import typer
from redis.exceptions import RedisError
from rich.console import Console
from rich.progress import BarColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as ProgressBar
from rich.table import Table

from mediafarm.config.admission import admission_problems
from mediafarm.config.celery import celery_config
from mediafarm.config.file import ConfigFileError
from mediafarm.config.pools import expand_queues, get_pool
from mediafarm.config.settings import get_settings
from mediafarm.tasks import families
from mediafarm.tasks.errors import JobFailed, Overloaded
from mediafarm.workers.embedded import EmbeddedRedis
from mediafarm.workers import webhook_commands
from mediafarm.workers.family_commands import mount
from mediafarm.workers.launch import exec_worker, spawn_worker, stop_worker, wait_ready
from mediafarm.workers.retention import WrongBackend, expired, expired_uploads, remove

# Imported by the worker side only (the `worker` extra): a producer's install has none of them.
WORKER_PACKAGES = ("psutil", "prometheus_client", "standardwebhooks")
# Imported by the HTTP gateway only (the `gateway` extra).
GATEWAY_PACKAGES = ("fastapi", "starlette", "uvicorn", "sse_starlette", "python_multipart")

cli = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])
console = Console()
err = Console(stderr=True)


def _sample() -> Path:
    """The bundled demo clip: three espeak-ng sentences with 1-2.5 s of silence between them."""
    return Path(str(files("mediafarm.tasks.media") / "samples" / "speech.ogg"))


# The drain deadline of `farm up`'s worker, under the 30 s stop_worker gives it before a kill.
LOCAL_DRAIN_SECONDS = 20

# `farm submit`'s exit status when admission control refused the job (EX_TEMPFAIL of sysexits.h:
# try again later); 1 is a job that failed, 2 a mistake in the command.
EXIT_OVERLOADED = 75


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


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
        _fail(
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


def _need_broker() -> None:
    if not get_settings().broker_url:
        _fail("FARM_BROKER_URL is not set: point it at the farm's Redis (or run `farm demo`)")


def _print_envelope(envelope: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps(envelope))
        return
    spec = families.get(envelope["family"])
    result = spec.parse_result(envelope.get("output", {}))
    console.print(f"job [bold]{envelope['job_id']}[/]  variant [bold]{envelope['variant']}[/]  {spec.summary(result)}")
    rendered = spec.render(result)
    if rendered is not None:
        console.print(rendered)
    _print_attempts(envelope.get("attempts", []))
    _print_artifacts(envelope.get("artifacts", []))


def _print_attempts(attempts: list[dict[str, Any]], always: bool = False) -> None:
    if len(attempts) <= 1 and not always:
        return
    table = Table("rung", "variant", "outcome", "reason", "against the rung", "peak RSS MiB", title="attempts")
    for a in attempts:
        # An open attempt is running (or its process died and the next run will settle it).
        outcome = "running" if a.get("outcome") is None else str(a["outcome"])
        peak = a.get("peak_rss_mb")
        # Whether a failure counted against the rung's breaker, and why (tasks.attribution).
        judged = "" if a.get("counted") is None else f"{'counted' if a['counted'] else 'not counted'}: {a.get('cause')}"
        table.add_row(str(a["rung"]), a["variant"], outcome, a.get("reason") or "", judged,
                      "" if peak is None else str(peak))  # fmt: skip
    console.print(table)


def _print_artifacts(artifacts: list[dict[str, Any]]) -> None:
    if not artifacts:
        return
    table = Table("artifact", "bytes", "type", "sha256", title="artifacts")
    for a in artifacts:
        table.add_row(a["name"], str(a["size"]), a["media_type"], a["sha256"][:16] + "…")
    console.print(table)


def _parse_params(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; a value that parses as JSON is taken as JSON (numbers, lists, true)."""
    fields: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            _fail(f"--param takes key=value, got {pair!r}")
        try:
            fields[key] = json.loads(value)
        except json.JSONDecodeError:
            fields[key] = value
    return fields


def _field_options(args: list[str]) -> dict[str, Any]:
    """``--some-field value`` (or ``--flag`` alone, meaning true) → request fields, values as in -p."""
    pairs: list[str] = []
    i = 0
    while i < len(args):
        name = args[i]
        if not name.startswith("--") or len(name) < 3:
            _fail(f"unexpected argument {name!r}; request fields go as --name value or -p name=value")
        key = name[2:].replace("-", "_")
        if "=" in key:
            pairs.append(key)
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append(f"{key}={args[i + 1]}")
            i += 2
        else:
            pairs.append(f"{key}=true")
            i += 1
    return _parse_params(pairs)


def _progress_detail(progress: Any) -> str:
    """``whisper-tiny recognise  312 s of media``: the rung, the stage, how far into the media."""
    detail = f"{progress.variant} {progress.stage}".strip()
    if progress.media_seconds is not None:
        detail += f"  {progress.media_seconds:.0f} s of media"
    return detail


def _follow(job: Any, timeout: float) -> dict[str, Any]:
    """Wait for a job with a progress bar (on a terminal; plain waiting otherwise)."""
    if not console.is_terminal:
        return job.wait(timeout=timeout)
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[detail]}"))  # fmt: skip
    with ProgressBar(*columns, console=console, transient=True) as bar:
        task = bar.add_task(f"job {job.id[:8]}", total=1.0, detail="queued")

        def show(progress: Any) -> None:
            bar.update(task, completed=progress.fraction or 0.0, detail=_progress_detail(progress))

        return job.wait(timeout=timeout, poll=0.25, on_progress=show)


@cli.command()
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
        _fail(f"--name {name!r}: letters, digits, '.', '_' and '-' only (the host is added after '@')")
    try:
        selected = get_pool(pool)
        problems = _worker_side().startup_problems(celery_config(get_settings()))
    except ConfigFileError as exc:
        _fail(str(exc))
    if problems:
        _fail("refusing to start:\n  - " + "\n  - ".join(problems))
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
            _fail(str(exc), code=1)


@cli.command()
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
        queues = expand_queues(farm.pool.queues, families.default_queues())
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
        _fail(f"the worker exited with code {code}; farm stopped", code=1)
    console.print("farm stopped")


@cli.command(name="gateway")
def serve_gateway(
    host: Annotated[str | None, typer.Option(help="Address to listen on (default FARM_GATEWAY_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default FARM_GATEWAY_PORT, 8000; 0 takes a free one)")] = None,
) -> None:
    """Serve the HTTP gateway: jobs over HTTP, events as they happen (docs/gateway.md). Ctrl-C stops it."""
    _need_broker()
    server = _gateway_side()
    if server is None:
        _fail(r"this install has no HTTP gateway: pip install 'mediafarm\[gateway]'")
    from mediafarm.gateway.settings import GatewayConfig, bind_problem

    settings = get_settings()
    host = settings.gateway_host if host is None else host
    port = settings.gateway_port if port is None else port
    config = GatewayConfig.from_settings(settings)
    problem = bind_problem(host, config) or next(iter(admission_problems()), None)
    if problem:
        _fail(problem)
    try:
        sock = server.bind(host, port)
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    url = server.url_of(sock)
    access = f"bearer tokens ({len(config.tokens)})" if config.tokens else "loopback clients, no token"
    console.print(f"gateway on {url} (API docs at {url}/docs); serving {access}. Ctrl-C to stop.", highlight=False)
    with suppress(KeyboardInterrupt):  # uvicorn stops in order, then raises the signal again: the plan
        server.serve(sock, config)
    console.print("gateway stopped")


@cli.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(
    ctx: typer.Context,
    family: Annotated[str, typer.Argument(help="Job family (`farm families` lists them)")],
    argument: Annotated[str | None, typer.Argument(help="The family's main input, e.g. the media file")] = None,
    param: Annotated[list[str] | None, typer.Option("--param", "-p", help="Another request field, key=value")] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait for the result, with progress")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait")] = 600.0,
    queue: Annotated[str | None, typer.Option(help="Queue override, e.g. gpu0.vad")] = None,
    priority: Annotated[int, typer.Option(min=0, max=9, help="0-9, higher runs first")] = 4,
    webhook: Annotated[str | None, typer.Option(help="A URL the farm posts the job's events to, signed")] = None,
    webhook_events: Annotated[
        str | None, typer.Option(help="Which events, comma-separated: start, progress, attempt, completed (default)")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Folder to download the job's artifacts to, or a file (speech.wav) for the one top-level "
                     "artifact with its extension (implies --wait)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result envelope as JSON")] = False,
    live: Annotated[
        bool,
        typer.Option("--live", help="ARGUMENT is a live stream URL: run the family's live form (subtitle -> "
                     "subtitle-live); with --out, copy its segments and playlist there as they are written, "
                     "waiting without limit unless --timeout is given"),
    ] = False,
) -> None:
    """Submit a job to the configured broker; print its id, or its result with --wait.

    Request fields go as -p key=value, or as options of their own: --formats vtt,srt. A job the
    farm refuses (admission control: too many waiting, memory pressure) exits with status 75.
    """
    _need_broker()
    from mediafarm.tasks.client import submit as submit_job

    fields = _parse_params(param or []) | _field_options(ctx.args)
    if live:
        if f"{family}-live" not in families.load():
            _fail(f"the {family} family has no live form (no {family}-live family)")
        family = f"{family}-live"
    try:
        spec = families.get(family)
        if argument is not None:
            if spec.cli_argument is None:
                _fail(f"the {family} family takes no positional argument; use --param")
            # A relative path means the caller's working directory, not the worker's.
            path = spec.cli_argument_is_path
            fields[spec.cli_argument] = str(Path(argument).absolute()) if path else argument
        job = submit_job(family, queue=queue, priority=priority, webhook=webhook, webhook_events=webhook_events,
                         **fields)  # fmt: skip
    except Overloaded as exc:
        _fail(f"the farm refused the job: {exc}", code=EXIT_OVERLOADED)
    except ValueError as exc:
        _fail(str(exc))
    if not (wait or out):
        console.print(job.id)
        return
    if live and timeout == 600.0:  # the default: a stream has no length to wait for
        timeout = None  # type: ignore[assignment]
    try:
        if live and out is not None:
            from mediafarm.workers.live_follow import follow_live

            console.print(f"{job.id}: following {out / 'chunks' / 'playlist.m3u8'}")
            follow_live(job, out, timeout=timeout, on_segment=lambda name: console.print(f"segment {name}"))
        envelope = _follow(job, timeout)
    except JobFailed as exc:
        _print_attempts(exc.attempts)
        _fail(f"{type(exc).__name__}: {exc.reason}", code=1)
    except TimeoutError as exc:
        _fail(str(exc), code=1)
    _print_envelope(envelope, as_json)
    try:
        _download(job, out, as_json)
    except FileNotFoundError as exc:  # the job succeeded, its files are elsewhere: say where
        _fail(str(exc), code=1)


def _download(job: Any, out: Path | None, as_json: bool) -> None:
    """Save a finished job's artifacts to ``--out``: a folder, or a file for its one artifact of that type."""
    if out is not None and out.suffix and not out.is_dir():
        # A file name: the job's one top-level artifact of that kind (`farm submit tts "Hi." --out hi.wav`).
        named = [a.name for a in job.artifacts() if "/" not in a.name and Path(a.name).suffix == out.suffix]
        if len(named) != 1:
            _fail(f"--out {out}: the job made {len(named)} top-level {out.suffix} artifacts; give a folder", code=1)
        out.parent.mkdir(parents=True, exist_ok=True)
        target = job.download(named[0], out)
        if not as_json:
            console.print(f"saved {target}")
    elif out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for artifact in job.artifacts():
            target = job.download(artifact.name, out / artifact.name)
            if not as_json:
                console.print(f"saved {target}")


@cli.command()
def status(job_id: str) -> None:
    """State, progress and attempt history of a job."""
    _need_broker()
    from mediafarm.tasks.client import handle

    job = handle(job_id)
    state = job.state()
    console.print(f"{job_id}: {state}")
    progress = job.progress()
    if progress is not None and state not in ("SUCCESS", "FAILURE", "REVOKED"):
        bar = ProgressBar(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), console=console)
        bar.add_task(_progress_detail(progress), total=1.0, completed=progress.fraction or 0.0)
        console.print(bar.get_renderable())
    _print_attempts(job.attempts(), always=True)
    _print_artifacts([a.to_json() for a in job.artifacts()])


@cli.command()
def cancel(job_id: str) -> None:
    """Cancel a job: a queued one never starts, a running one stops at its next cancellation check."""
    _need_broker()
    from mediafarm.tasks.client import handle

    handle(job_id).cancel()
    console.print(f"{job_id}: cancel requested")


cli.command(name="webhooks")(webhook_commands.webhooks)


@cli.command()
def drain(
    worker: Annotated[
        str, typer.Argument(help="The worker's node name (cpu@host), or the part before @ if one worker has it")
    ],
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until the worker has stopped")] = False,
) -> None:
    """Drain a worker: it takes no new job, gives its running jobs FARM_DRAIN_SECONDS to end, hands
    the rest back to their queues (checkpoints kept, they resume elsewhere) and exits 0."""
    _need_broker()
    from mediafarm.tasks.app import app
    from mediafarm.workers.drain_request import NoSuchWorker, find_worker, request_drain, wait_gone

    try:
        node = find_worker(app, worker)
        answer = request_drain(app, node)
    except NoSuchWorker as exc:
        _fail(str(exc))
    running = ", ".join(answer["running"]) or "none"
    said = "already draining" if answer["already"] else "draining"
    console.print(f"{node}: {said}; running jobs: {running}; hands back what still runs in {answer['left_s']:g} s",
                  highlight=False)  # fmt: skip
    if wait:
        # Its deadline, then the handback and the stop: a few seconds.
        if not wait_gone(app, node, timeout=float(answer["left_s"]) + 60):
            _fail(f"{node} still answers {answer['left_s']:g} s + 60 s after the drain began", code=1)
        console.print(f"{node}: stopped")


@cli.command(name="families")
def list_families() -> None:
    """The job families this farm knows: task name, queue, ladder (with the languages each rung
    speaks or recognises, and its fallbacks), time limits, rung breakers (the open ones, and the
    failures of each rung by cause: counted against its breaker or not), and whether a job
    resumes from its checkpoint after a lost attempt."""
    from mediafarm.tasks.ladder_choice import is_fallback
    from mediafarm.tasks.languages import rung_languages_note
    from mediafarm.workers.breaker_view import policy_cell, print_open_breakers

    models_dir = get_settings().models_dir

    table = Table("family", "task", "queue", "ladder", "limits soft/hard (s)", "breaker", "after a lost attempt", "description")
    for spec in families.load().values():
        ladder = families.ladder_for(spec)
        limits = families.limits_for(spec)
        rungs = " → ".join(
            f"{v.name}{' (GPU)' if v.device == 'cuda' else ''}{' (fallback)' if is_fallback(v, spec.engines) else ''}"
            f"{rung_languages_note(spec, v, models_dir)}"
            for v in ladder.rungs
        )
        resume = spec.resume.rule if spec.resume is not None else "starts over"
        table.add_row(spec.name, spec.task_name, spec.queue, rungs, f"{limits.soft}/{limits.hard}, stall {limits.stall}",
                      policy_cell(ladder), resume, spec.description)  # fmt: skip
    console.print(table)
    print_open_breakers(console)


@cli.command()
def pools(as_json: Annotated[bool, typer.Option("--json", help="The pools and live records as JSON")] = False) -> None:
    """The declared pools, their live workers, what each can run now (the records the workers keep
    in Redis: the queues they consume and leave out, the rungs they can run and why not others), and
    each pool's scaling signal (queued, reserved, running, slots, load)."""
    _need_broker()
    from mediafarm.config.pools import get_pools
    from mediafarm.tasks import capability, scaling
    from mediafarm.tasks.admission import away_errors, queue_depths
    from mediafarm.tasks.app import app
    from mediafarm.workers.pools_view import pools_json, print_pools

    try:
        declared = get_pools()
    except ConfigFileError as exc:
        _fail(str(exc))
    try:
        records = capability.live(app.backend.client)
        signals = scaling.read_signals(app.backend.client, lambda queues: queue_depths(queues, app))
    except (RedisError, *away_errors()) as exc:
        _fail(f"cannot read the workers' records or the queues' depths: {exc}", code=1)
    if as_json:
        print(pools_json(declared, records, signals))
    else:
        print_pools(console, declared, records, signals)


@cli.command()
def gc(
    grace: Annotated[float, typer.Option(help="Keep folders changed within this many seconds")] = 3600.0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would go")] = False,
) -> None:
    """Remove artifacts and uploads of jobs whose results have expired (see workers/retention.py for the rule)."""
    _need_broker()
    from mediafarm.tasks.app import app

    freed = 0
    count = 0
    settings = get_settings()
    uploads = partial(expired_uploads, settings.uploads_folder, app.backend, ttl=float(app.conf.result_expires))
    try:
        for removal in chain(expired(settings.storage_dir, app.backend, grace=grace), uploads(grace=grace)):
            console.print(f"{'would remove' if dry_run else 'removed'} {removal.path} ({removal.reason})")
            if not dry_run:
                remove(removal)
            freed += removal.size
            count += 1
    except WrongBackend as exc:
        _fail(str(exc), code=1)
    console.print(f"{count} {'to remove' if dry_run else 'removed'}, {freed / 1e6:.1f} MB")


@cli.command()
def demo(
    media: Annotated[Path | None, typer.Argument(help="A file to analyse instead of the bundled sample")] = None,
    timeout: float = 300.0,
) -> None:
    """Bring up a local farm, run a VAD job, print the speech spans, shut everything down."""
    source = media or _sample()
    if not source.is_file():
        _fail(f"no such file: {source}")
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mediafarm-demo-")))
        (workdir / "media").mkdir()
        target = workdir / "media" / source.name
        shutil.copyfile(source, target)
        _settings_env(FARM_MEDIA_ROOTS=str(workdir / "media"), FARM_STORAGE_DIR=str(workdir / "storage"))
        console.print(f"starting a local farm (worker log hidden) to analyse {source.name} ...")
        LocalFarm(stack, concurrency=1, loglevel="WARNING", quiet=True)
        from mediafarm.tasks.client import submit as submit_job

        job = submit_job("vad", media=str(target))
        console.print(f"submitted VAD job {job.id}")
        try:
            _print_envelope(_follow(job, timeout), as_json=False)
        except (JobFailed, TimeoutError) as exc:
            _fail(str(exc), code=1)
    console.print("[green]demo done[/]: farm stopped cleanly")


def _mount_family_commands() -> str | None:
    """Mount each family's own commands (``FamilySpec.cli``: ``farm speakers``); what went wrong, if anything.

    Done as this module is built, so that ``farm --help``, the commands and Typer's command tree
    agree. A registry that does not load (a module of FARM_FAMILY_MODULES that does not import, a
    bad FARM_* value) leaves the family commands out: the farm's own commands still run and name
    the problem, and :func:`main` says why the family commands are missing.
    """
    try:
        mount(cli, families.load().values())
    except (ConfigFileError, ImportError, ValueError) as exc:
        return str(exc)
    return None


_FAMILY_COMMANDS_PROBLEM = _mount_family_commands()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> None:
    # SIGTERM (a supervisor, `docker stop`) stops `farm up` the same orderly way as Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupt)
    if _FAMILY_COMMANDS_PROBLEM:
        err.print(f"[yellow]warning:[/] the families' own commands are not available: {_FAMILY_COMMANDS_PROBLEM}",
                  highlight=False)  # fmt: skip
    cli()


if __name__ == "__main__":
    sys.exit(main())
