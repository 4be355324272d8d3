"""What the rung circuit breaker saves when a rung always runs out of memory (issue 15).

    .venv/bin/python -m bench.breaker --jobs 20 --rounds 3

One worker (prefork 2, child RSS cap 400 MiB) and two ladders with the same rungs: ``hungry``
allocates past the cap, so the watchdog kills every child that runs it, and ``frugal`` answers.
One ladder has its breaker off, the other the default threshold (3 resource failures in 60 s open
it) with a cool-down of 5 s instead of 30, so that probes happen within a batch. Each round sends
``--jobs`` jobs of each ladder at once (which goes first alternates between rounds; every breaker
is closed again before a round, and the workers' cached view of it left to expire) and waits for
them all.
Reported per ladder: watchdog kills (attempts ``killed``), probes, jobs skipped past the open rung,
jobs per second from the first send to the last result; medians over the rounds.

The worker and an embedded Redis are started by the script; nothing else is touched.
"""

from __future__ import annotations

import argparse
import json
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

[ladders.no_breaker]
family = "chaos"
breaker = { enabled = false }
rungs = [
  { name = "hungry", engine = "hog", params = { mb = 900 } },
  { name = "frugal", engine = "ok" },
]

[ladders.breaker]
family = "chaos"
breaker = { cooldown_s = 5 }
rungs = [
  { name = "hungry", engine = "hog", params = { mb = 900 } },
  { name = "frugal", engine = "ok" },
]
"""

LADDERS = ("no_breaker", "breaker")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "breaker.json")
    args = parser.parse_args()

    with chaos_farm(CONFIG) as workdir, worker("bench", workdir):
        from mediafarm.tasks.app import app

        rounds = []
        for r in range(args.rounds):
            order = LADDERS if r % 2 == 0 else LADDERS[::-1]
            rounds.append({ladder: batch(app, ladder, args.jobs) for ladder in order})
            print(f"round {r + 1}: {json.dumps(rounds[-1])}", flush=True)
    results = {"jobs": args.jobs, "rounds": rounds, "median": {
        ladder: {k: statistics.median(r[ladder][k] for r in rounds) for k in rounds[0][ladder]} for ladder in LADDERS
    }}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    report(results)


def batch(app, ladder: str, n: int) -> dict:
    from mediafarm.tasks.producer.client import submit
    from mediafarm.tasks.wire import keys

    app.backend.client.delete(keys.breakers("bench"), keys.breaker_failures("bench", ladder, "hungry"))
    time.sleep(1.5)  # past refresh_s: no child acts on what it read of the last round's breaker
    t0 = time.perf_counter()
    jobs = [submit("chaos", queue="bench", ladder=ladder) for _ in range(n)]
    envelopes = [job.wait(timeout=600) for job in jobs]
    seconds = time.perf_counter() - t0
    attempts = [a for e in envelopes for a in e["attempts"]]
    assert all(e["rung"] == "frugal" for e in envelopes)
    return {
        "kills": sum(a["outcome"] == "killed" for a in attempts),
        "probes": sum("the breaker's probe" in (a["reason"] or "") for a in attempts),
        "skipped": sum(a["outcome"] == "skipped" for a in attempts),
        "jobs_per_s": round(n / seconds, 2),
    }


def report(results: dict) -> None:
    m = results["median"]
    off, on = m["no_breaker"], m["breaker"]
    print(f"\n{results['jobs']} jobs whose first rung is always killed, medians of {len(results['rounds'])} rounds:")
    print(f"  breaker off: {off['kills']:g} kills, {off['jobs_per_s']:.2f} jobs/s")
    print(f"  breaker on:  {on['kills']:g} kills ({on['probes']:g} of them probes), {on['skipped']:g} jobs skipped "
          f"the rung, {on['jobs_per_s']:.2f} jobs/s ({on['jobs_per_s'] / off['jobs_per_s']:.1f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
