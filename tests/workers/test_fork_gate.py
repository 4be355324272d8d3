"""The fork gate (``workers.fork_gate``): a fork waits for the threads inside it, and nothing of
the worker's main process starts a thread around it. The real worker under hundreds of forks is
tests/integration/test_fork_gate.py."""

from __future__ import annotations

import ast
import os
import threading
import time
from pathlib import Path

from mediafarm.workers import fork_gate
from mediafarm.workers.fork_gate import ForkGate

REPO = Path(__file__).resolve().parents[2]


def test_a_fork_waits_until_the_thread_inside_the_gate_is_out() -> None:
    inside, release = threading.Event(), threading.Event()
    left_at: list[float] = []

    def holder() -> None:
        with fork_gate.held():
            inside.set()
            release.wait(5)
            time.sleep(0.3)
            left_at.append(time.monotonic())

    thread = fork_gate.start_thread(holder, "test-holder")
    assert inside.wait(5)
    release.set()
    pid = os.fork()  # blocks in the gate's before-fork hook until the holder is out
    if pid == 0:
        os._exit(0)
    forked_at = time.monotonic()
    os.waitpid(pid, 0)
    thread.join(5)
    assert left_at and forked_at >= left_at[0]


def test_a_pending_fork_lets_no_new_holder_in_and_holds_nest() -> None:
    gate = ForkGate()
    entered: list[float] = []
    with gate.held():
        with gate.held():  # nested: no wait, even with a fork pending
            pass
        forker = threading.Thread(target=gate.before_fork)
        forker.start()
        time.sleep(0.1)
        assert forker.is_alive()  # the fork waits for this hold
        late = threading.Thread(target=lambda: gate.held().__enter__() or entered.append(time.monotonic()))
        late.start()
        time.sleep(0.1)
        assert not entered  # writer preference: no new holder while a fork waits
    forker.join(2)
    assert not forker.is_alive()
    time.sleep(0.1)
    assert not entered  # still "forking" until after_fork_in_parent
    gate.after_fork_in_parent()
    late.join(2)
    assert entered


def test_the_worker_main_process_starts_no_thread_but_through_the_gate() -> None:
    # Any future thread of workers/ must come through start_thread (and do its work inside held()).
    offenders = []
    # The webhook dispatcher's threads run in its own process (``python -m``, started by the worker
    # with subprocess), which forks no pool child; the worker's main process starts no thread there.
    own_process = {"webhook_dispatch.py"}
    for path in sorted((REPO / "workers").glob("*.py")):
        if path.name == "fork_gate.py" or path.name in own_process:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name in {"Thread", "Timer", "start_http_server", "start_wsgi_server", "start_new_thread"}:
                offenders.append(f"{path.name}:{node.lineno} {name}")
    assert offenders == []


def test_threads_started_elsewhere_are_reported() -> None:
    stop = threading.Event()
    stray = threading.Thread(target=stop.wait, name="stray-thread", daemon=True)
    stray.start()
    gated = fork_gate.start_thread(stop.wait, "gated-thread")
    try:
        names = fork_gate.ungated_threads()
        assert "stray-thread" in names and "gated-thread" not in names
    finally:
        stop.set()
        stray.join(2)
        gated.join(2)
