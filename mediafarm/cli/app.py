"""``farm``: run a local farm, run one pool's worker, submit jobs and follow them, clean up storage.

The one ``farm`` app (pyproject's [project.scripts] names :func:`main`). The producer commands are
built here from this package; the process-control commands are the ``control`` app of
``workers/cli.py``, imported by name the first time one of them is looked up (it runs, or ``farm
--help`` lists it), so that ``farm submit`` loads no worker module. A family's own commands (TTS's
``farm speakers``) come from its spec and are mounted here when this module is built
(``family_commands.py``).
"""

from __future__ import annotations

import signal
import sys
from typing import Any

import typer

from mediafarm.cli import family_list, jobs, webhooks
from mediafarm.cli.console import err
from mediafarm.cli.family_commands import mount
from mediafarm.cli.lazy_commands import lazy_group
from mediafarm.config.file import ConfigFileError
from mediafarm.tasks import registry

# The commands that run or steer the farm's processes, and where they are (checked against that
# app when it is loaded, and by tests/cli/test_app.py).
CONTROL = "mediafarm.workers.cli:control"
CONTROL_COMMANDS = ("worker", "up", "gateway", "drain", "pools", "gc", "demo")
# `farm --help` lists the farm's commands in this order, the families' own after them.
HELP_ORDER = ("worker", "up", "gateway", "submit", "status", "cancel", "webhooks", "drain", "families", "pools",
              "gc", "demo")  # fmt: skip

cli = typer.Typer(
    cls=lazy_group(CONTROL, CONTROL_COMMANDS, HELP_ORDER), add_completion=False, no_args_is_help=True,
    help=__doc__.split("\n")[0],
)  # fmt: skip
cli.command(context_settings=jobs.SUBMIT_SETTINGS)(jobs.submit)
cli.command()(jobs.status)
cli.command()(jobs.cancel)
cli.command(name="webhooks")(webhooks.webhooks)
cli.command(name="families")(family_list.list_families)


def _mount_family_commands() -> str | None:
    """Mount each family's own commands (``FamilySpec.cli``: ``farm speakers``); what went wrong, if anything.

    Done as this module is built, so that ``farm --help``, the commands and Typer's command tree
    agree. A registry that does not load (a module of FARM_FAMILY_MODULES that does not import, a
    bad FARM_* value) leaves the family commands out: the farm's own commands still run and name
    the problem, and :func:`main` says why the family commands are missing.
    """
    try:
        mount(cli, registry.load().values(), reserved=CONTROL_COMMANDS)
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
