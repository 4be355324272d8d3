"""``farm submit``, ``farm status``, ``farm cancel``: a producer's commands for one job.

The client (``mediafarm.tasks.producer.client``, and the Celery app it sends with) is imported inside the
commands, once the broker is known to be set, so that ``farm --help`` and a mistyped command never
build the app.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from mediafarm.cli.console import console, fail, need_broker
from mediafarm.cli.job_view import (
    follow,
    print_artifacts,
    print_attempts,
    print_envelope,
    print_trace,
    progress_snapshot,
)
from mediafarm.tasks import registry
from mediafarm.tasks.wire.errors import JobFailed, Overloaded
from mediafarm.tasks.wire.media_urls import is_media_url

# `farm submit`'s exit status when admission control refused the job (EX_TEMPFAIL of sysexits.h:
# try again later); 1 is a job that failed, 2 a mistake in the command.
EXIT_OVERLOADED = 75

# `farm submit`'s own options, and every other --name value as a request field (_field_options).
SUBMIT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def _parse_params(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; a value that parses as JSON is taken as JSON (numbers, lists, true)."""
    fields: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"--param takes key=value, got {pair!r}")
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
            fail(f"unexpected argument {name!r}; request fields go as --name value or -p name=value")
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
    need_broker()
    from mediafarm.tasks.producer.client import submit as submit_job

    fields = _parse_params(param or []) | _field_options(ctx.args)
    if live:
        if f"{family}-live" not in registry.load():
            fail(f"the {family} family has no live form (no {family}-live family)")
        family = f"{family}-live"
    try:
        spec = registry.get(family)
        if argument is not None:
            if spec.cli_argument is None:
                fail(f"the {family} family takes no positional argument; use --param")
            # A relative path means the caller's working directory, not the worker's (a URL is a URL).
            path = spec.cli_argument_is_path and not is_media_url(argument)
            fields[spec.cli_argument] = str(Path(argument).absolute()) if path else argument
        job = submit_job(family, queue=queue, priority=priority, webhook=webhook, webhook_events=webhook_events,
                         **fields)  # fmt: skip
    except Overloaded as exc:
        fail(f"the farm refused the job: {exc}", code=EXIT_OVERLOADED)
    except ValueError as exc:
        fail(str(exc))
    if not (wait or out):
        console.print(job.id)
        return
    if live and timeout == 600.0:  # the default: a stream has no length to wait for
        timeout = None  # type: ignore[assignment]
    try:
        if live and out is not None:
            from mediafarm.cli.live_follow import follow_live

            console.print(f"{job.id}: following {out / 'chunks' / 'playlist.m3u8'}")
            follow_live(job, out, timeout=timeout, on_segment=lambda name: console.print(f"segment {name}"))
        envelope = follow(job, timeout)
    except JobFailed as exc:
        print_attempts(exc.attempts)
        fail(f"{type(exc).__name__}: {exc.reason}", code=1)
    except TimeoutError as exc:
        fail(str(exc), code=1)
    except OSError as exc:  # a segment that cannot be read (the store away, the folder not shared); the job goes on
        fail(f"job {job.id}: {exc} (it goes on: farm status {job.id})", code=1)
    print_envelope(envelope, as_json)
    try:
        _download(job, out, as_json)
    except FileNotFoundError as exc:  # the job succeeded, its files are elsewhere: say where
        fail(str(exc), code=1)


def _download(job: Any, out: Path | None, as_json: bool) -> None:
    """Save a finished job's artifacts to ``--out``: a folder, or a file for its one artifact of that type."""
    if out is not None and out.suffix and not out.is_dir():
        # A file name: the job's one top-level artifact of that kind (`farm submit tts "Hi." --out hi.wav`).
        named = [a.name for a in job.artifacts() if "/" not in a.name and Path(a.name).suffix == out.suffix]
        if len(named) != 1:
            fail(f"--out {out}: the job made {len(named)} top-level {out.suffix} artifacts; give a folder", code=1)
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


def status(job_id: str) -> None:
    """State, progress and attempt history of a job."""
    need_broker()
    from mediafarm.tasks.producer.client import handle

    job = handle(job_id)
    state = job.state()
    console.print(f"{job_id}: {state}")
    progress = job.progress()
    if progress is not None and state not in ("SUCCESS", "FAILURE", "REVOKED"):
        console.print(progress_snapshot(progress))
    print_attempts(job.attempts(), always=True)
    print_artifacts([a.to_json() for a in job.artifacts()])
    if state == "SUCCESS":
        print_trace((job.envelope() or {}).get("trace"))


def cancel(job_id: str) -> None:
    """Cancel a job: a queued one never starts, a running one stops at its next cancellation check."""
    need_broker()
    from mediafarm.tasks.producer.client import handle

    handle(job_id).cancel()
    console.print(f"{job_id}: cancel requested")
