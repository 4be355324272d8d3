"""What a farm worker costs around its jobs: its main process's CPU while idle, thread by thread,
and the round trip of a short job (submit to result, less the attempt's own time).

    .venv/bin/python -m bench.worker_idle --idle 20 --jobs 15

A worker of the ``cpu`` pool with one child on the ``tts`` queue (``bench.peers.farm_worker``) and
an embedded Redis. Idle: the main process's CPU over ``--idle`` seconds, and each of its threads'
(psutil; threads are unnamed to the kernel, so they are listed by id, the busiest first). Round trip:
``--jobs`` one-sentence TTS jobs on ``--rung`` sent one after another after two warm-up jobs (the
voice's load); the attempt's start and duration come from the result's ``attempts``. Reported:
medians of submit -> attempt start, the attempt, attempt end -> result at the caller.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.farm import SENTENCES, farm


def idle_cpu(pid: int, seconds: float) -> None:
    import psutil

    process = psutil.Process(pid)

    def threads() -> dict[int, float]:
        return {t.id: t.user_time + t.system_time for t in process.threads()}

    time.sleep(3)  # the worker's start-up settles
    before, cpu0, t0 = threads(), sum(process.cpu_times()[:2]), time.monotonic()
    time.sleep(seconds)
    after, cpu1, wall = threads(), sum(process.cpu_times()[:2]), time.monotonic() - t0
    print(f"idle main process: {cpu1 - cpu0:.3f} CPU-s over {wall:.1f} s = {(cpu1 - cpu0) / wall:.4f} CPU-s a second")
    for tid in sorted(after, key=lambda t: before.get(t, 0) - after[t]):
        spent = after[tid] - before.get(tid, 0)
        print(f"  thread {tid}: {spent:.3f} CPU-s ({spent / wall:.4f} a second)")


def round_trip(rung: str, jobs: int) -> None:
    from mediafarm.tasks.producer.client import submit

    rows = []
    for i in range(jobs + 2):
        sent = time.time()
        envelope = submit("tts", text=SENTENCES[0], ladder=rung, format="wav").wait(timeout=120)
        done = time.time()
        attempt = envelope["attempts"][-1]
        if i >= 2:  # the first two load the voice
            ended = attempt["started"] + attempt["duration"]
            rows.append((done - sent, attempt["started"] - sent, attempt["duration"], done - ended))
    total, start, attempt, result = (statistics.median(c) * 1e3 for c in zip(*rows))
    print(f"{rung}, {jobs} one-sentence jobs, medians: submit -> result {total:.1f} ms = submit -> attempt start "
          f"{start:.1f} + attempt {attempt:.1f} + attempt end -> result {result:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=float, default=20, help="seconds of idle CPU measured")
    ap.add_argument("--jobs", type=int, default=15, help="short jobs timed for the round trip")
    ap.add_argument("--rung", default="espeak", help="the tts rung the short jobs start on (espeak or piper)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    workdir = Path(tempfile.mkdtemp(prefix="mediafarm-worker-idle-"))
    (workdir / "models").mkdir()
    if args.rung == "piper":
        from tests.support.piper_voice import link_joe_voice

        link_joe_voice(workdir / "models", required=True)
    print("load average before:", os.getloadavg())
    with farm(workdir, models=workdir / "models"):
        from bench.peers import farm_worker

        with farm_worker(workdir, "tts") as pid:
            idle_cpu(pid, args.idle)
            round_trip(args.rung, args.jobs)
    print("load average after:", os.getloadavg())


if __name__ == "__main__":
    main()
