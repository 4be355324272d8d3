"""The whole cam-filter pipeline on a real farm, as a multiple of real time, next to the decode floor.

    .venv/bin/python -m bench.camfilter --seconds 600
    .venv/bin/python -m bench.camfilter --seconds 600 --height 2160 --fps 48 --gop 5

Input (made once under ``--workdir``): a 1280x720, 15 fps H.264 recording (GOP 30) of a still
scene in which a dark rectangle moves during three short spans, with espeak-ng speech at a few
other moments on its AAC track (``--seconds`` long). With ``--height`` 1080 or 2160 the same
kind of scene is drawn by FFmpeg (lavfi: a still grey scene with two blocks and a dark box that
shows during the three spans; x264 ``veryfast``, a keyframe every ``--gop`` seconds, exactly):
camera sizes and rates, and GOPs long enough that the clips' starts fall between keyframes.
Models: a random-weight YOLO11n exported to ONNX (it detects nothing; what is measured is the
cost of the stages, not their findings).

The farm: an embedded Redis and one worker of the cpu pool with two children, so VAD and YOLO
run in parallel as in production. Measured: the decode-only time of the same file in this process
(every video frame and the audio: the floor of any stage that looks at all of it), then
``--runs`` cam-filter pipelines (VAD ∥ YOLO → cut) from submit to result, median. Results go to
``bench/results/camfilter.json``. The machine is shared: the multiples, not the seconds, count.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "camfilter.json"


WIDTHS = {1080: 1920, 2160: 3840}


def make_recording(workdir: Path, seconds: float, height: int = 720, fps: int = 15, gop: float = 2.0) -> Path:
    from tests.support.speech import PHRASES, make_track
    from tests.support.yolo import make_video

    size = "" if height == 720 else f"{height}p{fps}-gop{gop:g}-"
    target = workdir / f"recording-{size}{int(seconds)}.mp4"
    if target.exists():
        return target
    moving = [(seconds * f, seconds * f + 8.0) for f in (0.15, 0.45, 0.75)]
    # Speech at three other moments: silence, phrase, silence ... filling the whole length.
    phrases = PHRASES[:3]
    gaps = [seconds * 0.3, seconds * 0.25, seconds * 0.25, 1.0]
    track = make_track(workdir / "speech.wav", gaps=gaps, phrases=phrases)
    if height == 720:
        silent = make_video(workdir / "silent.mp4", duration=track.duration, moving=moving, width=1280, height=720,
                            fps=15, gop=30, preset="veryfast")  # fmt: skip
    else:
        silent = drawn_video(workdir / "silent.mp4", track.duration, moving, height, fps, gop)
    subprocess.run(["ffmpeg", "-y", "-v", "error", "-i", str(silent), "-i", str(track.path), "-c:v", "copy",
                    "-c:a", "aac", "-shortest", str(target)], check=True)  # fmt: skip
    silent.unlink()
    return target


def drawn_video(target: Path, seconds: float, moving: list[tuple[float, float]], height: int, fps: int,
                gop: float) -> Path:  # fmt: skip
    """A still scene in which a dark box shows during ``moving``, drawn and encoded by FFmpeg."""
    w, h = WIDTHS[height], height
    keyint = int(gop * fps)
    enable = "+".join(f"between(t,{a:.2f},{b:.2f})" for a, b in moving)
    scene = (f"drawbox=x={w // 8}:y={h // 6}:w={w // 8}:h={h // 6}:color=0x1E783C:t=fill,"
             f"drawbox=x={w * 3 // 4}:y={h // 2}:w={w // 8}:h={h // 4}:color=0xC8B428:t=fill,"
             f"drawbox=x={w // 4}:y={h * 3 // 8}:w={w // 10}:h={h // 4}"
             f":color=0x141414:t=fill:enable='{enable}'")  # fmt: skip
    subprocess.run(["ffmpeg", "-y", "-v", "error", "-f", "lavfi", "-i", f"color=c=0x7A7A7A:s={w}x{h}:r={fps}",
                    "-t", f"{seconds:.3f}", "-vf", scene, "-c:v", "libx264", "-preset", "veryfast", "-pix_fmt",
                    "yuv420p", "-x264-params", f"keyint={keyint}:min-keyint={keyint}:scenecut=0", str(target)],
                   check=True)  # fmt: skip
    return target


def decode_floor(path: Path) -> float:
    import av

    started = time.perf_counter()
    with av.open(str(path)) as container:
        container.streams.video[0].thread_type = "AUTO"
        for _ in container.decode(video=0, audio=0):
            pass
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--height", type=int, default=720, choices=(720, 1080, 2160))
    parser.add_argument("--fps", type=int, default=48, help="with --height 1080 or 2160")
    parser.add_argument("--gop", type=float, default=5.0, help="seconds between keyframes, with --height")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mediafarm-bench-camfilter")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    media = make_recording(args.workdir, args.seconds, args.height, args.fps, args.gop)
    models = args.workdir / "models"
    if not (models / "yolo11n.onnx").exists():
        from tests.support.yolo import build_random_yolo

        build_random_yolo(models, args.workdir / "ultralytics-build")
    from mediafarm.workers.embedded import EmbeddedRedis

    redis = EmbeddedRedis(data_dir=args.workdir / "redis").start()
    os.environ.update(FARM_BROKER_URL=redis.url, FARM_RESULT_BACKEND=redis.url, FARM_MEDIA_ROOTS=str(args.workdir),
                      FARM_STORAGE_DIR=str(args.workdir / "storage"), FARM_MODELS_DIR=str(models),
                      PYTHONPATH=str(ROOT))  # fmt: skip
    try:
        results = run(args, media)
    finally:
        redis.stop()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


def run(args: argparse.Namespace, media: Path) -> dict:
    from mediafarm import submit
    from mediafarm.config.pools import get_pool
    from mediafarm.tasks.app import app
    from mediafarm.workers.launch import spawn_worker, stop_worker, wait_ready

    node = f"bench-camfilter-{os.getpid()}@{os.uname().nodename}"
    with (args.workdir / "worker.log").open("wb") as log:
        worker = spawn_worker(get_pool("cpu"), logfile=log, node=node, concurrency=2, loglevel="WARNING")
    try:
        wait_ready(app, node, worker, timeout=120)
        floors = [decode_floor(media) for _ in range(args.runs)]
        walls, envelope = [], {}
        for _ in range(args.runs):
            started = time.perf_counter()
            envelope = submit("camfilter", media=str(media)).wait(timeout=3600)
            walls.append(time.perf_counter() - started)
    finally:
        stop_worker(worker)
    output = envelope["output"]
    duration = output["duration"]
    wall, floor = statistics.median(walls), statistics.median(floors)
    return {
        "seconds_of_video": duration,
        "decode_floor_s": round(floor, 2), "decode_floor_x_real_time": round(duration / floor, 1),
        "pipeline_wall_s": [round(w, 2) for w in walls], "pipeline_median_s": round(wall, 2),
        "pipeline_x_real_time": round(duration / wall, 1), "pipeline_over_floor": round(wall / floor, 2),
        "clips": len(output["clips"]), "kept_s": output["kept"],
        "stages": {name: stage["rung"] for name, stage in output["stages"].items()},
        # The last run's attempts: seconds and the child's peak RSS of each stage and of the cut.
        "stage_s": {name: _last(stage["attempts"], "duration") for name, stage in output["stages"].items()}
        | {"cut": _last(envelope["attempts"], "duration")},
        "stage_peak_rss_mb": {name: _last(stage["attempts"], "peak_rss_mb") for name, stage in output["stages"].items()}
        | {"cut": _last(envelope["attempts"], "peak_rss_mb")},
        "cut_methods": sorted({c["method"] for c in output["clips"]}),
        "reencoded_s": round(sum(c.get("reencoded", 0.0) for c in output["clips"]), 2),
    }  # fmt: skip


def _last(attempts: list[dict], key: str) -> float | None:
    value = attempts[-1].get(key) if attempts else None
    return round(value, 2) if isinstance(value, int | float) else value


if __name__ == "__main__":
    main()
