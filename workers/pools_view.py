"""What ``farm pools`` shows: each declared pool, its live workers, what each can run now, and
each pool's scaling signal.

Read from the live capability records (``tasks.wire.capability``), never from the declared ladders:
a worker that cannot run a rung says why, and a queue it leaves out says so too. The signal
(``tasks.producer.scaling``) is what ``mediafarm_pool_jobs`` and ``mediafarm_pool_load`` serve.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from mediafarm.config.pools import Pool, expand_queues
from mediafarm.tasks import registry
from mediafarm.tasks.producer.scaling import PoolSignal
from mediafarm.tasks.wire.capability import WorkerCapability

NO_WORKER = ("no live worker has said what it can run (none is running, or none reaches this Redis): "
             "no job of any family runs now; jobs sent wait in their queues")  # fmt: skip


def runs_cell(record: WorkerCapability) -> str:
    """``family: rung, rung`` per family it takes, the rungs it can run across the family's ladders."""
    lines = []
    for family in record.served:
        names = dict.fromkeys(r for rungs in record.runnable(family).values() for r in rungs)
        lines.append(f"{family}: {', '.join(names) or 'nothing'}")
    return "\n".join(lines)


def not_runs_cell(record: WorkerCapability) -> str:
    """``family/ladder/rung: why`` for each rung of a family it takes that it cannot run."""
    return "\n".join(
        f"{family}/{ladder}/{rung}: {why}"
        for family in record.served for ladder, rungs in record.rungs.get(family, {}).items()
        for rung, why in rungs.items() if why
    )  # fmt: skip


def pools_table(pools: Mapping[str, Pool], records: Sequence[WorkerCapability]) -> Table:
    table = Table("pool", "queues declared", "worker", "consumes", "can run", "cannot run", "queues left out",
                  title="pools and what their live workers can run")  # fmt: skip
    default = registry.default_queues()
    for name in [*pools, *sorted({r.pool for r in records} - set(pools))]:
        pool = pools.get(name)
        declared = ", ".join(expand_queues(pool.queues, default)) if pool else "(not declared here)"
        mine = [r for r in records if r.pool == name]
        if not mine:
            table.add_row(name, declared, "[dim]no live worker[/]", "", "", "", "")
        for r in mine:
            left = "\n".join(f"{q}: {why}" for q, why in r.left_out.items())
            table.add_row(name, declared, r.node, ", ".join(r.queues), runs_cell(r), not_runs_cell(r), left)
    return table


def signal_table(signals: Mapping[str, PoolSignal]) -> Table:
    table = Table("pool", "queued", "reserved", "running", "slots", "slots per replica", "wanted", "load",
                  title="scaling signal: load = (queued + reserved + running) / slots per replica; at least 1 at "
                        "zero replicas while jobs want the pool (wanted: would have run a better rung there)")  # fmt: skip
    for name, s in signals.items():
        table.add_row(name, str(s.queued), str(s.reserved), str(s.running), str(s.slots), f"{s.slots_per_replica:g}",
                      str(s.wanted), f"{s.load:.2f}")  # fmt: skip
    return table


def pools_json(pools: Mapping[str, Pool], records: Sequence[WorkerCapability],
               signals: Mapping[str, PoolSignal] | None = None) -> str:  # fmt: skip
    """The declared pools (and the pools a live worker names), each with its queues, live workers
    and scaling signal; and the live records."""
    signals = signals or {}
    declared = {name: list(expand_queues(p.queues, registry.default_queues())) for name, p in pools.items()}
    out: dict[str, Any] = {
        "pools": {name: {"queues": declared.get(name, []), "workers": [r.node for r in records if r.pool == name],
                         **({"signal": signals[name].to_dict()} if name in signals else {})}
                  for name in [*pools, *(n for n in signals if n not in pools)]},
        "workers": [json.loads(r.to_json()) for r in records],
    }  # fmt: skip
    if not records:
        out["note"] = NO_WORKER
    return json.dumps(out, indent=2)


def print_pools(console: Console, pools: Mapping[str, Pool], records: Sequence[WorkerCapability],
                signals: Mapping[str, PoolSignal] | None = None) -> None:  # fmt: skip
    console.print(pools_table(pools, records))
    if not records:
        console.print(f"[yellow]{NO_WORKER}[/]", highlight=False)
    if signals:
        console.print(signal_table(signals))
