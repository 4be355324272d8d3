from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mediafarm.tasks.media.decode import KeptAudio, audio_blocks, probe_duration
from mediafarm.tasks.wire.errors import UnreadableMedia
from tests.support.yolo import make_video


def tone(path: Path, seconds: float, rate: int, channels: int = 1) -> None:
    t = np.arange(int(seconds * rate)) / rate
    mono = 0.5 * np.sin(2 * np.pi * 440 * t)
    sf.write(path, np.stack([mono] * channels, axis=1) if channels > 1 else mono, rate)


def test_blocks_are_fixed_size_16k_mono(tmp_path: Path) -> None:
    path = tmp_path / "t.wav"
    tone(path, 2.5, 44100, channels=2)
    blocks = list(audio_blocks(path, block_seconds=1.0))
    assert [b.size for b in blocks[:-1]] == [16000, 16000]
    assert abs(sum(b.size for b in blocks) - 2.5 * 16000) < 200
    assert all(b.dtype == np.float32 for b in blocks)
    assert 0.4 < float(np.abs(blocks[0]).max()) < 0.6
    assert probe_duration(path) == pytest.approx(2.5, abs=0.01)


def test_audio_already_16k_mono_16bit_skips_the_resampler_and_decodes_the_same(tmp_path: Path, monkeypatch) -> None:
    import av

    from mediafarm.tasks.media import decode

    path = tmp_path / "farm.wav"
    rng = np.random.default_rng(3)
    sf.write(path, (rng.standard_normal(16000 * 3 + 123) * 0.2).clip(-1, 1), 16000, subtype="PCM_16")
    with av.open(str(path)) as container:
        assert decode._in_output_form(next(container.decode(audio=0)), 16000)  # so the resampler is skipped
    direct = np.concatenate(list(audio_blocks(path, block_seconds=1.0)))
    passed = []
    monkeypatch.setattr(decode, "_in_output_form", lambda frame, rate: passed.append(frame) or False)
    resampled = np.concatenate(list(audio_blocks(path, block_seconds=1.0)))
    assert passed and np.array_equal(direct, resampled) and direct.size == 16000 * 3 + 123
    assert np.array_equal(direct, sf.read(path, dtype="int16")[0] / np.float32(32768.0))


def test_kept_audio_decodes_a_short_file_once_and_a_long_one_twice(tmp_path: Path) -> None:
    path = tmp_path / "t.wav"
    tone(path, 25.0, 16000)  # 3 blocks of 10 s
    whole = list(audio_blocks(path))
    short = KeptAudio(path, keep_seconds=30.0)
    assert [b.tolist() for b in short.blocks(path)] == [b.tolist() for b in whole]
    path.rename(tmp_path / "gone.wav")  # so a second decode could only fail
    assert [b.tolist() for b in short.again()] == [b.tolist() for b in whole]
    (tmp_path / "gone.wav").rename(path)

    long = KeptAudio(path, keep_seconds=20.0)  # over the limit: nothing kept, decoded again
    assert sum(b.size for b in long.blocks()) == sum(b.size for b in whole)
    assert long._kept is None
    assert [b.tolist() for b in long.again()] == [b.tolist() for b in whole]

    unread = KeptAudio(path, keep_seconds=30.0)  # no first pass (a resumed job skips the VAD)
    assert [b.tolist() for b in unread.again()] == [b.tolist() for b in whole]
    partly = KeptAudio(path, keep_seconds=30.0)
    next(iter(partly.blocks()))  # a first pass that stopped early keeps nothing
    assert sum(b.size for b in partly.again()) == sum(b.size for b in whole)
    with pytest.raises(ValueError, match="asked for"):
        next(iter(KeptAudio(path, 30.0).blocks(tmp_path / "other.wav")))


def test_video_file_audio_track_is_decoded(tmp_path: Path) -> None:
    video = make_video(tmp_path / "clip.mp4", duration=3.0, width=160, height=120, codec="mpeg4", audio_seconds=3.0)
    total = sum(b.size for b in audio_blocks(video))
    assert abs(total / 16000 - 3.0) < 0.1


def test_video_without_audio_is_named(tmp_path: Path) -> None:
    video = make_video(tmp_path / "silent.mp4", duration=1.0, width=160, height=120, codec="mpeg4")
    with pytest.raises(UnreadableMedia, match="no audio stream"):
        list(audio_blocks(video))


def test_text_renamed_wav_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "notes.wav"
    path.write_text("this is not audio\n" * 50)
    with pytest.raises(UnreadableMedia, match="not a media file FFmpeg can read: notes.wav"):
        list(audio_blocks(path))
