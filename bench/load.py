"""Under load: the farm serves or refuses every request, keeps its queue (and Redis) bounded and its
queue wait short, at 1x, 2x and 4x its measured capacity (issue 15's load test).

Run from the repository root (a short run; it starts its own Redis, worker and gateway)::

    nice .venv/bin/python -m bench.load --seconds 12

1. Capacity: ``--capacity-jobs`` jobs sent at once with admission control off; capacity = jobs /
   (first send to last result), in jobs per second. Each job sleeps ``--work`` seconds in one of the
   worker's ``--children`` children (the ``chaos`` test family's ``ok`` engine), so capacity is the
   farm's machinery plus that work, not this machine's CPU speed.
2. For each load factor (``--factors``, default 1,2,4): Poisson arrivals at factor x capacity for
   ``--seconds``, sent by ``--producers`` threads, alternately with ``submit()`` in this process and
   with ``POST /v1/jobs/chaos`` through the HTTP gateway (on a thread, loopback, no tokens). Admission
   control on: ``max_queued`` = ``--max-queued`` for the family. Every request ends as accepted
   (then its job must succeed: anything else is *lost*), refused (``Overloaded`` / ``429`` with
   ``Retry-After``) or an *error* (any other exception or status). Reported: offered and achieved
   rates, accepted, refused, lost, errors, the queue wait of served jobs (their first attempt's
   start minus the moment the request was sent: P50/P99), the deepest queue seen and Redis's
   ``used_memory`` peak (sampled every 0.1 s).
3. The highest factor again with admission control off (``enabled = false``), side by side: the
   queue and the wait it would have had.

Results go to ``bench/results/load.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.farm import REPO, farm, percentile, worker

QUEUE = "chaos"  # the family's own queue: where the gateway's route sends too

CONFIG = """
[limits.chaos]
soft = 60
hard = 90

[pools.load]
queues = ["chaos"]
concurrency = {children}
child_rss_cap_mb = 1000
max_tasks_per_child = 100000

[admission]
enabled = {enabled}
depth_cache = 0.1

[admission.families.chaos]
max_queued = {max_queued}
max_queued_per_tenant = 0
retry_after = 1
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="length of each load level")
    parser.add_argument("--factors", default="1,2,4", help="load levels, as multiples of the measured capacity")
    parser.add_argument("--work", type=float, default=0.2, help="seconds each job sleeps in its child")
    parser.add_argument("--children", type=int, default=2)
    parser.add_argument("--max-queued", type=int, default=8, help="the family's admission limit")
    parser.add_argument("--producers", type=int, default=8, help="sending threads")
    parser.add_argument("--capacity-jobs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "load.json")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="mediafarm-load-"))
    on = write_config(workdir, args, True)
    with farm(workdir, config=on, pool="load", families="tests.support.chaos"):
        run(args, workdir, on)


def write_config(workdir: Path, args: argparse.Namespace, enabled: bool) -> Path:
    path = workdir / f"farm-{'on' if enabled else 'off'}.toml"
    path.write_text(CONFIG.format(children=args.children, enabled=str(enabled).lower(), max_queued=args.max_queued))
    return path


def use_config(path: Path) -> None:
    """Point this process's admission control at ``path`` (read once per process otherwise)."""
    from mediafarm.config.admission import get_admission
    from mediafarm.config.settings import get_settings

    os.environ["FARM_CONFIG_FILE"] = str(path)
    get_settings.cache_clear()
    get_admission.cache_clear()


def run(args: argparse.Namespace, workdir: Path, on: Path) -> None:
    off = write_config(workdir, args, False)
    from mediafarm.config.settings import get_settings
    from mediafarm.gateway.server import GatewayThread, bind
    from mediafarm.gateway.settings import GatewayConfig

    with worker("load", workdir, node=f"load-{os.getpid()}@{os.uname().nodename}"):
        gateway = GatewayThread(bind("127.0.0.1", 0), GatewayConfig.from_settings(get_settings())).start()
        try:
            use_config(off)
            capacity = measure_capacity(args)
            print(f"capacity: {capacity:.1f} jobs/s ({args.children} children, {args.work} s of work a job)",
                  flush=True)  # fmt: skip
            levels = []
            factors = [float(f) for f in args.factors.split(",")]
            rng = random.Random(args.seed)
            use_config(on)
            for factor in factors:
                levels.append(level(args, factor, capacity, gateway.url, rng, admission=True))
                report(levels[-1])
            use_config(off)
            levels.append(level(args, max(factors), capacity, gateway.url, rng, admission=False))
            report(levels[-1])
        finally:
            gateway.stop()
    results = {"capacity_jobs_per_s": round(capacity, 2), "args": {k: str(v) for k, v in vars(args).items()},
               "levels": levels}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    summary(results)


def send_fields(args: argparse.Namespace) -> dict[str, Any]:
    return {"plan": {"sleep": args.work}}


def measure_capacity(args: argparse.Namespace) -> float:
    from mediafarm.tasks.producer.client import submit

    for job in [submit("chaos", queue=QUEUE, **send_fields(args)) for _ in range(2 * args.children)]:
        job.wait(timeout=60)  # warm: children started, connections open
    t0 = time.perf_counter()
    jobs = [submit("chaos", queue=QUEUE, **send_fields(args)) for _ in range(args.capacity_jobs)]
    for job in jobs:
        job.wait(timeout=300)
    return args.capacity_jobs / (time.perf_counter() - t0)


class Sampler:
    """Queue depth and Redis memory every 0.1 s while a level runs."""

    def __init__(self) -> None:
        import redis

        from mediafarm.config.settings import get_settings

        self.client = redis.Redis.from_url(get_settings().broker_url)
        self.depth = self.memory = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _depth(self) -> int:
        pipe = self.client.pipeline(transaction=False)
        for name in [QUEUE] + [f"{QUEUE}\x06\x16{n}" for n in range(1, 10)]:
            pipe.llen(name)
        return sum(pipe.execute())

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.depth = max(self.depth, self._depth())
            self.memory = max(self.memory, int(self.client.info("memory")["used_memory"]))

    def __enter__(self) -> Sampler:
        self.memory = int(self.client.info("memory")["used_memory"])
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()


def level(args: argparse.Namespace, factor: float, capacity: float, url: str, rng: random.Random,
          *, admission: bool) -> dict[str, Any]:  # fmt: skip
    import httpx

    from mediafarm.tasks.producer.client import handle, submit
    from mediafarm.tasks.wire.errors import Overloaded

    rate = factor * capacity
    arrivals, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= args.seconds:
            break
        arrivals.append(t)
    outcomes: list[dict[str, Any]] = []
    lock = threading.Lock()
    local = threading.local()

    def one(index: int) -> None:
        sent = time.time()
        record: dict[str, Any] = {"via": "http" if index % 2 else "submit", "sent": sent}
        try:
            if index % 2:
                if not hasattr(local, "http"):
                    local.http = httpx.Client(base_url=url, timeout=30)
                answer = local.http.post("/v1/jobs/chaos", json=send_fields(args), headers={"X-Priority": "4"})
                if answer.status_code == 202:
                    record.update(outcome="accepted", id=answer.json()["id"])
                elif answer.status_code == 429 and answer.headers.get("retry-after"):
                    record.update(outcome="refused")
                else:
                    record.update(outcome="error", detail=f"{answer.status_code} {answer.text[:200]}")
            else:
                record.update(outcome="accepted", id=submit("chaos", queue=QUEUE, **send_fields(args)).id)
        except Overloaded:
            record.update(outcome="refused")
        except Exception as exc:  # noqa: BLE001 - every other ending is counted as an error
            record.update(outcome="error", detail=f"{type(exc).__name__}: {exc}"[:200])
        with lock:
            outcomes.append(record)

    start = time.perf_counter()
    with Sampler() as sampler, ThreadPoolExecutor(args.producers) as pool:
        for index, at in enumerate(arrivals):
            delay = at - (time.perf_counter() - start)
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, index)
        sending = time.perf_counter() - start
        pool.shutdown(wait=True)
        accepted = [o for o in outcomes if o["outcome"] == "accepted"]
        lost, waits = [], []
        for record in accepted:
            job = handle(record["id"], "chaos")
            try:
                job.wait(timeout=120)
                waits.append(job.attempts()[0]["started"] - record["sent"])
            except Exception as exc:  # noqa: BLE001 - a job accepted and not served is lost
                lost.append(f"{record['id']}: {type(exc).__name__}: {exc}"[:200])
    errors = [o["detail"] for o in outcomes if o["outcome"] == "error"]
    return {
        "factor": factor, "admission": admission, "offered_per_s": round(len(arrivals) / args.seconds, 1),
        "sent_per_s": round(len(arrivals) / sending, 1), "requests": len(outcomes),
        "accepted": len(accepted), "refused": sum(o["outcome"] == "refused" for o in outcomes),
        "lost": len(lost), "errors": len(errors), "first_errors": (errors + lost)[:3],
        "wait_p50_s": round(percentile(waits, 50), 3), "wait_p99_s": round(percentile(waits, 99), 3),
        "max_depth": sampler.depth, "redis_used_memory_peak_mb": round(sampler.memory / 2**20, 2),
    }  # fmt: skip


def report(row: dict[str, Any]) -> None:
    print(f"{row['factor']:g}x admission {'on ' if row['admission'] else 'off'}: offered {row['offered_per_s']}/s, "
          f"{row['requests']} requests: {row['accepted']} accepted, {row['refused']} refused, {row['lost']} lost, "
          f"{row['errors']} errors; wait P50 {row['wait_p50_s']} s P99 {row['wait_p99_s']} s; deepest queue "
          f"{row['max_depth']}, Redis peak {row['redis_used_memory_peak_mb']} MiB", flush=True)  # fmt: skip
    if row["first_errors"]:
        print("  first errors:", row["first_errors"], flush=True)


def summary(results: dict[str, Any]) -> None:
    on = [r for r in results["levels"] if r["admission"]]
    base, top = on[0], on[-1]
    clean = all(r["lost"] == 0 and r["errors"] == 0 for r in results["levels"])
    ratio = top["wait_p99_s"] / base["wait_p99_s"] if base["wait_p99_s"] else float("nan")
    print(f"\nevery request served or refused, 0 lost, 0 errors: {'PASS' if clean else 'FAIL'}")
    print(f"P99 queue wait at {top['factor']:g}x / at {base['factor']:g}x: {ratio:.2f} "
          f"({'PASS' if ratio <= 2 else 'FAIL'} target <= 2)")  # fmt: skip
    print(f"median of the levels' P50 waits: {statistics.median(r['wait_p50_s'] for r in on):.3f} s")


if __name__ == "__main__":
    main()
