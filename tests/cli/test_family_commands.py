"""A family's own `farm` commands (FamilySpec.cli) are mounted when the CLI is built, under their name."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer
from typer.main import get_command

from mediafarm.cli.app import cli
from mediafarm.cli.family_commands import command_names, mount
from mediafarm.tasks import registry
from tests.conftest import REPO
from tests.tasks.test_family import make_spec

# Targets of FamilySpec.cli for the refusals below.
submit_again = typer.Typer(name="submit")
not_a_typer = object()


def test_the_cli_tree_holds_every_familys_commands_beside_the_farms() -> None:
    tree = get_command(cli).commands
    assert {"submit", "families", "gc"} <= set(tree)  # the walk itself works
    assert set(tree["speakers"].commands) == {"add", "list", "rm"}  # TTS's, named by its Typer
    assert set(tree["toy"].commands) == {"count"}  # the test family's, named after the family
    declared = {s.name for s in registry.load().values() if s.cli}
    assert declared == {"tts", "toy"}


def test_a_familys_command_runs_under_its_name() -> None:
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "mediafarm.cli", "toy", "count", "one two three"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "3 words", proc.stdout + proc.stderr


def test_commands_that_would_shadow_a_name_or_are_no_typer_app_are_refused() -> None:
    app = typer.Typer()

    @app.command()
    def submit() -> None: ...

    @app.command(name="families")
    def list_families() -> None: ...

    assert command_names(app) == {"submit", "families"}
    with pytest.raises(ValueError, match="would be `farm submit`, a name the CLI already has"):
        mount(app, [make_spec(cli="tests.cli.test_family_commands:submit_again")])
    with pytest.raises(ValueError, match="is of type .object., not a typer.Typer"):
        mount(app, [make_spec(cli="tests.cli.test_family_commands:not_a_typer")])
    assert mount(app, [make_spec()]) == []  # no cli: nothing mounted


def test_a_malformed_cli_target_is_refused_when_the_spec_is_built() -> None:
    with pytest.raises(ValueError, match="must be 'module:attribute'"):
        make_spec(cli="tests.cli.test_family_commands")
