"""A command group's commands by name, some imported from another module on first use.

Click's own recipe for lazily loaded subcommands overrides ``list_commands`` and ``get_command``;
here the group's ``commands`` mapping itself is lazy, so that whatever walks ``group.commands``
(the docs' tests, Typer's help) sees every name, and a command is imported only when it is looked
up: ``farm submit`` looks up ``submit`` alone, so ``workers/cli.py`` is never imported for it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, MutableMapping

import typer
from typer.core import TyperGroup
from typer.main import get_group


class LazyCommands(MutableMapping[str, object]):
    """``built`` (the commands at hand) and ``names``, the commands of the ``typer.Typer`` at
    ``module:attribute``, imported when one of them is first read.

    Iterated in ``order`` (every name of ``order`` it has), then the rest as added.
    """

    def __init__(self, built: MutableMapping[str, object], target: str, names: Iterable[str],
                 order: Iterable[str] = ()) -> None:  # fmt: skip
        self._built = dict(built)
        self._target = target
        self._lazy = tuple(names)
        self._order = tuple(order)

    def _load(self) -> None:
        module, _, attribute = self._target.partition(":")
        app: typer.Typer = getattr(importlib.import_module(module), attribute)
        loaded = get_group(app).commands
        if set(loaded) != set(self._lazy):  # a command added there and not declared here, or gone
            raise RuntimeError(f"{self._target} has the commands {sorted(loaded)}, not {sorted(self._lazy)}")
        for name in self._lazy:
            self._built.setdefault(name, loaded[name])
        self._lazy = ()

    def __getitem__(self, name: str) -> object:
        if name not in self._built and name in self._lazy:
            self._load()
        return self._built[name]

    def __setitem__(self, name: str, command: object) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        if name in self._lazy:  # loaded first, so that the name is gone for good
            self._load()
        del self._built[name]

    def __iter__(self) -> Iterator[str]:
        names = [*self._built, *(n for n in self._lazy if n not in self._built)]
        first = [n for n in self._order if n in names]
        return iter([*first, *(n for n in names if n not in first)])

    def __len__(self) -> int:
        return len(set(self._built) | set(self._lazy))


def lazy_group(target: str, names: Iterable[str], order: Iterable[str] = ()) -> type[TyperGroup]:
    """A ``TyperGroup`` class (``typer.Typer(cls=...)``) whose commands are :class:`LazyCommands`."""
    names, order = tuple(names), tuple(order)

    class LazyGroup(TyperGroup):
        def __init__(self, **attrs: object) -> None:
            super().__init__(**attrs)
            self.commands = LazyCommands(self.commands, target, names, order)

    return LazyGroup
