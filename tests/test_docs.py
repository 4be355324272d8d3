"""The docs hold what a newcomer can follow: every `farm` command they write exists with the options
they give it, every Python block compiles and imports what exists, the README's test command is the
one CI runs, no doc names a path of one machine or a package index, and every relative link leads
to a file. (The tour and the worked family run for real in tests/integration/test_docs_run.py.)
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from tests.conftest import REPO
from tests.support.docs import LINK, code_blocks, doc_files, farm_commands, marked, prose

# Paths that exist on one machine only: a home, a temp or work folder, a virtualenv named by its
# absolute place. (`.venv/bin/python` from the repo root is fine: it is the README's own venv.)
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:tmp|root|work|home|Users|opt|srv|mnt)/|/\S*\.venv/|\bvenv\d+\b")
# A package index's address, or pip told to use one: an operator's choice, passed as a build argument.
INDEX_ADDRESS = re.compile(r"https?://\S*(?:pypi|pytorch\.org|/simple)|--(?:extra-)?index-url")
SHIPPED = ["Dockerfile", "docker-compose.yml", "pyproject.toml"]
WORKED_FAMILY = "mediafarm.tasks.families.loudness"


def cli_group() -> Any:
    """The `farm` command tree (typer builds it on click's classes, vendored: checked by duck type)."""
    from mediafarm.cli.app import cli

    return get_command(cli)


def is_option(param: Any) -> bool:
    return getattr(param, "param_type_name", "") == "option"


def families_declared_in(path: Path) -> set[str]:
    """Families a page declares itself (docs/adding-a-family.md's worked example)."""
    return {m for b in code_blocks(path) if b.lang == "python" for m in re.findall(r'\bname="([a-z][\w-]*)"', b.text)}


def request_fields(family: str) -> set[str] | None:
    from mediafarm.tasks import registry as families

    try:
        model = families.get(family).request
    except ValueError:
        return None
    names = set(model.model_fields)
    for field in model.model_fields.values():
        alias = field.validation_alias
        names |= set(getattr(alias, "choices", [alias] if isinstance(alias, str) else []))
    return names


def test_the_docs_write_farm_commands_at_all() -> None:
    # The checks below would pass on no command at all.
    subcommands = {c.args[0] for c in farm_commands() if c.args}
    assert {"up", "worker", "submit", "status", "cancel", "families", "speakers", "gc", "demo"} <= subcommands


@pytest.mark.parametrize("command", farm_commands(), ids=lambda c: f"{c.where} {c.text[:60]}")
def test_every_farm_command_in_the_docs_exists_with_the_options_it_uses(command) -> None:
    group = cli_group()
    args = [a for a in command.args if a != "\\"]
    node = group
    while hasattr(node, "commands"):
        assert args and args[0] in node.commands, f"{command.where}: `{command.text}` names no farm command"
        node = node.commands[args.pop(0)]
    options = {o for p in node.params if is_option(p) for o in (*p.opts, *p.secondary_opts)}
    known = None
    if node.name == "submit" and args and not args[0].startswith("-") and args[0] != "...":
        # `farm submit` named in prose, or with its family left out (`farm submit ... --queue`), has none to check.
        family = args[0]
        doc = REPO / command.where.split(":")[0]
        known = request_fields(family)
        assert known is not None or family in families_declared_in(doc) or family.isupper(), (
            f"{command.where}: `{command.text}`: no family {family!r}"
        )
    fields = []
    for i, token in enumerate(args):
        name = token.split("=", 1)[0]
        if token.startswith("-") and name in options:
            if name in ("-p", "--param"):
                fields.append(args[i + 1].split("=", 1)[0])
            continue
        if token.startswith("--") and node.name == "submit":
            fields.append(name[2:].replace("-", "_"))  # a request field of its own: --formats vtt,srt
            continue
        assert not token.startswith("-") or token == "-", f"{command.where}: `{command.text}`: no option {name}"
    if known is not None:
        unknown = [f for f in fields if f not in known]
        assert not unknown, f"{command.where}: `{command.text}`: {family} requests have no field {unknown}"


def test_every_farm_subcommand_the_docs_use_has_help() -> None:
    paths = sorted({c.args[:2] if c.args[0] == "speakers" else c.args[:1] for c in farm_commands() if c.args})
    runner = CliRunner()
    from mediafarm.cli.app import cli

    for path in paths:
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output, f"farm {' '.join(path)} --help: {result.output}"
    # And the installed entry point lists them (it is what a reader types).
    listed = subprocess.run([sys.executable, "-m", "mediafarm.cli", "--help"], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    for first in {p[0] for p in paths}:
        assert re.search(rf"^\W*{re.escape(first)}\s", listed.stdout, re.M), f"`farm --help` does not list {first}"


def bench_commands() -> list[tuple[str, str, list[str]]]:
    """(where, module, options) of every `python -m bench.NAME ...` in the docs and the bench docstrings."""
    found = []
    sources = [*doc_files(), *sorted((REPO / "bench").glob("*.py"))]
    for path in sources:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for module, rest in re.findall(r"-m bench\.(\w+)([^`\n]*)", line):
                found.append((f"{path.relative_to(REPO)}:{number}", module, re.findall(r"(?<!\S)(--[\w-]+)", rest)))
    return found


def test_every_bench_command_names_a_module_and_options_it_has() -> None:
    commands = bench_commands()
    assert {m for _, m, _ in commands} >= {"overhead", "vad_memory", "subtitle", "yolo", "tts", "brokers"}
    helps: dict[str, str] = {}
    for where, module, options in commands:
        if module not in helps:
            shown = subprocess.run([sys.executable, "-m", f"bench.{module}", "--help"], cwd=REPO, capture_output=True,
                                   text=True, timeout=120)  # fmt: skip
            assert shown.returncode == 0, f"{where}: python -m bench.{module} --help: {shown.stderr[-2000:]}"
            helps[module] = shown.stdout
        missing = [o for o in options if not re.search(rf"{re.escape(o)}\b", helps[module])]
        assert not missing, f"{where}: bench.{module} has no option {missing}"


def test_bench_scripts_import_the_package_like_any_code() -> None:
    hacks = [p.name for p in (REPO / "bench").glob("*.py") if "sys.path" in p.read_text()]
    assert hacks == []


def python_blocks() -> list:
    return [b for path in doc_files() for b in code_blocks(path) if b.lang == "python"]


@pytest.mark.parametrize("block", python_blocks(), ids=lambda b: b.where)
def test_every_python_block_compiles_and_imports_what_exists(block) -> None:
    if block.marker == "registry line":
        compile(f"BUILTIN = (\n{block.text}\n)", block.where, "exec")
        return
    tree = compile(block.text, block.where, "exec", ast.PyCF_ONLY_AST)
    for node in ast.walk(tree):
        # The worked family's own modules exist only once a reader has written them.
        if isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith(WORKED_FAMILY):
            module = __import__(node.module, fromlist=["_"])
            for alias in node.names:
                assert hasattr(module, alias.name), f"{block.where}: {node.module} has no {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                __import__(alias.name)


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    shells = [b.text for b in code_blocks(REPO / "README.md") if b.lang == "bash"]
    assert ci in shells, f"README's test command differs from .ci/run's last line:\n{ci}"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_doc_names_a_path_of_one_machine(path: Path) -> None:
    found = [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if MACHINE_PATH.search(line)]
    assert found == [], f"{path.relative_to(REPO)}: {found}"


@pytest.mark.parametrize("name", [*SHIPPED, "README.md", "docs"])
def test_no_package_index_address_is_written_into_the_repo(name: str) -> None:
    paths = sorted((REPO / name).rglob("*.md")) if name == "docs" else [REPO / name]
    for path in paths:
        found = [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if INDEX_ADDRESS.search(line)]
        assert found == [], f"{path.relative_to(REPO)}: {found}"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file(path: Path) -> None:
    links = LINK.findall(prose(path))
    for target in links:
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        assert (path.parent / target.split("#")[0]).exists(), f"{path.relative_to(REPO)}: broken link {target}"


def test_the_readme_links_every_docs_page() -> None:
    linked = {(REPO / t.split("#")[0]).resolve() for t in LINK.findall(prose(REPO / "README.md"))}
    pages = {p.resolve() for p in (REPO / "docs").rglob("*.md")}
    assert pages - linked == set()


def test_the_worked_family_is_registered_and_packaged_where_the_real_ones_are() -> None:
    doc = REPO / "docs" / "adding-a-family.md"
    registry = marked(doc, "registry line").text.strip()
    packaging = marked(doc, "packaging line").text.strip()
    assert registry == packaging == f'"{WORKED_FAMILY}",'
    as_vad = registry.replace("loudness", "vad")
    assert as_vad in [line.strip() for line in (REPO / "tasks" / "registry.py").read_text().splitlines()]
    assert as_vad in [line.strip() for line in (REPO / "pyproject.toml").read_text().splitlines()]
