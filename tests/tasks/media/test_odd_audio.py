"""Odd audio that FFmpeg decodes without complaint (issue #18 item 8), refused with a reason:

- a WAV header that declares more audio than the file holds (4 GB over 1 s, a copy cut short);
  a streaming writer's placeholder size is no such claim, and its whole file is accepted;
- NaN or infinite samples in float PCM.

Real files: written by soundfile, by PyAV's WAV muxer into a pipe, or patched where a writer would
have put another size. VAD's webrtc engine (no model) shows the job's side: a PermanentFailure.
"""

from __future__ import annotations

import struct
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from mediafarm.tasks.families.vad.engines import webrtc
from mediafarm.tasks.families.vad.spec import VadRequest, WebrtcParams
from mediafarm.tasks.media.decode import audio_blocks
from mediafarm.tasks.media.wav import is_placeholder, wav_length
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.wire.errors import PermanentFailure, UnreadableMedia

RATE = 16000


def tone(seconds: float, rate: int = RATE) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * 440 * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def decoded_seconds(path: Path) -> float:
    return sum(block.size for block in audio_blocks(path)) / RATE


def with_data_size(source: Path, target: Path, size: int) -> Path:
    """``source`` with its data chunk's size field set to ``size`` (what a lying or streaming writer leaves)."""
    data = bytearray(source.read_bytes())
    at = data.find(b"data")
    data[at + 4 : at + 8] = struct.pack("<I", size)
    target.write_bytes(bytes(data))
    return target


@pytest.fixture()
def one_second(tmp_path: Path) -> Path:
    path = tmp_path / "one-second.wav"
    sf.write(path, tone(1.0), RATE, subtype="PCM_16")
    return path


def test_a_header_claiming_4_gb_over_1_s_of_data_is_refused_naming_both_lengths(one_second: Path) -> None:
    lying = with_data_size(one_second, one_second.with_name("lying.wav"), 4_000_000_000)
    with pytest.raises(UnreadableMedia) as refused:
        list(audio_blocks(lying))
    assert str(refused.value) == (
        "lying.wav: truncated: its WAV header declares 4000000000 bytes of audio (125000.0 s) "
        "but the file holds 32000 (1.0 s)"
    )


def test_a_wav_cut_short_is_refused_and_one_short_by_less_than_the_tolerance_is_not(tmp_path: Path) -> None:
    whole = tmp_path / "whole.wav"
    sf.write(whole, tone(4.0), RATE, subtype="PCM_16")
    data = whole.read_bytes()
    header = len(data) - 4 * RATE * 2
    cut = tmp_path / "cut.wav"
    cut.write_bytes(data[: header + 2 * RATE * 2])  # 2 s of the 4 declared
    with pytest.raises(UnreadableMedia, match=r"cut.wav: truncated: .* \(4\.0 s\) but the file holds 64000 \(2\.0 s\)"):
        list(audio_blocks(cut))
    nearly = tmp_path / "nearly.wav"
    nearly.write_bytes(data[: len(data) - RATE])  # 0.5 s short: within TRUNCATION_TOLERANCE_S, as for video
    assert decoded_seconds(nearly) == pytest.approx(3.5, abs=0.01)


def test_ffmpeg_writing_into_a_pipe_leaves_a_placeholder_size_and_its_file_is_accepted(tmp_path: Path) -> None:
    class Pipe:  # what FFmpeg sees when its output cannot seek back to fill in the header
        def __init__(self) -> None:
            self.data = bytearray()

        def write(self, chunk: bytes) -> int:
            self.data += bytes(chunk)
            return len(chunk)

        def seekable(self) -> bool:
            return False

    pipe = Pipe()
    with av.open(pipe, "w", format="wav") as out:
        stream = out.add_stream("pcm_s16le", rate=RATE, layout="mono")
        frame = av.AudioFrame.from_ndarray((tone(2.0) * 32767).astype(np.int16)[None, :], format="s16", layout="mono")
        frame.sample_rate = RATE
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    path = tmp_path / "piped.wav"
    path.write_bytes(bytes(pipe.data))
    at = pipe.data.find(b"data")
    assert struct.unpack("<I", pipe.data[at + 4 : at + 8])[0] == 0xFFFFFFFF  # the placeholder itself
    assert wav_length(path) is None
    assert decoded_seconds(path) == pytest.approx(2.0, abs=0.01)


@pytest.mark.parametrize(
    "size", [0, 0xFFFFFFFF, 0x7FFFF000, 0x7FFFFF00, 0x7FFFFFFF], ids=["zero", "ffmpeg", "sox", "arecord", "int32-max"]
)
def test_streaming_writers_placeholder_sizes_are_read_to_the_end(one_second: Path, size: int) -> None:
    assert is_placeholder(size)
    path = with_data_size(one_second, one_second.with_name(f"streamed-{size:x}.wav"), size)
    assert decoded_seconds(path) == pytest.approx(1.0, abs=0.01)


def test_a_header_that_declares_less_than_the_file_holds_is_whole(tmp_path: Path, one_second: Path) -> None:
    # Chunks after the audio (LIST, id3) are normal: the data chunk ends where its size says.
    path = tmp_path / "trailing.wav"
    path.write_bytes(one_second.read_bytes() + b"LIST" + struct.pack("<I", 4) + b"INFO")
    assert wav_length(path).declared == 32000 and decoded_seconds(path) == pytest.approx(1.0, abs=0.01)
    assert not is_placeholder(4_000_000_000) and not is_placeholder(32000)


@pytest.mark.parametrize("subtype", ["FLOAT", "DOUBLE"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_float_samples_are_refused_naming_when(tmp_path: Path, subtype: str, bad: float) -> None:
    left, right = tone(3.0, 44100), tone(3.0, 44100)
    right[66150] = bad  # 1.5 s into the second channel
    path = tmp_path / f"broken-{subtype}.wav"
    sf.write(path, np.stack([left, right], axis=1).astype(np.float64), 44100, subtype=subtype)
    with pytest.raises(UnreadableMedia, match=r"non-finite sample \(NaN or infinity\) at 1\.500 s"):
        list(audio_blocks(path))


def test_finite_float_audio_at_full_scale_is_accepted(tmp_path: Path) -> None:
    samples = tone(2.0)
    samples[100:200] = 1.0
    samples[300:400] = -1.0
    path = tmp_path / "loud.wav"
    sf.write(path, samples, RATE, subtype="FLOAT")
    assert decoded_seconds(path) == pytest.approx(2.0, abs=0.01)


def test_a_vad_job_on_nan_audio_fails_as_bad_input(tmp_path: Path) -> None:
    samples = tone(2.0)
    samples[RATE // 2] = np.nan
    path = tmp_path / "nan.wav"
    sf.write(path, samples, RATE, subtype="FLOAT")
    with pytest.raises(PermanentFailure, match=r"nan.wav: the audio stream has a non-finite sample .* at 0\.500 s"):
        webrtc(EngineContext.local(), VadRequest(media=str(path)), WebrtcParams())
