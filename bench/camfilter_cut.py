"""The cam-filter's cut, clip by clip: smart cut against full re-encode, side by side (issue #20).

    nice .venv/bin/python -m bench.camfilter_cut --heights 1080,2160 --gops 1,2,5 --clip 30 --runs 3

Recordings (made once under ``--workdir`` with FFmpeg's lavfi ``testsrc2``, a busy synthetic scene
that changes every frame): 48 fps, H.264 High with two B-frames (x264 ``ultrafast`` with CABAC
and B-frames back on, CRF 26), a keyframe exactly every GOP, a 440 Hz AAC track; the clip plus
6 s long. In each, one clip of ``--clip`` seconds that starts half a GOP and a frame past a
keyframe, so its smart cut re-encodes half a GOP (the average over random starts).

Every cut runs in a fresh child process, as the pool runs a job: the child probes the recording
(its packets, as the cut stage does once per recording), cuts the clip with ``mode="auto"`` (the
smart cut) or ``mode="reencode"`` (the whole clip decoded and encoded again), and reports the
cut's wall and CPU seconds and the child's peak RSS (``ru_maxrss``: interpreter, PyAV, FFmpeg
and the cut together). Smart and re-encode alternate, ``--runs`` times each; medians. The check
every clip then passes (decoding it again, ``check.verify_clip``) is timed once per recording,
apart. The machine is shared: the CPU seconds and the ratios, not the wall seconds, count.
Results go to ``bench/results/camfilter_cut.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "camfilter_cut.json"
FPS = 48
WIDTHS = {720: 1280, 1080: 1920, 1440: 2560, 2160: 3840}

_CHILD = """
import json, resource, sys, time
from pathlib import Path
from mediafarm.tasks.families.camfilter.cut import cut_clip
from mediafarm.tasks.families.camfilter.source import probe_source
path, start, end, target, mode = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
source = probe_source(Path(path))
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
idle = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
wall, used = time.perf_counter(), cpu()
clip = cut_clip(source, start, end, Path(target), mode=mode)
wall, used = time.perf_counter() - wall, cpu() - used
if sys.argv[6:] == ["check"]:
    from mediafarm.tasks.families.camfilter.check import verify_clip
    checked = time.perf_counter()
    verify_clip(clip.path, source, clip.start, clip.end, clip.method)
    check = time.perf_counter() - checked
else:
    check = None
print(json.dumps({"method": clip.method, "reencoded_s": clip.reencoded, "wall_s": wall, "cpu_s": used,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "probed_rss_mib": idle, "check_s": check, "bytes": Path(target).stat().st_size}))
"""


def make_recording(workdir: Path, height: int, gop: float, seconds: float) -> Path:
    """The test recording (FFmpeg, lavfi); made once, reused by name."""
    target = workdir / f"cam-{height}p{FPS}-gop{gop:g}-{seconds:g}s.mp4"
    if target.exists():
        return target
    keyint = int(gop * FPS)
    part = target.with_suffix(".part.mp4")
    subprocess.run(
        ["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", f"testsrc2=size={WIDTHS[height]}x{height}:rate={FPS}",
         "-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000", "-t", f"{seconds:g}",
         "-c:v", "libx264", "-preset", "ultrafast", "-crf", "26", "-pix_fmt", "yuv420p",
         "-x264-params", f"bframes=2:cabac=1:keyint={keyint}:min-keyint={keyint}:scenecut=0",
         "-c:a", "aac", "-b:a", "96k", "-shortest", str(part)],
        check=True,
    )  # fmt: skip
    part.rename(target)
    return target


def cut_in_child(path: Path, start: float, end: float, target: Path, mode: str, check: bool = False) -> dict:
    argv = [sys.executable, "-c", _CHILD, str(path), str(start), str(end), str(target), mode]
    proc = subprocess.run(argv + (["check"] if check else []), capture_output=True, text=True, cwd=ROOT, check=False)
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_one(workdir: Path, height: int, gop: float, clip: float, runs: int) -> dict:
    path = make_recording(workdir, height, gop, clip + 6)
    start = gop / 2 + 1 / FPS  # half a GOP and a frame past the keyframe at 0
    end = start + clip
    smart, full = [], []
    for run in range(runs):
        smart.append(cut_in_child(path, start, end, workdir / f"smart-{height}.mp4", "auto", check=run == 0))
        full.append(cut_in_child(path, start, end, workdir / f"full-{height}.mp4", "reencode"))

    def median(rows: list[dict], key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 2)

    row = {
        "recording": f"{WIDTHS[height]}x{height} @ {FPS} fps, GOP {gop:g} s", "clip_s": clip,
        "start_s": round(start, 3),
        "smart_method": smart[0]["method"], "smart_reencoded_s": smart[0]["reencoded_s"],
        "smart_wall_s": median(smart, "wall_s"), "smart_cpu_s": median(smart, "cpu_s"),
        "smart_peak_rss_mib": median(smart, "peak_rss_mib"),
        "full_wall_s": median(full, "wall_s"), "full_cpu_s": median(full, "cpu_s"),
        "full_peak_rss_mib": median(full, "peak_rss_mib"), "probed_rss_mib": median(smart, "probed_rss_mib"),
        "check_s": round(smart[0]["check_s"], 2), "runs": runs,
    }  # fmt: skip
    row["speedup_wall"] = round(row["full_wall_s"] / row["smart_wall_s"], 1)
    row["speedup_cpu"] = round(row["full_cpu_s"] / row["smart_cpu_s"], 1)
    row["rss_ratio"] = round(row["smart_peak_rss_mib"] / row["full_peak_rss_mib"], 2)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heights", default="1080,2160", help="comma list of 720, 1080, 1440, 2160")
    parser.add_argument("--gops", default="1,2,5", help="comma list of seconds between keyframes")
    parser.add_argument("--clip", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mediafarm-bench-camcut")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON results go")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = [
        bench_one(args.workdir, int(height), float(gop), args.clip, args.runs)
        for height in args.heights.split(",")
        for gop in args.gops.split(",")
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
