"""How a job is shown in a terminal: its result envelope, attempts and artifacts, and a progress bar
while it runs. Used by ``farm submit`` and ``farm status``, and by ``farm demo`` (``workers/cli.py``)."""

from __future__ import annotations

import json
from typing import Any

from rich.progress import BarColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as ProgressBar
from rich.table import Table

from mediafarm.cli.console import console
from mediafarm.tasks import registry


def print_envelope(envelope: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps(envelope))
        return
    spec = registry.get(envelope["family"])
    result = spec.parse_result(envelope.get("output", {}))
    console.print(f"job [bold]{envelope['job_id']}[/]  rung [bold]{envelope['rung']}[/]  {spec.summary(result)}")
    rendered = spec.render(result)
    if rendered is not None:
        console.print(rendered)
    print_attempts(envelope.get("attempts", []))
    print_artifacts(envelope.get("artifacts", []))
    print_trace(envelope.get("trace"))


def print_trace(trace: Any) -> None:
    line = trace_line(trace)
    if line is not None:
        console.print(line, highlight=False)


def trace_line(trace: Any) -> str | None:
    """The worker's side of a job's trace (``tasks.wire.trace``) in one line: each step's own time and
    the Redis round trips it made, ``child`` counted from the send. None where the envelope has none."""
    from mediafarm.tasks.wire.trace import Trace

    if not isinstance(trace, dict):
        return None
    try:
        spans = list(Trace.from_json(trace).spans())
    except (KeyError, TypeError, ValueError):
        return None  # a trace this version cannot read: the job is shown without it
    parts = [f"{step} {seconds * 1000:.1f} ms" + (f" ({trips} round trip{'' if trips == 1 else 's'})" if trips else "")
             for step, seconds, trips in spans]  # fmt: skip
    return "trace: " + " · ".join(parts) if parts else None


def print_attempts(attempts: list[dict[str, Any]], always: bool = False) -> None:
    if len(attempts) <= 1 and not always:
        return
    table = Table("#", "rung", "outcome", "reason", "against the rung", "peak RSS MiB", "ran on", title="attempts")
    for a in attempts:
        # An open attempt is running (or its process died and the next run will settle it).
        outcome = "running" if a.get("outcome") is None else str(a["outcome"])
        peak = a.get("peak_rss_mb")
        # Whether a failure counted against the rung's breaker, and why (tasks.runtime.attribution).
        judged = "" if a.get("counted") is None else f"{'counted' if a['counted'] else 'not counted'}: {a.get('cause')}"
        table.add_row(str(a["rung_index"]), a["rung"], outcome, a.get("reason") or "", judged,
                      "" if peak is None else str(peak), a.get("worker") or "")  # fmt: skip
    console.print(table)
    # Why the submit sent the job to the pool it first ran on (tasks.producer.routing), kept in its first attempt.
    if attempts and attempts[0].get("route"):
        console.print(f"routed: {attempts[0]['route']}")


def print_artifacts(artifacts: list[dict[str, Any]]) -> None:
    if not artifacts:
        return
    table = Table("artifact", "bytes", "type", "sha256", title="artifacts")
    for a in artifacts:
        table.add_row(a["name"], str(a["size"]), a["media_type"], a["sha256"][:16] + "…")
    console.print(table)


def progress_detail(progress: Any) -> str:
    """``whisper-tiny recognise  312 s of media``: the rung, the stage, how far into the media."""
    detail = f"{progress.rung} {progress.stage}".strip()
    if progress.media_seconds is not None:
        detail += f"  {progress.media_seconds:.0f} s of media"
    return detail


def progress_snapshot(progress: Any) -> Any:
    """A one-off bar of ``progress`` (``farm status``), to print once."""
    bar = ProgressBar(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), console=console)
    bar.add_task(progress_detail(progress), total=1.0, completed=progress.fraction or 0.0)
    return bar.get_renderable()


def follow(job: Any, timeout: float) -> dict[str, Any]:
    """Wait for a job with a progress bar (on a terminal; plain waiting otherwise)."""
    if not console.is_terminal:
        return job.wait(timeout=timeout)
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[detail]}"))  # fmt: skip
    with ProgressBar(*columns, console=console, transient=True) as bar:
        task = bar.add_task(f"job {job.id[:8]}", total=1.0, detail="queued")

        def show(progress: Any) -> None:
            bar.update(task, completed=progress.fraction or 0.0, detail=progress_detail(progress))

        return job.wait(timeout=timeout, poll=0.25, on_progress=show)
