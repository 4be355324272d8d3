"""``farm toy``: the toy family's own command, to prove that a family's commands need no farm file edited."""

from __future__ import annotations

import typer

from tests.support.toy import ToyRequest

# No name given: the CLI mounts it under the family's, `farm toy`.
commands = typer.Typer(no_args_is_help=True, help="Test-only: the toy family's own commands.")


@commands.command("count")
def count(text: str) -> None:
    """Count the words of TEXT here, as the toy's engines would, without a broker."""
    request = ToyRequest(text=text)
    print(f"{len(request.text.split())} words")
