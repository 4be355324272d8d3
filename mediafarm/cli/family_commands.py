"""Each family's own ``farm`` commands (``FamilySpec.cli``), mounted when the CLI is built.

The farm's CLI names no family: a family that has commands (TTS: ``farm speakers``) declares a
Typer app in its spec, and :func:`mount` adds it under the app's name, beside the farm's own
commands. Mounting happens when ``cli/app.py`` is imported, so ``farm --help``, every command
and ``typer.main.get_command(cli)`` see the same tree.
"""

from __future__ import annotations

from collections.abc import Iterable

import typer

from mediafarm.tasks.wire.family import FamilySpec


def _given(value: object) -> str | None:
    # Typer keeps a name nobody gave as a DefaultPlaceholder, not None.
    return value if isinstance(value, str) and value else None


def command_names(app: typer.Typer) -> set[str]:
    """The names ``app`` already answers to: its commands and its groups."""
    names = {_given(g.name) or _given(g.typer_instance.info.name) for g in app.registered_groups if g.typer_instance}
    for command in app.registered_commands:
        names.add(_given(command.name) or command.callback.__name__.replace("_", "-"))  # as Typer names it
    return {name for name in names if name}


def mount(app: typer.Typer, specs: Iterable[FamilySpec], reserved: Iterable[str] = ()) -> list[str]:
    """Add each family's commands to ``app``; the names mounted. ``reserved``: names ``app`` answers
    to without having them registered (the process-control commands, loaded when they run).

    Raises:
        ValueError: A family's commands are not a ``typer.Typer``, or would take a name ``app`` (or
            another family) already has.
    """
    taken = command_names(app) | set(reserved)
    mounted = []
    for spec in specs:
        commands = spec.commands()
        if commands is None:
            continue
        if not isinstance(commands, typer.Typer):
            kind = type(commands).__name__
            raise ValueError(f"family {spec.name!r}: cli {spec.cli!r} is of type {kind!r}, not a typer.Typer")
        name = _given(commands.info.name) or spec.name
        if name in taken:
            raise ValueError(f"family {spec.name!r}: its commands would be `farm {name}`, a name the CLI already has")
        app.add_typer(commands, name=name)
        taken.add(name)
        mounted.append(name)
    return mounted
