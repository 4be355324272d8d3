"""The package's import graph, read from the source: no cycle anywhere, and tasks/ never imports workers/.

Every ``import`` and ``from ... import`` counts wherever it is written: at module level, inside a
function (an import deferred to break a cycle is still the cycle) and under ``TYPE_CHECKING``.
Imports by name at run time (``importlib.import_module``, an engine's ``"module:function"``) are not
edges: the family registry and the engines are loaded that way on purpose, late.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.conftest import REPO
from tests.test_packaging import ROOTS


def modules() -> dict[str, Path]:
    """Every module of the package by its installed name (a package by its ``__init__.py``)."""
    found = {}
    for folder, package in ROOTS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(REPO / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def imported_names(source: str, module: str, is_package: bool) -> Iterator[str]:
    """Every dotted name ``source`` imports (relative imports resolved against ``module``).

    ``from a import b`` yields ``a`` and ``a.b``: ``b`` may be a module of ``a`` or a name in it.
    """
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def graph(known: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a name resolves to its longest known module)."""

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for module, path in known.items():
        names = imported_names(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
        edges[module] = {target for target in map(resolve, names) if target and target != module}
    return edges


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(edges.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_walk_sees_function_level_relative_and_type_checking_imports() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from mediafarm.tasks.wire.plan import Plan\n"
        "def late():\n    from mediafarm.tasks.wire import keys\n    import mediafarm.tasks.app\n"
        "from .records import Progress\n"
    )
    names = set(imported_names(source, "mediafarm.tasks.wire.history", is_package=False))
    assert {"mediafarm.tasks.wire.plan.Plan", "mediafarm.tasks.wire.keys", "mediafarm.tasks.app"} <= names
    assert "mediafarm.tasks.wire.records.Progress" in names  # relative to the module's package
    in_package = set(imported_names("from ...wire.errors import X\n", "mediafarm.tasks.families.vad", is_package=True))
    assert "mediafarm.tasks.wire.errors.X" in in_package  # relative to the package itself


def test_cycles_finds_a_cycle_through_any_number_of_modules_and_nothing_else() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_import_cycle_in_the_package() -> None:
    known = modules()
    edges = graph(known)
    # The walk itself works: edges every farm process has.
    assert "mediafarm.tasks.producer.handles" in edges["mediafarm.tasks.producer.client"]
    assert "mediafarm.tasks.app" in edges["mediafarm.workers.app"]
    assert "mediafarm.tasks.wire.plan" in edges["mediafarm.tasks.runtime.context"]
    found = cycles(edges)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_tasks_never_import_workers() -> None:
    edges = graph(modules())
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        if module.startswith("mediafarm.tasks")
        for target in targets
        if target.startswith("mediafarm.workers")
    )
    assert edges["mediafarm.workers.app"] & {"mediafarm.workers.guards", "mediafarm.workers.metrics"}  # walk works
    assert upward == [], "tasks/ imports workers/ (the worker entry, workers/app.py, wires them): " + ", ".join(upward)


def test_the_gateway_is_a_producer_it_never_imports_workers_and_nothing_but_the_cli_imports_it() -> None:
    edges = graph(modules())
    assert "mediafarm.tasks.producer.client" in edges["mediafarm.gateway.http.jobs"]  # the walk sees the gateway
    gateway, workers = "mediafarm.gateway", "mediafarm.workers"
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        for target in targets
        if (module.startswith(gateway) and target.startswith(workers))
        or (target.startswith(gateway) and not module.startswith(gateway) and module != "mediafarm.workers.cli")
    )
    assert wrong == [], "the gateway submits with the producer API; only the CLI starts it: " + ", ".join(wrong)
    # JSON only on the wire, as in the Celery configuration: no pickle, marshal or shelve.
    unsafe = sorted(
        f"{module} imports {name}"
        for module, path in modules().items()
        if module.startswith("mediafarm.gateway")
        for name in imported_names(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
        if name.split(".")[0] in ("pickle", "marshal", "shelve", "dill", "cloudpickle")
    )
    assert unsafe == []


def test_the_gateway_s_route_parts_share_only_its_common_part_and_only_the_app_wires_them() -> None:
    edges = graph(modules())
    parts = ("mediafarm.gateway.http", "mediafarm.gateway.openai", "mediafarm.gateway.ws")

    def part_of(module: str) -> str | None:
        return next((p for p in parts if module == p or module.startswith(p + ".")), None)

    assert "mediafarm.gateway.common.submit" in edges["mediafarm.gateway.openai.speech"]  # the walk sees the parts
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        if module.startswith("mediafarm.gateway") and module != "mediafarm.gateway.app"
        for target in targets
        if part_of(target) is not None and part_of(target) != part_of(module)
    )
    assert wrong == [], "a route part (or common) imports another part; share it through gateway.common: " + ", ".join(
        wrong
    )


# tasks/ by audience, lowest first: a module imports its own layer and those below it, never one above.
# The family shelf (``families/``) and its kit are held by tests/test_family_kit.py instead.
TASK_LAYERS = (
    ("wire", ("mediafarm.tasks.wire", "mediafarm.tasks.media")),
    ("app", ("mediafarm.tasks.app", "mediafarm.tasks.result_backend", "mediafarm.tasks.sent_ledger",
             "mediafarm.tasks.registry")),  # fmt: skip
    ("producer", ("mediafarm.tasks.producer",)),
    ("runtime", ("mediafarm.tasks.runtime",)),
)


def task_layer(module: str) -> int | None:
    """The index in TASK_LAYERS of ``module``'s layer; None outside them."""
    return next((i for i, (_, roots) in enumerate(TASK_LAYERS)
                 for root in roots if module == root or module.startswith(root + ".")), None)  # fmt: skip


def test_tasks_are_in_folders_by_audience_and_import_only_downwards() -> None:
    edges = graph(modules())
    tasks = [m for m in modules() if m.startswith("mediafarm.tasks.")]
    # Every module of tasks/ is in a layer but the shelf of families and their kit.
    shelf = ("mediafarm.tasks.families", "mediafarm.tasks.kit")
    unplaced = [m for m in tasks if task_layer(m) is None and not m.startswith(shelf)]
    assert unplaced == []
    assert "mediafarm.tasks.wire.keys" in edges["mediafarm.tasks.producer.client"]  # the walk sees the layers
    upward = sorted(
        f"{module} ({TASK_LAYERS[task_layer(module)][0]}) -> {target} ({TASK_LAYERS[task_layer(target)][0]})"
        for module in tasks
        if task_layer(module) is not None
        for target in edges[module]
        if task_layer(target) is not None and task_layer(target) > task_layer(module)
    )
    assert upward == [], "tasks/ imports a layer above its own: " + ", ".join(upward)


def test_the_gateway_reads_jobs_through_the_producer_api_and_a_family_through_its_package() -> None:
    # A job's keys are read by its handle (tasks/producer/handles.py), the farm's Redis is reached
    # through the producer API, and a family is used through what its package offers, not its modules.
    edges = graph(modules())
    assert "mediafarm.tasks.producer.handles" in edges["mediafarm.gateway.openai.speech_stream"]  # the walk works
    assert "mediafarm.tasks.families.tts" in edges["mediafarm.gateway.ws.rooms"]
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        if module.startswith("mediafarm.gateway")
        for target in targets
        if target in ("mediafarm.tasks.app", "mediafarm.tasks.wire.keys")
        or target.startswith("mediafarm.tasks.runtime")
        or (target.startswith("mediafarm.tasks.families.") and target.count(".") > 3)
    )
    assert wrong == [], "the gateway reads around the producer API or into a family's modules: " + ", ".join(wrong)
