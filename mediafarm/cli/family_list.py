"""``farm families``: what the farm runs, as a producer sees it before submitting.

What the table needs beyond the registry is imported when the command runs: every ``farm`` command
builds the app that registers this one.
"""

from __future__ import annotations

from rich.table import Table

from mediafarm.cli.console import console
from mediafarm.config.settings import get_settings
from mediafarm.tasks import registry


def list_families() -> None:
    """The job families this farm knows: task name, queue, ladder (with the languages each rung
    speaks or recognises, and its fallbacks), time limits, rung breakers (the open ones, and the
    failures of each rung by cause: counted against its breaker or not), and whether a job
    resumes from its checkpoint after a lost attempt."""
    from mediafarm.cli.breaker_view import policy_cell, print_open_breakers
    from mediafarm.tasks.runtime.ladder_choice import is_fallback
    from mediafarm.tasks.wire.languages import rung_languages_note

    models_dir = get_settings().models_dir

    table = Table("family", "task", "queue", "ladder", "limits soft/hard (s)", "breaker", "after a lost attempt", "description")
    for spec in registry.load().values():
        ladder = registry.ladder_for(spec)
        limits = registry.limits_for(spec)
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
