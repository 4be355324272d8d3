"""Where the farm's own time goes in one job: the per-job trace (``tasks.wire.trace``), step by step.

    .venv/bin/python -m bench.trace --jobs 300 --flame docs/benchmarks

One worker of one child (prefork, prefetch 1, events on, acks_late; the embedded Redis as broker
and backend) runs, one job at a time so that nothing queues:

* ``noop``: the chaos family's engine that returns at once, so every millisecond is the farm's;
* ``espeak``: a ``tts`` job of one short sentence on the espeak rung (the narrator's line);
* ``bare``: a bare Celery task that does nothing (``bench.overhead_tasks.bare_untracked``), sent
  and waited for with ``apply_async().get()``, the floor any Celery farm stands on.

Each job is submitted with ``submit()`` and waited for with ``JobHandle.wait()``. The producer's
trace (on the handle) and the worker's (in the envelope) give each step's duration and the round
trips its thread made on the farm's Redis client; ``notified`` is from the attempt's record to
``wait()`` returning (Celery storing the result, publishing it, the producer waking). Reported:
median and P99 of each step, and the commands Redis served per job, counted server-side (INFO
commandstats, less what the idle farm issues in the same time).

``--flame DIR`` then records both halves with py-spy (``DIR/trace-producer.svg``,
``DIR/trace-worker.svg``) over another ``--jobs`` noop jobs, kept out of the figures above (py-spy's
sampling slows the processes it watches).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.farm import REPO, SENTENCES, farm, percentile, worker

CONFIG = """
[pools.bench]
queues = ["bench", "tts"]
concurrency = 1
max_tasks_per_child = 1000000

[ladders.noop]
family = "chaos"
rungs = [{ name = "noop", engine = "ok" }]
"""

PRODUCER_STEPS = ("validated", "routed", "admitted", "sent")
WORKER_STEPS = ("child", "ready", "attempt", "engine", "engine_end", "recorded")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=300, help="jobs per kind (after 30 to warm up)")
    parser.add_argument("--flame", type=Path, default=None, help="folder for py-spy flame graphs of both halves")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "trace.json")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="mediafarm-trace-"))
    (workdir / "farm.toml").write_text(CONFIG)
    with (
        farm(workdir, config=workdir / "farm.toml", pool="bench", families="tests.support.chaos") as redis,
        worker("bench", workdir, include=("bench.overhead_tasks",)) as process,
    ):
        from bench.overhead_tasks import bare_untracked
        from mediafarm.tasks.producer.client import submit

        sentence = SENTENCES[0]
        kinds: dict[str, Callable[[], dict[str, Any]]] = {
            "noop": lambda: farm_job(submit, "chaos", queue="bench", ladder="noop"),
            "espeak": lambda: farm_job(submit, "tts", text=sentence, ladder="espeak", format="wav"),
            "bare": lambda: bare_job(bare_untracked),
        }
        for run in kinds.values():  # warm-up: the child imports, connections open, espeak loads
            for _ in range(30):
                run()
        client = redis_client(redis.url)
        idle = idle_rate(client)
        results: dict[str, Any] = {"jobs": args.jobs, "idle_commands_per_s": round(sum(idle.values()), 1)}
        for name, run in kinds.items():
            results[name] = measure(run, args.jobs, client, idle)
            print(f"{name}: done", flush=True)
        if args.flame is not None:  # apart: py-spy's sampling slows what it watches
            with flames(args.flame, process.pid):
                for _ in range(args.jobs):
                    kinds["noop"]()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    report(results)


def farm_job(submit: Callable[..., Any], family: str, **fields: Any) -> dict[str, Any]:
    """One job through ``submit`` and ``wait``: its steps (ms) and round trips, both sides."""
    called = time.time()
    handle = submit(family, **fields)
    envelope = handle.wait(timeout=120)
    seen = time.time()
    steps: dict[str, float] = {}
    trips: dict[str, int] = {}
    for step, seconds, n in handle.trace.spans():
        steps[step], trips[step] = seconds * 1000, n
    worker_trace = envelope["trace"]
    before = 0.0
    for step, ms, n in worker_trace["steps"]:
        steps[step], trips[step] = ms - before, n
        before = ms
    # The worker's t0 is the send; the producer's own "sent" mark is after the publish returned.
    steps["notified"] = (seen - worker_trace["t0"]) * 1000 - before
    steps["total"] = (seen - called) * 1000
    return {"ms": steps, "trips": trips}


def bare_job(task: Any) -> dict[str, Any]:
    called = time.time()
    task.apply_async(kwargs={"ladder": "noop"}, queue="bench").get(timeout=120)
    return {"ms": {"total": (time.time() - called) * 1000}, "trips": {}}


def redis_client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


def commands(client: Any) -> dict[str, int]:
    """Commands Redis has served (every client), by command, less the INFO calls."""
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items() if k != "cmdstat_info"}


def served(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)}


def idle_rate(client: Any, seconds: float = 3.0) -> dict[str, float]:
    """Commands a second the idle farm issues (worker polls, heartbeats, capability records), by command."""
    before = commands(client)
    time.sleep(seconds)
    return {k: n / seconds for k, n in served(before, commands(client)).items()}


def measure(run: Callable[[], dict[str, Any]], jobs: int, client: Any, idle: dict[str, float]) -> dict[str, Any]:
    before, started = commands(client), time.monotonic()
    samples = [run() for _ in range(jobs)]
    elapsed = time.monotonic() - started
    per_job = {k: round((n - idle.get(k, 0) * elapsed) / jobs, 2) for k, n in served(before, commands(client)).items()}
    per_job = {k: n for k, n in sorted(per_job.items(), key=lambda kv: -kv[1]) if n >= 0.05}
    return {"samples": samples, "commands_per_job": round(sum(per_job.values()), 1), "commands": per_job}


def summary(kind: dict[str, Any]) -> dict[str, Any]:
    samples = kind["samples"]
    steps = list(samples[0]["ms"])
    out: dict[str, Any] = {"commands_per_job": kind["commands_per_job"], "commands": kind["commands"]}
    for step in steps:
        values = [s["ms"][step] for s in samples]
        trips = [s["trips"].get(step, 0) for s in samples]
        out[step] = {"p50_ms": round(statistics.median(values), 2), "p99_ms": round(percentile(values, 99), 2),
                     "round_trips": statistics.median(trips) if trips else 0}  # fmt: skip
    return out


@contextlib.contextmanager
def flames(folder: Path | None, worker_pid: int) -> Iterator[None]:
    """py-spy recording this process (the producer) and the worker with its children, to SVGs."""
    if folder is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    beside = Path(sys.executable).parent / "py-spy"  # in the venv, which need not be on PATH
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("--flame needs py-spy: .venv/bin/pip install py-spy")
    spy = [found]
    recorders = [
        subprocess.Popen([*spy, "record", "--rate", "400", "--nonblocking", "-o", str(folder / "trace-producer.svg"),
                          "--pid", str(os.getpid())], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([*spy, "record", "--rate", "400", "--nonblocking", "--subprocesses", "-o",
                          str(folder / "trace-worker.svg"), "--pid", str(worker_pid)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]  # fmt: skip
    time.sleep(1.0)  # attached
    try:
        yield
    finally:
        for recorder in recorders:
            recorder.send_signal(signal.SIGINT)  # py-spy writes its SVG on SIGINT
        for recorder in recorders:
            recorder.wait(timeout=60)
        for svg in ("trace-producer.svg", "trace-worker.svg"):  # no path of this machine in the pages
            path = folder / svg
            if path.exists():
                text = path.read_text()
                for local, shown in ((sys.executable, "python"), (str(REPO) + os.sep, "")):
                    text = text.replace(local, shown)
                path.write_text(text)


def report(results: dict[str, Any]) -> None:
    print(f"\nidle farm: {results['idle_commands_per_s']} Redis commands/s")
    for name in ("noop", "espeak", "bare"):
        print(f"\n{name}: {results[name]['commands_per_job']} Redis commands per job (server-side): "
              + ", ".join(f"{k} {n:g}" for k, n in results[name]["commands"].items()))
        print(f"  {'step':<12} {'p50 ms':>8} {'p99 ms':>8} {'trips':>6}")
        for step, row in summary(results[name]).items():
            if isinstance(row, dict) and "p50_ms" in row:
                print(f"  {step:<12} {row['p50_ms']:>8} {row['p99_ms']:>8} {row['round_trips']:>6}")


if __name__ == "__main__":
    main()
