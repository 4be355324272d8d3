"""The one `farm` app: its producer commands built here, the process-control ones loaded by name from
workers/cli.py when they are looked up, in one list and one help order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import typer
from typer.main import get_command, get_group

from mediafarm.cli.app import CONTROL_COMMANDS, HELP_ORDER, cli
from mediafarm.cli.family_commands import mount
from mediafarm.cli.lazy_commands import LazyCommands
from tests.conftest import REPO
from tests.tasks.test_family import make_spec

# Targets for the refusals below: a family's commands named as a process-control command, and a
# control app with one command more than its lazy entry declares.
named_gc = typer.Typer(name="gc")
two_commands = typer.Typer()


@two_commands.command()
def one() -> None: ...


@two_commands.command()
def more() -> None: ...


def test_the_declared_control_commands_are_the_control_apps_and_help_lists_every_command_once() -> None:
    from mediafarm.workers.cli import control

    assert list(get_group(control).commands) == list(CONTROL_COMMANDS)
    tree = get_command(cli).commands
    farm_own = [name for name in tree if name in HELP_ORDER]
    assert farm_own == list(HELP_ORDER)  # every command of the farm, in the help's order
    assert list(tree)[: len(HELP_ORDER)] == list(HELP_ORDER)  # the families' own after them
    assert {"speakers", "toy"} <= set(tree) - set(HELP_ORDER)


def loaded_after_lookup(*names: str) -> set[str]:
    """The farm modules a fresh interpreter has after building `farm`'s tree and looking up ``names``."""
    code = textwrap.dedent(f"""
        import json, sys
        from typer.main import get_command
        from mediafarm.cli.app import cli
        group = get_command(cli)
        for name in {list(names)!r}:
            assert group.commands[name].name == name
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("mediafarm."))))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_a_producer_command_is_looked_up_without_the_control_module_and_a_control_command_loads_it() -> None:
    producer = loaded_after_lookup("submit", "status", "families", "webhooks", "speakers")
    assert "mediafarm.cli.jobs" in producer and not [m for m in producer if m.startswith("mediafarm.workers")]
    control = loaded_after_lookup("gc")
    assert "mediafarm.workers.cli" in control


def test_a_familys_commands_may_not_take_a_control_commands_name() -> None:
    app = typer.Typer()
    with pytest.raises(ValueError, match="would be `farm gc`, a name the CLI already has"):
        mount(app, [make_spec(cli="tests.cli.test_app:named_gc")], reserved=CONTROL_COMMANDS)


def test_lazy_commands_load_the_targets_commands_once_and_refuse_other_commands_than_declared() -> None:
    commands = LazyCommands({}, "tests.cli.test_app:two_commands", ["more", "one"], order=["one"])
    assert list(commands) == ["one", "more"] and len(commands) == 2  # named before anything is imported
    assert commands["more"].name == "more" and commands["one"].name == "one"
    assert commands["one"] is commands["one"]  # built once
    wrong = LazyCommands({}, "tests.cli.test_app:two_commands", ["one"])
    with pytest.raises(RuntimeError, match=r"has the commands \['more', 'one'\], not \['one'\]"):
        wrong["one"]
