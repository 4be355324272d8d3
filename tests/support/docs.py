"""Reading the docs the way the doc tests check them: fenced code blocks (with the marker comment
before each, if any), inline code, relative links, and the `farm` commands in all of them.

A marker is an HTML comment on the line before a fence (blank lines allowed between), e.g.
``<!-- tour -->`` or ``<!-- file: tasks/families/loudness/spec.py -->``: invisible on GitHub,
it names a block a test runs.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*(.+?)\s*-->\s*$")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A `farm` command starts a line, or follows `$(`, `&&`, `;` or `|`; it ends before the next of
# them, or a comment. The venv's own `.venv/bin/farm` counts too.
FARM_COMMAND = re.compile(r"(?:^|\$\(|&&|;|\|)\s*((?:\.venv/bin/)?farm\s[^;&|)#]*)")


@dataclass(frozen=True)
class Block:
    """A fenced code block. Attributes: path (the doc), line (of the opening fence, from 1),
    lang (the fence's info string), text, marker (the comment before it, or None)."""

    path: Path
    line: int
    lang: str
    text: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def doc_files() -> list[Path]:
    """The README and every page under docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def code_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    marker: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
            if end is None:
                raise AssertionError(f"{path.relative_to(REPO)}:{i + 1}: a code block is never closed")
            text = textwrap.dedent("\n".join(lines[i + 1 : end]))
            blocks.append(Block(path, i + 1, fence.group(2), text, marker))
            marker, i = None, end + 1
            continue
        found = MARKER.match(line)
        if found:
            marker = found.group(1)
        elif line.strip():
            marker = None
        i += 1
    return blocks


def prose(path: Path) -> str:
    """The doc with its fenced blocks blanked out (line numbers kept): where inline code and links are."""
    out, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            inside = not inside
            out.append("")
        else:
            out.append("" if inside else line)
    return "\n".join(out)


def marked(path: Path, marker: str) -> Block:
    """The one block of ``path`` with ``marker`` before it."""
    found = [b for b in code_blocks(path) if b.marker == marker]
    assert len(found) == 1, f"{path.relative_to(REPO)}: {len(found)} blocks marked <!-- {marker} -->, want 1"
    return found[0]


@dataclass(frozen=True)
class FarmCommand:
    """A `farm` command written in a doc. Attributes: where (doc:line), text, args (after `farm`)."""

    where: str
    text: str
    args: tuple[str, ...]


def farm_commands() -> list[FarmCommand]:
    """Every `farm ...` command in the docs' shell blocks and inline code."""
    commands: list[FarmCommand] = []
    for path in doc_files():
        for block in code_blocks(path):
            if block.lang not in ("bash", "sh", "console", "shell"):
                continue
            for offset, line in enumerate(block.text.splitlines(), 1):
                where = f"{block.where.rsplit(':', 1)[0]}:{block.line + offset}"
                commands += [_command(where, m.group(1)) for m in FARM_COMMAND.finditer(line)]
        for number, line in enumerate(prose(path).splitlines(), 1):
            for code in INLINE_CODE.findall(line):
                if re.match(r"(?:\.venv/bin/)?farm\s", code):
                    commands.append(_command(f"{path.relative_to(REPO)}:{number}", code))
    return commands


def _command(where: str, text: str) -> FarmCommand:
    # Placeholders in brackets ([--dry-run]) are optional parts: checked as if written.
    tokens = shlex.split(text.replace("[", " ").replace("]", " "), comments=True)
    return FarmCommand(where, text.strip(), tuple(tokens[1:]))
