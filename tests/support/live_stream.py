"""Live streams the tests make on this machine: FFmpeg publishing a WAV in real time (``-re``) as
MPEG-TS over loopback UDP or TCP, or as HLS into a folder a local ``http.server`` serves; and the
PCM of a WAV cut into pieces at the pace it plays, for a test that pushes it (``push://``).

The FFmpeg is the program inside the ``imageio-ffmpeg`` wheel (dev extra), never one on PATH: a
publisher that paces itself, serves a listening TCP socket and cuts HLS segments as it goes is what
the program does and PyAV alone does not, and every machine then runs the same build.

Timestamps are pinned so a test knows the stream clock: ``-muxdelay 0 -muxpreload 0`` and
``-output_ts_offset`` make the first audio sample's PTS ``ts_offset`` seconds, so a moment ``t``
of the WAV is PTS ``ts_offset + t`` (MP2 audio: no encoder priming shifts it).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.http_server import serving


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ffmpeg() -> str:
    """The wheel's FFmpeg program."""
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def mpegts_args(wav: Path, ts_offset: float) -> list[str]:
    return [ffmpeg(), "-hide_banner", "-loglevel", "error", "-re", "-i", str(wav), "-c:a", "mp2", "-b:a", "128k",
            "-ar", "48000", "-muxdelay", "0", "-muxpreload", "0", "-output_ts_offset", f"{ts_offset:g}",
            "-f", "mpegts"]  # fmt: skip


def publish_udp(wav: Path, port: int, ts_offset: float = 10.0) -> subprocess.Popen[bytes]:
    """FFmpeg sending ``wav`` in real time as MPEG-TS to udp://127.0.0.1:port (packets of 1316 bytes)."""
    url = f"udp://127.0.0.1:{port}?pkt_size=1316"
    return subprocess.Popen([*mpegts_args(wav, ts_offset), url], stdin=subprocess.DEVNULL)


def publish_tcp(wav: Path, port: int, ts_offset: float = 10.0) -> subprocess.Popen[bytes]:
    """FFmpeg listening on tcp://127.0.0.1:port; it sends ``wav`` in real time once a reader connects."""
    url = f"tcp://127.0.0.1:{port}?listen=1"
    return subprocess.Popen([*mpegts_args(wav, ts_offset), url], stdin=subprocess.DEVNULL)


def publish_hls(wav: Path, folder: Path, ts_offset: float = 10.0, segment: float = 1.0) -> subprocess.Popen[bytes]:
    """FFmpeg writing ``wav`` in real time as a live HLS stream (EVENT playlist, MPEG-TS segments)."""
    folder.mkdir(parents=True, exist_ok=True)
    args = [*mpegts_args(wav, ts_offset)[:-2], "-f", "hls", "-hls_time", f"{segment:g}", "-hls_list_size", "0",
            "-hls_playlist_type", "event", "-hls_flags", "independent_segments", str(folder / "live.m3u8")]  # fmt: skip
    return subprocess.Popen(args, stdin=subprocess.DEVNULL)


def wait_listening(port: int, timeout: float = 30.0) -> None:
    """Wait until something listens on TCP ``port`` (read from /proc/net/tcp: connecting to look
    would take the one client a listening FFmpeg accepts)."""
    deadline = time.monotonic() + timeout
    while True:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(OSError), open(table) as fh:
                for line in fh.readlines()[1:]:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                        return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on TCP port {port} after {timeout} s")
        time.sleep(0.05)


@contextlib.contextmanager
def http_folder(folder: Path) -> Iterator[str]:
    """``folder`` served by a local http.server on a free loopback port; yields its base URL."""
    with serving(functools.partial(_Quiet, directory=str(folder))) as url:
        yield url


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def track_pcm(wav: Path) -> bytes:
    """A 16-bit mono WAV's samples as s16le bytes, what a push takes."""
    import soundfile as sf

    audio, _ = sf.read(wav, dtype="int16")
    return audio.astype("<i2").tobytes()


def real_time_pieces(pcm: bytes, rate: int, piece_seconds: float = 0.1) -> Iterator[bytes]:
    """``pcm`` (16-bit mono at ``rate``) in ``piece_seconds`` pieces, each given when it is due as
    the audio plays from the first one."""
    step = round(piece_seconds * rate) * 2
    began = time.monotonic()
    for k, i in enumerate(range(0, len(pcm), step)):
        time.sleep(max(0.0, began + k * piece_seconds - time.monotonic()))
        yield pcm[i : i + step]


def playlist_while_playing(out: Path, publisher: subprocess.Popen[bytes]) -> Path:
    """The playlist `farm submit --live --out` keeps in ``out``, once there while ``publisher``
    still plays the stream; every segment it lists is already in ``out`` (AssertionError otherwise)."""
    playlist = out / "chunks" / "playlist.m3u8"
    while publisher.poll() is None and not playlist.exists():
        time.sleep(0.1)
    assert publisher.poll() is None, "no playlist copied while the stream played"
    listed = [line for line in playlist.read_text().splitlines() if line.endswith(".vtt")]
    assert listed and all((out / "chunks" / name).exists() for name in listed), listed
    return playlist
