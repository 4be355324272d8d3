"""What the farm's task machinery costs, and how fast a killed job comes back on its next rung.

    .venv/bin/python -m bench.overhead --jobs 2000 --rounds 3 --kills 10

1. Throughput: the same no-op job, as a bare Celery task and through FarmTask (ladder, attempt
   history in Redis, watchdog thread polling the children), on one worker with the same pool
   settings (prefork 2, prefetch 1, events on, acks_late, Redis broker and backend). Each round
   sends ``--jobs`` of each kind (the order rotating between rounds) and times first send to last
   result. Reported: per-round ratio farm/bare, and the median ratio. FarmTask writes its attempt
   record instead of Celery's STARTED state, so the ratio is also given against a bare task that
   writes no STARTED state at all (``bare_untracked``), the strictest baseline. Each batch's CPU
   time is also counted per process (this sender, the worker's main process, its children, Redis),
   in ms a job: on a shared machine the rounds' rates swing, the CPU a job costs much less, and it
   says which side of the farm the difference is on.
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

        meter = CpuMeter(process.pid, workdir)
        results = {"throughput": throughput(args, app, meter), "kill_latency": kill_latency(args, process)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    report(results)


def run_batch(send, n: int) -> float:
    t0 = time.perf_counter()
    handles = [send() for _ in range(n)]
    for h in handles:
        h.get(timeout=300)
    return time.perf_counter() - t0


class CpuMeter:
    """CPU seconds used so far by this process, the worker's main process, its pool children and
    the embedded Redis (the one whose data folder is under ``workdir``)."""

    def __init__(self, worker_pid: int, workdir: Path) -> None:
        import psutil

        self.psutil = psutil
        self.me, self.main = psutil.Process(), psutil.Process(worker_pid)
        self.redis = [p for p in psutil.process_iter(["cmdline"])
                      if any("redis-server" in part for part in p.info["cmdline"] or ())
                      and str(workdir) in " ".join(p.info["cmdline"] or ()) + self._cwd(p)]  # fmt: skip

    def _cwd(self, process) -> str:
        try:
            return process.cwd()
        except self.psutil.Error:
            return ""

    def _cpu(self, processes) -> float:
        total = 0.0
        for process in processes:
            try:
                times = process.cpu_times()
            except self.psutil.Error:  # a child replaced meanwhile: its time is lost to both kinds alike
                continue
            total += times.user + times.system
        return total

    def read(self) -> dict[str, float]:
        return {"sender": self._cpu([self.me]), "worker_main": self._cpu([self.main]),
                "children": self._cpu(self.main.children(recursive=True)), "redis": self._cpu(self.redis)}  # fmt: skip


def timed_batch(send, n: int, meter: CpuMeter) -> tuple[float, dict[str, float]]:
    """``run_batch``, with the CPU ms a job each process spent meanwhile."""
    before = meter.read()
    seconds = run_batch(send, n)
    after = meter.read()
    return seconds, {k: (after[k] - before[k]) * 1000 / n for k in before}


def throughput(args: argparse.Namespace, app, meter: CpuMeter) -> dict:
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
        rates, cpu = {}, {}
        for name in order:
            seconds, cpu[name] = timed_batch(senders[name], args.jobs, meter)
            rates[name] = args.jobs / seconds
        rounds.append({
            **{f"{name}_jobs_per_s": round(rate, 1) for name, rate in rates.items()},
            "ratio": round(rates["farm"] / rates["bare"], 3),
            "ratio_vs_untracked": round(rates["farm"] / rates["bare_untracked"], 3),
            "cpu_ms_per_job": {name: {k: round(v, 3) for k, v in split.items()} for name, split in cpu.items()},
        })  # fmt: skip
        print(f"round {r + 1}: {rounds[-1]}", flush=True)
    cpu_median = {name: {part: round(statistics.median(r["cpu_ms_per_job"][name][part] for r in rounds), 3)
                         for part in rounds[0]["cpu_ms_per_job"][name]} for name in names}  # fmt: skip
    return {
        "jobs": args.jobs,
        "rounds": rounds,
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
        "median_ratio_vs_untracked": statistics.median(r["ratio_vs_untracked"] for r in rounds),
        "cpu_ms_per_job_median": cpu_median,
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
          f"({'PASS' if t['median_ratio'] >= 0.97 else 'FAIL'} target >= 0.97)")  # fmt: skip
    print(f"throughput ratio farm/bare without a STARTED write: {t['median_ratio_vs_untracked']:.3f}")
    print("CPU ms a job, median of the rounds (sender, worker main, children, redis: total):")
    for name, split in t["cpu_ms_per_job_median"].items():
        print(f"  {name:15s} " + ", ".join(f"{part} {ms:.3f}" for part, ms in split.items())
              + f": {sum(split.values()):.3f}")
    w = k["watchdog_kill_to_next_rung_s"]["median"]
    print(f"watchdog kill -> next rung, median: {w:.3f} s ({'PASS' if w <= 1.5 else 'FAIL'} target <= 1.5 s)")
    print(f"outside SIGKILL -> next rung, median: {k['outside_sigkill_to_next_rung_s']['median']:.3f} s")


if __name__ == "__main__":
    main()
