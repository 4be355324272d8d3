"""Test media and models for the YOLO family, all made here, offline.

- :func:`make_video`: a static, textured scene in which a filled rectangle moves during known
  spans (PyAV, H.264; optionally a tone track, noisy spans, muxer options); :data:`MOVING` is its
  truth. :func:`truncated`: a copy of a file cut short.
- :func:`build_random_yolo`: a random-weight YOLO11n from ultralytics' own yaml, with COCO's class
  names, saved as ``.pt`` and exported to ONNX (320 px, so it runs fast). Built in a subprocess
  with ultralytics switched offline, so this test process never imports ultralytics online.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import av
import numpy as np
import soundfile as sf

WIDTH, HEIGHT, FPS = 320, 180, 10
# Seconds in which the rectangle moves; it is still (and visible) everywhere else.
MOVING: tuple[tuple[float, float], ...] = ((2.0, 4.0), (7.0, 9.0))
DURATION = 12.0
EXPORT_SIZE = 320

_BUILD = """
import sys
from pathlib import Path
from ultralytics import YOLO
from ultralytics.utils import ROOT, YAML, SETTINGS
SETTINGS.update(sync=False)
target = Path(sys.argv[1])
model = YOLO("yolo11n.yaml")
model.model.names = YAML.load(ROOT / "cfg" / "datasets" / "coco.yaml")["names"]
model.save(str(target / "yolo11n.pt"))
YOLO(str(target / "yolo11n.pt")).export(format="onnx", imgsz=int(sys.argv[2]))
"""


def scene(width: int = WIDTH, height: int = HEIGHT) -> np.ndarray:
    """The static background: a grey gradient with two fixed blocks, RGB; the moving rectangle
    (near black) stands out by at least 60 grey levels everywhere."""
    x = np.linspace(90, 160, width, dtype=np.float32)
    y = np.linspace(0, 30, height, dtype=np.float32)[:, None]
    grey = (x[None, :] + y).astype(np.uint8)
    frame = np.repeat(grey[:, :, None], 3, axis=2)
    frame[height // 6 : height // 3, width // 8 : width // 4] = (30, 120, 60)
    frame[height // 2 : height * 3 // 4, width * 3 // 4 : width * 7 // 8] = (200, 180, 40)
    return frame


def rectangle_at(t: float, moving: Sequence[tuple[float, float]], width: int, height: int) -> int:
    """x of the rectangle's left edge at ``t``: it advances only inside the moving spans."""
    travelled = sum(max(0.0, min(t, end) - start) for start, end in moving)
    return int(width * 0.05 + travelled * width * 0.08) % int(width * 0.8)


def make_video(
    path: Path,
    *,
    duration: float = DURATION,
    moving: Sequence[tuple[float, float]] = MOVING,
    width: int = WIDTH,
    height: int = HEIGHT,
    fps: int = FPS,
    codec: str = "libx264",
    gop: int | None = None,
    preset: str | None = None,
    options: dict[str, str] | None = None,
    audio_seconds: float | None = None,
    audio_codec: str = "aac",
    audio_track: Path | None = None,
    noisy: Sequence[tuple[float, float]] = (),
) -> Path:
    """Write the test video: the scene, and a rectangle that moves only during ``moving``.

    The container is the suffix's. ``options``: the muxer's (``{"movflags": "+faststart"}`` puts an
    MP4's index first). ``audio_seconds``: add a tone track that long (it may outlast the video),
    interleaved with the video as a camera writes it; ``audio_track``: a mono WAV's samples instead (a
recording with speech at known times, at the WAV's own rate). ``noisy``: spans of random-noise frames, so
    the bitrate swings (VBR) far from its mean.
    """
    background = scene(width, height)
    box_w, box_h = max(4, width // 10), max(4, height // 4)
    top = height // 2 - box_h // 2
    rng = np.random.default_rng(0)
    with av.open(str(path), "w", options=options or {}) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if gop:
            stream.codec_context.gop_size = gop
        if preset:
            stream.options = {"preset": preset}
        if audio_track is not None:
            samples, rate = sf.read(audio_track, dtype="int16")
            tone = _Tone(container, audio_codec, samples.size / rate, samples=samples, rate=rate)
        else:
            tone = _Tone(container, audio_codec, audio_seconds) if audio_seconds else None
        for i in range(int(duration * fps)):
            t = i / fps
            if any(start <= t < end for start, end in noisy):
                frame = rng.integers(0, 256, background.shape, dtype=np.uint8)
            else:
                frame = background.copy()
                left = rectangle_at(t, moving, width, height)
                frame[top : top + box_h, left : left + box_w] = (20, 20, 20)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
            if tone is not None:
                tone.encode_until((i + 1) / fps)
        for packet in stream.encode():
            container.mux(packet)
        if tone is not None:
            tone.finish()
    return path


class _Tone:
    """A 440 Hz tone track (or given 16-bit samples), encoded as far as asked each time, so it
    interleaves with the video."""

    RATE = 48000  # every codec used here takes it (Opus only takes 48 kHz)
    CHUNK = 960  # 20 ms, an Opus frame; the encoder re-frames for AAC

    def __init__(self, container: av.container.OutputContainer, codec: str, seconds: float,
                 samples: np.ndarray | None = None, rate: int = RATE) -> None:  # fmt: skip
        self.container, self.samples, self.RATE = container, samples, rate
        self.stream = container.add_stream(codec, rate=self.RATE)
        self.stream.layout = "mono"
        self.total, self.done = int(round(seconds * self.RATE)), 0

    def encode_until(self, seconds: float) -> None:
        target = min(self.total, int(seconds * self.RATE))
        while self.done < target:
            count = min(self.CHUNK, target - self.done)
            if self.samples is not None:
                samples = np.ascontiguousarray(self.samples[self.done : self.done + count])[None, :]
            else:
                t = np.arange(self.done, self.done + count) / self.RATE
                samples = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)[None, :]
            frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
            frame.rate, frame.pts = self.RATE, self.done
            self.container.mux(self.stream.encode(frame))
            self.done += count

    def finish(self) -> None:
        self.encode_until(self.total / self.RATE)
        self.container.mux(self.stream.encode(None))


def truncated(source: Path, target: Path, fraction: float = 0.5) -> Path:
    """The first ``fraction`` of ``source``'s bytes at ``target``: a download or copy cut short."""
    data = source.read_bytes()
    target.write_bytes(data[: int(len(data) * fraction)])
    return target


def make_image(path: Path) -> Path:
    """One PNG frame of the scene with the rectangle in it."""
    frame = scene()
    frame[60:110, 100:140] = (20, 20, 20)
    with av.open(str(path), "w", format="image2") as container:
        stream = container.add_stream("png")
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "rgb24"
        for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def make_audio_only(path: Path) -> Path:
    """A second of a tone, no video stream."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("pcm_s16le", rate=16000)
        stream.layout = "mono"
        samples = (np.sin(np.arange(16000) / 16000 * 2 * np.pi * 440) * 8000).astype(np.int16)[None, :]
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.rate = 16000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def build_random_yolo(models_dir: Path, config_dir: Path, imgsz: int = EXPORT_SIZE) -> tuple[Path, Path]:
    """``yolo11n.pt`` and ``yolo11n.onnx`` (random weights, COCO names, exported at ``imgsz``) in
    ``models_dir``; built once."""
    models_dir = models_dir.resolve()
    models_dir.mkdir(parents=True, exist_ok=True)
    pt, onnx = models_dir / "yolo11n.pt", models_dir / "yolo11n.onnx"
    if not (pt.is_file() and onnx.is_file()):
        offline = {"YOLO_OFFLINE": "1", "YOLO_AUTOINSTALL": "False", "YOLO_CONFIG_DIR": str(config_dir.resolve())}
        env = {**os.environ, **offline}
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_BUILD), str(models_dir), str(imgsz)],
                              cwd=models_dir, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
        if proc.returncode != 0 or not onnx.is_file():
            raise RuntimeError(f"building the random YOLO failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return pt, onnx
