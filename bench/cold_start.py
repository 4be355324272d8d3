"""What a pool scaled from zero costs its first job: a worker's start, and its first job against a warm one.

    .venv/bin/python -m bench.cold_start --starts 3

For each of ``--starts`` cold starts: a fresh ``cpu`` worker (``farm worker``'s launch, one child)
on an embedded Redis, with faster-whisper tiny.en in its models folder. Timed: the launch until
the worker answers a ping (``wait_ready``), and until its capability record is live (the moment
routing can send it jobs, ``tasks.wire.capability``); then a subtitle job on a short clip, sent as soon
as the record is live (its child loads the model), and the same job again (warm). Reported: the
median of each over the starts, and cold job / warm job. This is a worker's part of a wake only:
what comes before it on Kubernetes (KEDA's poll of a Prometheus scrape, the HPA's sync, a pod
scheduled, a node added by the cluster autoscaler, the image pulled) is the cluster's, not measured
here; on a GPU pool the first job's CUDA context and model upload come on top.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.farm import farm, worker


def one_start(workdir: Path, clip: Path, index: int) -> tuple[float, float, float, float]:
    """(launch -> ping, launch -> record live, cold job, warm job) in seconds."""
    from mediafarm.tasks.app import app
    from mediafarm.tasks.producer.client import submit
    from mediafarm.tasks.wire import capability

    node = f"cold-{index}-{os.getpid()}@{os.uname().nodename}"
    launched = time.monotonic()
    with worker("cpu", workdir, node=node, log=f"worker-{index}.log", concurrency=1, queues=["subtitle"]):
        ready = time.monotonic() - launched
        while node not in {r.node for r in capability.live(app.backend.client)}:
            if time.monotonic() - launched > 120:
                raise SystemExit(f"{node} wrote no capability record in 120 s (log: {workdir}/worker-{index}.log)")
            time.sleep(0.05)
        live = time.monotonic() - launched
        jobs = []
        for _ in range(2):
            sent = time.monotonic()
            envelope = submit("subtitle", media=str(clip)).wait(timeout=300)
            jobs.append(time.monotonic() - sent)
            assert envelope["output"]["cues"], envelope
    return ready, live, jobs[0], jobs[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=3, help="cold starts measured")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    workdir = Path(tempfile.mkdtemp(prefix="mediafarm-cold-start-"))
    models = workdir / "models"
    models.mkdir()
    from tests.support.speech import PHRASES, make_track
    from tests.support.tiny_whisper import tiny_en_source

    source = tiny_en_source()
    if source is None:
        raise SystemExit("faster-whisper tiny.en is not installed (the dev extra's test wheel)")
    (models / "faster-whisper-tiny.en").symlink_to(source, target_is_directory=True)
    clip = make_track(workdir / "clip.wav", gaps=(0.3, 0.5, 0.3), phrases=PHRASES[:2]).path
    print("load average before:", os.getloadavg())
    rows = []
    with farm(workdir, models=models):
        for i in range(args.starts):
            rows.append(one_start(workdir, clip, i))
            print("start %d: ping %.2f s, record live %.2f s, cold job %.2f s, warm job %.2f s" % (i, *rows[-1]))
    ready, live, cold, warm = (statistics.median(c) for c in zip(*rows))
    print(f"medians of {args.starts}: launch -> ping {ready:.2f} s, launch -> record live {live:.2f} s, "
          f"first job {cold:.2f} s, warm job {warm:.2f} s, first / warm {cold / warm:.2f}")
    print("load average after:", os.getloadavg())


if __name__ == "__main__":
    main()
