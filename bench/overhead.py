"""What the farm's task machinery costs, and how fast a killed job comes back on its next rung.

    .venv/bin/python -m bench.overhead --jobs 2000 --rounds 3 --kills 10

1. Throughput: the same no-op job, as a bare Celery task and through FarmTask (ladder, attempt
   history in Redis, watchdog thread polling the children), on one worker with the same pool
   settings (prefork 2, prefetch 1, events on, acks_late, Redis broker and backend). Each round
   sends ``--jobs`` of each kind (the order rotating between rounds) and times first send to last
   result. Reported: per-round ratio farm/bare, and the median ratio. FarmTask writes its attempt
   record instead of Celery's STARTED state, so the ratio is also given against a bare task that
   writes no STARTED state at all (``bare_untracked``), the strictest baseline.
2. Kill → next rung: a job whose first rung allocates past the pool's RSS cap. Latency from the
   watchdog's kill record (written just before SIGKILL) to the start of the next rung's attempt,
   and from an outside SIGKILL (what the kernel OOM killer does) to the same point.

The worker and an embedded Redis are started by the script; nothing else is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import time
from pathlib import Path

from bench.farm import REPO, chaos_farm, worker

CONFIG = """
[limits.chaos]
soft = 60
hard = 90

[pools.bench]
queues = ["bench"]
concurrency = 2
child_rss_cap_mb = 400
max_tasks_per_child = 100000

[ladders.noop]
family = "chaos"
rungs = [{ name = "noop", engine = "ok" }]

# Every kill-latency job must meet its killed rung: with its breaker on, the fourth in a minute
# would start on the next rung (bench/breaker.py measures the breaker). The noop jobs keep theirs.
[ladders.kill_once]
family = "chaos"
breaker = { enabled = false }
rungs = [
  { name = "hungry", engine = "hog", params = { mb = 900 } },
  { name = "frugal", engine = "ok" },
]

[ladders.slow_then_ok]
family = "chaos"
breaker = { enabled = false }
rungs = [
  { name = "sleepy", engine = "ok", params = { sleep = 30 } },
  { name = "frugal", engine = "ok" },
]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "overhead.json")
    args = parser.parse_args()

    with chaos_farm(CONFIG) as workdir, worker("bench", workdir, include=("bench.overhead_tasks",)) as process:
        from mediafarm.tasks.app import app

        results = {"throughput": throughput(args, app), "kill_latency": kill_latency(args, process)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    report(results)


def run_batch(send, n: int) -> float:
    t0 = time.perf_counter()
    handles = [send() for _ in range(n)]
    for h in handles:
        h.get(timeout=300)
    return time.perf_counter() - t0


def throughput(args: argparse.Namespace, app) -> dict:
    from bench.overhead_tasks import bare_noop, bare_untracked

    senders = {
        "bare": lambda: bare_noop.apply_async(kwargs={"ladder": "noop"}, queue="bench"),
        "bare_untracked": lambda: bare_untracked.apply_async(kwargs={"ladder": "noop"}, queue="bench"),
        # As the client sends it: by name, no limits stamped on the message.
        "farm": lambda: app.send_task("farm.test.chaos", kwargs={"ladder": "noop"}, queue="bench",
                                      soft_time_limit=None, time_limit=None),  # fmt: skip
    }
    for send in senders.values():  # warm-up: children import, connections open
        run_batch(send, 200)
    names = list(senders)
    rounds = []
    for r in range(args.rounds):
        order = names[r % 3 :] + names[: r % 3]  # rotate who goes first
        rates = {name: args.jobs / run_batch(senders[name], args.jobs) for name in order}
        rounds.append({
            **{f"{name}_jobs_per_s": round(rate, 1) for name, rate in rates.items()},
            "ratio": round(rates["farm"] / rates["bare"], 3),
            "ratio_vs_untracked": round(rates["farm"] / rates["bare_untracked"], 3),
        })  # fmt: skip
        print(f"round {r + 1}: {rounds[-1]}", flush=True)
    return {
        "jobs": args.jobs,
        "rounds": rounds,
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
        "median_ratio_vs_untracked": statistics.median(r["ratio_vs_untracked"] for r in rounds),
    }


def kill_latency(args: argparse.Namespace, worker) -> dict:
    from mediafarm.tasks.producer.client import submit

    watchdog, outside = [], []
    for _ in range(args.kills):
        job = submit("chaos", queue="bench", ladder="kill_once")
        envelope = job.wait(timeout=120)
        killed, ok = envelope["attempts"]
        assert killed["outcome"] == "killed"
        # A watchdog-killed attempt's duration runs to the kill record's time, taken just before SIGKILL.
        watchdog.append(ok["started"] - (killed["started"] + killed["duration"]))
    import psutil

    for _ in range(args.kills):
        job = submit("chaos", queue="bench", ladder="slow_then_ok")
        while True:
            running = [a for a in job.attempts() if a["outcome"] is None]
            if running:
                break
            time.sleep(0.01)
        # Mid-job, as an OOM kill is: the main process has taken the child's "accepted" message by now.
        time.sleep(0.5)
        pid = running[0]["pid"]
        assert pid in {c.pid for c in psutil.Process(worker.pid).children()}
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        envelope = job.wait(timeout=120)
        outside.append(envelope["attempts"][1]["started"] - killed_at)
    return {
        "watchdog_kill_to_next_rung_s": {"median": round(statistics.median(watchdog), 3), "max": round(max(watchdog), 3),
                                         "runs": len(watchdog)},
        "outside_sigkill_to_next_rung_s": {"median": round(statistics.median(outside), 3), "max": round(max(outside), 3),
                                           "runs": len(outside)},
    }  # fmt: skip


def report(results: dict) -> None:
    t = results["throughput"]
    k = results["kill_latency"]
    print(f"\nthroughput ratio farm/bare, median of {len(t['rounds'])} rounds: {t['median_ratio']:.3f} "
          f"({'PASS' if t['median_ratio'] >= 0.95 else 'FAIL'} target >= 0.95)")  # fmt: skip
    print(f"throughput ratio farm/bare without a STARTED write: {t['median_ratio_vs_untracked']:.3f}")
    w = k["watchdog_kill_to_next_rung_s"]["median"]
    print(f"watchdog kill -> next rung, median: {w:.3f} s ({'PASS' if w <= 1.5 else 'FAIL'} target <= 1.5 s)")
    print(f"outside SIGKILL -> next rung, median: {k['outside_sigkill_to_next_rung_s']['median']:.3f} s")


if __name__ == "__main__":
    main()
