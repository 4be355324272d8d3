"""Redis vs RabbitMQ as the farm's broker, side by side in one run (issue #10).

    .venv/bin/python -m bench.brokers --kills 10 --jobs 500 --rounds 3 --workers 1,2,4

1. Whole-worker death → the job running again: two workers (prefork 1 each) consume one queue;
   a 4 s job starts on one of them, the whole worker (main process and child) is SIGKILLed, and
   the time from the kill to the job's next attempt record is measured; the dead worker is
   replaced before the next round. On Redis the message comes back when a live worker's restore
   sweep finds it older than the visibility timeout (here 15 s, every 1 s: in production it must
   exceed the longest hard limit, 7200 s by default); on RabbitMQ when the broker sees the dead
   worker's connection close.
2. Throughput of no-op farm jobs with 1, 2 and 4 workers (prefork 1 each) on one broker: each
   round sends ``--jobs`` jobs and times first send to last result; median of ``--rounds``.
   The result backend is the same Redis for both brokers.

Starts its own Redis and, on the machine's RabbitMQ, a vhost of its own (removed at the end,
with ``rabbitmqctl``); nothing else is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

CONFIG = """
[limits.chaos]
soft = 10
hard = 12

[pools.bench]
queues = ["bench"]
concurrency = 1
child_rss_cap_mb = 400
max_tasks_per_child = 100000

[ladders.noop]
family = "chaos"
rungs = [{ name = "noop", engine = "ok" }]

[ladders.sleepy]
family = "chaos"
rungs = [{ name = "sleepy", engine = "ok", params = { sleep = 4 } }]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "brokers.json")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="mediafarm-bench-brokers-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from mediafarm.workers.embedded import EmbeddedRedis
    from tests.support.rabbitmq import own_vhost

    redis = EmbeddedRedis(data_dir=workdir / "redis").start()
    try:
        with own_vhost("mediafarm-bench") as amqp_url:
            prepare_environment(workdir, redis.url)
            brokers = {"redis": redis.url, "rabbitmq": amqp_url}
            results = {name: bench_broker(args, workdir, url, redis.url, name) for name, url in brokers.items()}
    finally:
        redis.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    report(results)


def prepare_environment(workdir: Path, redis_url: str) -> None:
    from mediafarm.config.settings import get_settings
    from tests.support.chaos_suite import short_limits_toml

    config = workdir / "farm.toml"
    config.write_text(CONFIG)
    os.environ.update(
        FARM_CONFIG_FILE=str(config), FARM_FAMILY_MODULES="tests.support.chaos", FARM_POOL="bench",
        FARM_MEDIA_ROOTS=str(workdir), FARM_STORAGE_DIR=str(workdir / "storage"), PYTHONPATH=str(REPO),
        FARM_RESULT_BACKEND=redis_url, FARM_VISIBILITY_TIMEOUT="15", FARM_RESTORE_INTERVAL="1",
    )  # fmt: skip
    get_settings.cache_clear()
    # Short hard limits for every family, so a 15 s visibility timeout passes the worker's check.
    config.write_text(CONFIG + short_limits_toml(but="chaos"))


class Workers:
    """The bench's workers on one broker, each a prefork pool of one child."""

    def __init__(self, workdir: Path, broker_url: str, app: Any) -> None:
        self.workdir, self.broker_url, self.app = workdir, broker_url, app
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> str:
        from mediafarm.config.pools import get_pool
        from mediafarm.workers.launch import spawn_worker, wait_ready

        node = f"bench-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
        with (self.workdir / f"{node.split('@')[0]}.log").open("wb") as log:
            process = spawn_worker(get_pool("bench"), env={**os.environ, "FARM_BROKER_URL": self.broker_url},
                                   logfile=log, node=node, loglevel="WARNING")  # fmt: skip
        wait_ready(self.app, node, process, timeout=90)
        self.running[node] = process
        return node

    def kill(self, node: str) -> float:
        """SIGKILL the whole worker; returns the time the signal was sent."""
        process = self.running.pop(node)
        killed_at = time.time()
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        return killed_at

    def stop_all(self) -> None:
        from mediafarm.workers.launch import stop_worker

        for process in self.running.values():
            stop_worker(process, timeout=20)
        self.running.clear()


def bench_broker(args: argparse.Namespace, workdir: Path, broker_url: str, backend_url: str, name: str) -> dict:
    from tests.support.farm_app import farm_app

    app = farm_app(broker_url, backend_url, name="bench")
    print(f"--- {name}", flush=True)
    try:
        return {"worker_death": worker_death(args, workdir, broker_url, app), "throughput": throughput(args, workdir,
                                                                                                      broker_url, app)}
    finally:
        app.close()


def worker_death(args: argparse.Namespace, workdir: Path, broker_url: str, app: Any) -> dict:
    import redis

    from mediafarm.tasks.wire import keys

    client = redis.Redis.from_url(os.environ["FARM_RESULT_BACKEND"])
    workers = Workers(workdir, broker_url, app)
    delays = []
    try:
        workers.start(), workers.start()
        for _ in range(args.kills):
            job = app.send_task("farm.test.chaos", kwargs={"ladder": "sleepy"}, queue="bench")
            history = keys.history(job.id)
            while not client.llen(history):
                time.sleep(0.01)
            victim = json.loads(client.lindex(history, 0))["worker"]
            killed_at = workers.kill(victim)
            while client.llen(history) < 2:
                time.sleep(0.01)
            delays.append(json.loads(client.lindex(history, 1))["started"] - killed_at)
            envelope = job.get(timeout=120)
            assert [a["outcome"] for a in envelope["attempts"]] == ["worker_lost", "ok"], envelope["attempts"]
            print(f"  worker death -> running again: {delays[-1]:.3f} s", flush=True)
            workers.start()
    finally:
        workers.stop_all()
        client.close()
    return {"runs": len(delays), "median_s": round(statistics.median(delays), 3), "max_s": round(max(delays), 3),
            "all_s": [round(d, 3) for d in delays]}  # fmt: skip


def throughput(args: argparse.Namespace, workdir: Path, broker_url: str, app: Any) -> dict:
    from bench.overhead import run_batch  # the same batch timing as the overhead bench

    results = {}
    workers = Workers(workdir, broker_url, app)
    try:
        for count in (int(n) for n in args.workers.split(",")):
            while len(workers.running) < count:
                workers.start()
            send = lambda: app.send_task("farm.test.chaos", kwargs={"ladder": "noop"}, queue="bench")  # noqa: E731
            run_batch(send, 100)  # warm-up
            rates = [args.jobs / run_batch(send, args.jobs) for _ in range(args.rounds)]
            results[str(count)] = {"median_jobs_per_s": round(statistics.median(rates), 1),
                                   "rounds": [round(r, 1) for r in rates]}  # fmt: skip
            print(f"  {count} worker(s): {results[str(count)]}", flush=True)
    finally:
        workers.stop_all()
    return results


def report(results: dict) -> None:
    print()
    for name, r in results.items():
        d = r["worker_death"]
        rates = ", ".join(f"{n}: {t['median_jobs_per_s']}" for n, t in r["throughput"].items())
        print(f"{name}: worker death -> running again, median of {d['runs']}: {d['median_s']:.3f} s "
              f"(max {d['max_s']:.3f}); no-op jobs/s by workers: {rates}")  # fmt: skip


if __name__ == "__main__":
    main()
