"""``farm``: run a local farm, run one pool's worker, submit jobs and read their state."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

cli = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console()
err = Console(stderr=True)



def _sample() -> Path:
    """The bundled demo clip: three espeak-ng sentences with 1-2.5 s of silence between them."""
    from importlib.resources import files

    return Path(str(files("tasks.media") / "samples" / "speech.ogg"))


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def _settings_env(**values: str) -> None:
    """Set FARM_* variables for this process before the app is imported, and forget cached settings."""
    os.environ.update(values)
    from config.settings import get_settings

    get_settings.cache_clear()


def _print_envelope(envelope: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps(envelope))
        return
    output = envelope.get("output", {})
    console.print(
        f"job [bold]{envelope['job_id']}[/]  variant [bold]{envelope['variant']}[/]  "
        f"model {output.get('model', '?')}  duration {output.get('duration', '?')} s"
        + ("  [yellow](VAD skipped)[/]" if output.get("vad_skipped") else "")
    )
    spans = output.get("spans")
    if spans is not None:
        table = Table("#", "start (s)", "end (s)", "length (s)")
        for i, span in enumerate(spans, 1):
            table.add_row(str(i), f"{span['start']:.2f}", f"{span['end']:.2f}", f"{span['end'] - span['start']:.2f}")
        console.print(table if spans else "no speech found")
    _print_attempts(envelope.get("attempts", []))


def _print_attempts(attempts: list[dict[str, Any]], always: bool = False) -> None:
    if len(attempts) <= 1 and not always:
        return
    table = Table("rung", "variant", "outcome", "reason", "peak RSS MiB", title="attempts")
    for a in attempts:
        table.add_row(str(a["rung"]), a["variant"], str(a["outcome"]), a.get("reason", ""), str(a.get("peak_rss_mb")))
    console.print(table)


@cli.command()
def worker(
    pool: Annotated[str, typer.Option(help="Pool name from config.pools / FARM_CONFIG_FILE")] = "cpu",
    queues: Annotated[str | None, typer.Option(help="Comma-separated queues (default: the pool's)")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Children (default: the pool's)")] = None,
    loglevel: str = "INFO",
) -> None:
    """Run one pool's worker against the configured broker (FARM_BROKER_URL)."""
    from config.celery import celery_config, config_problems
    from config.file import ConfigFileError
    from config.pools import get_pool
    from config.settings import get_settings

    try:
        selected = get_pool(pool)
    except ConfigFileError as exc:
        _fail(str(exc))
    problems = config_problems(celery_config(get_settings()), retry_delay=get_settings().retry_delay)
    if problems:
        _fail("refusing to start, unsafe configuration:\n  - " + "\n  - ".join(problems))
    from workers.pools import exec_worker

    exec_worker(selected, queues=queues.split(",") if queues else None, concurrency=concurrency, loglevel=loglevel)


class LocalFarm:
    """An embedded Redis (unless FARM_BROKER_URL is set) and one worker consuming every queue."""

    def __init__(self, stack: ExitStack, *, concurrency: int | None, loglevel: str, quiet: bool) -> None:
        from config.pools import get_pool
        from config.settings import get_settings
        from workers.embedded import EmbeddedRedis

        if not get_settings().broker_url:
            redis = stack.enter_context(EmbeddedRedis())
            _settings_env(FARM_BROKER_URL=redis.url, FARM_RESULT_BACKEND=redis.url)
            if not quiet:
                console.print(f"embedded Redis on {redis.url} (data in {redis.data_dir})")
        from tasks.app import app
        from workers.pools import spawn_worker, stop_worker, wait_ready

        self.app = app
        self.pool = get_pool(get_settings().pool)
        self.logfile = None if not quiet else stack.enter_context(tempfile.TemporaryFile())
        self.process = spawn_worker(
            self.pool, concurrency=concurrency, loglevel=loglevel, logfile=self.logfile,
            node=f"{self.pool.name}-local-{os.getpid()}@%h",
        )  # fmt: skip
        stack.callback(stop_worker, self.process)
        import socket

        self.node = f"{self.pool.name}-local-{os.getpid()}@{socket.gethostname()}"
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
) -> None:
    """A local farm: embedded Redis if no broker is configured, one worker on every queue. Ctrl-C stops it."""
    with ExitStack() as stack:
        farm = LocalFarm(stack, concurrency=concurrency, loglevel=loglevel, quiet=False)
        console.print(
            f"[green]farm up[/]: worker {farm.node} on {', '.join(farm.pool.queues)}; "
            f"broker {os.environ.get('FARM_BROKER_URL')}. Ctrl-C to stop."
        )
        try:
            code = farm.process.wait()
        except KeyboardInterrupt:
            console.print("stopping the worker (finishing running jobs; Ctrl-C again to kill it) ...")
            code = None
    if code:
        _fail(f"the worker exited with code {code}; farm stopped", code=1)
    console.print("farm stopped")


@cli.command()
def submit(
    family: Annotated[str, typer.Argument(help="vad, yolo, tts or subtitle")],
    media: Annotated[str, typer.Argument(help="Input file (must lie inside FARM_MEDIA_ROOTS)")],
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait for the result")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait")] = 600.0,
    queue: Annotated[str | None, typer.Option(help="Queue override, e.g. gpu0.vad")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result envelope as JSON")] = False,
) -> None:
    """Submit a job to the configured broker; print its id, or its result with --wait."""
    from config.settings import get_settings

    if not get_settings().broker_url:
        _fail("FARM_BROKER_URL is not set: point it at the farm's Redis (or run `farm demo`)")
    from tasks.client import submit as submit_job
    from tasks.errors import JobFailed

    try:
        job = submit_job(family, queue=queue, media=str(Path(media).absolute()))
    except ValueError as exc:
        _fail(str(exc))
    if not wait:
        console.print(job.id)
        return
    try:
        _print_envelope(job.wait(timeout=timeout), as_json)
    except JobFailed as exc:
        _print_attempts(exc.attempts)
        _fail(f"{type(exc).__name__}: {exc.reason}", code=1)
    except TimeoutError as exc:
        _fail(str(exc), code=1)


@cli.command()
def status(job_id: str) -> None:
    """State and attempt history of a job."""
    from tasks.client import handle

    job = handle(job_id)
    console.print(f"{job_id}: {job.state()}")
    _print_attempts(job.attempts(), always=True)


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
        from tasks.client import submit as submit_job
        from tasks.errors import JobFailed

        job = submit_job("vad", media=str(target))
        console.print(f"submitted VAD job {job.id}")
        try:
            _print_envelope(job.wait(timeout=timeout), as_json=False)
        except (JobFailed, TimeoutError) as exc:
            _fail(str(exc), code=1)
    console.print("[green]demo done[/]: farm stopped cleanly")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> None:
    # SIGTERM (a supervisor, `docker stop`) stops `farm up` the same orderly way as Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupt)
    cli()


if __name__ == "__main__":
    sys.exit(main())
