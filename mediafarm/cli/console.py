"""The consoles every ``farm`` command prints to, and how a command fails.

Exit statuses: 2 is a mistake in the command (or a setting it needs), 1 a job or an operation that
failed, 75 a job the farm refused for now (``jobs.EXIT_OVERLOADED``).
"""

from __future__ import annotations

import typer
from rich.console import Console

from mediafarm.config.settings import get_settings

console = Console()
err = Console(stderr=True)


def fail(message: str, code: int = 2) -> None:
    """Print ``message`` as an error on stderr and exit with ``code``."""
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def need_broker() -> None:
    """Exit naming FARM_BROKER_URL if it is not set: every command that reads or sends jobs needs it."""
    if not get_settings().broker_url:
        fail("FARM_BROKER_URL is not set: point it at the farm's Redis (or run `farm demo`)")
