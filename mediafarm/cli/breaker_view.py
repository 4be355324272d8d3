"""What ``farm families`` shows of the rung circuit breakers: each ladder's policy, the breakers open
now, and each rung's recent failures by cause, counted against its breaker or not (``tasks.runtime.attribution``)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table

from mediafarm.config.ladder_policy import ladder_policy
from mediafarm.config.ladders import Ladder
from mediafarm.config.settings import get_settings
from mediafarm.tasks.runtime import failure_tally
from mediafarm.tasks.runtime.attribution import CAUSES
from mediafarm.tasks.runtime.breaker import BreakerState, read_breakers
from mediafarm.tasks.runtime.failure_tally import FailureTally


def policy_cell(ladder: Ladder) -> str:
    """The ladder's breaker and step-down, in one cell: ``3 in 60 s, cool-down 30 s``, ``off``."""
    policy = ladder_policy(ladder.identity)
    text = policy.breaker.describe()
    return f"{text}; steps down under memory pressure" if policy.step_down_under_pressure else text


def _clock(at: float | None) -> str:
    return "" if not at else time.strftime("%H:%M:%S", time.localtime(at))


def breakers_table(states: list[BreakerState], now: float) -> Table:
    table = Table("pool", "ladder", "rung", "state", "since", "cool-down until", "failures", "probe",
                  title="rung breakers not closed (new jobs start on the next rung)")  # fmt: skip
    for s in states:
        state = s.state.replace("_", "-") + (f" (opened {s.opened}x)" if s.opened > 1 else "")
        if s.state == "open" and now >= s.until:
            state += ", next job probes"
        probe = f"{s.probe} (claim until {_clock(s.probe_until)})" if s.probe else ""
        table.add_row(s.pool, s.ladder, s.rung, state, _clock(s.since), _clock(s.until),
                      f"{s.failures} in {s.window_s:g} s", probe)  # fmt: skip
    return table


def tallies_table(tallies: list[FailureTally]) -> Table:
    table = Table("pool", "ladder", "rung", "failures", "cause", "against its breaker",
                  title="rung failures in the last day, by cause (only the rung's own open its breaker)")  # fmt: skip
    for t in tallies:
        words = CAUSES[t.cause].words if t.cause in CAUSES else t.cause
        counted = "counted" if t.counted else "not counted"
        table.add_row(t.pool, t.ladder, t.rung, str(t.count), f"{t.cause}: {words}", counted)
    return table


def print_open_breakers(console: Console, client: Any = None) -> None:
    """The breakers not closed on every pool, read from the result backend, and the rungs' recent
    failures by cause; a line when none is, or when there is no broker to read."""
    if client is None:
        if not get_settings().broker_url:
            console.print("rung breakers: FARM_BROKER_URL is not set, so their state is not read")
            return
        from mediafarm.tasks.app import app

        client = app.backend.client
    try:
        states, tallies = read_breakers(client), failure_tally.read(client)
    except Exception as exc:  # noqa: BLE001 - the families table above is still right
        console.print(f"rung breakers: unreadable ({type(exc).__name__}: {exc})")
        return
    console.print(breakers_table(states, time.time()) if states else "rung breakers: all closed")
    if tallies:
        console.print(tallies_table(tallies))
