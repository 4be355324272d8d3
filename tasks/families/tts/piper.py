"""Piper (VITS voices as ONNX) as a TTS voice: a sound CPU rung between ChatTTS and espeak-ng.

Voices are files the operator puts in FARM_MODELS_DIR (``voice.onnx`` beside ``voice.onnx.json``);
a missing one makes the rung unavailable. Loaded once per child per voice file.

Deterministic by default: VITS draws random noise for prosody (``noise_scale``) and durations
(``noise_w_scale``) on every call, which onnxruntime cannot seed, so the same text and speaker
would differ between jobs. With both at 0 they are bit-identical; an operator who prefers varied
prosody sets them in the rung's params.

A one-speaker voice serves many farm speakers by pitch: the speaker's factor ``p`` stretches the
synthesis by ``p`` (``length_scale``) and the waveform is then resampled to ``1/p`` of its length
at the same rate, so the pace is kept and the pitch (and formants) move by ``p``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mediafarm.tasks.kit import RungUnavailable

if TYPE_CHECKING:
    from piper import PiperVoice as Loaded

def load_piper(model: Path, threads: int = 1) -> Loaded:
    """The voice in ``model`` (with ``model.json``) on ``threads`` onnxruntime threads;
    RungUnavailable if absent or unloadable."""
    return _load(Path(model).resolve(), threads)


# A child meets few voices, and each is a whole ONNX session in memory.
@functools.lru_cache(maxsize=2)
def _load(model: Path, threads: int) -> Loaded:
    import onnxruntime
    from piper import PiperVoice
    from piper.config import PiperConfig

    config = Path(f"{model}.json")
    missing = [p.name for p in (model, config) if not p.is_file()]
    if missing:
        raise RungUnavailable(f"Piper voice {model} is not in the models dir: {', '.join(missing)} missing")
    try:
        # PiperVoice.load gives onnxruntime no thread count (it then takes every core); the
        # voice is built the same way here, with one.
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = onnxruntime.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])
        return PiperVoice(config=PiperConfig.from_dict(json.loads(config.read_text(encoding="utf-8"))), session=session)
    except Exception as exc:  # noqa: BLE001 - onnxruntime and json raise many kinds for a bad file
        raise RungUnavailable(f"Piper cannot load the voice {model.name}: {str(exc)[:300]}") from exc


@functools.cache
def _piper_version() -> str:
    """piper-tts's version, read once per child: the metadata lookup cost a sentence's job 0.3-0.9 ms."""
    return version("piper-tts")


class PiperTTSVoice:
    """One Piper voice as one farm speaker: speaker id, pace and pitch fixed."""

    def __init__(self, model: Path, *, speaker_id: int | None, speed: float, pitch: float, noise_scale: float,
                 noise_w_scale: float, threads: int = 1) -> None:  # fmt: skip
        from piper import SynthesisConfig

        self.voice = load_piper(model, threads)
        speakers = self.voice.config.num_speakers
        if speaker_id is not None and speaker_id >= speakers:
            raise RungUnavailable(f"Piper voice {model.name} has {speakers} speaker(s); speaker id {speaker_id} asked")
        self.pitch = pitch
        self.config = SynthesisConfig(
            speaker_id=speaker_id, length_scale=self.voice.config.length_scale * pitch / speed,
            noise_scale=noise_scale, noise_w_scale=noise_w_scale,
        )  # fmt: skip
        self.rate = self.voice.config.sample_rate
        who = f" speaker {speaker_id}" if speaker_id is not None else ""
        self.label = f"piper {_piper_version()} {model.stem}{who} pitch {pitch:g}"

    def speak(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self._one(text) for text in texts]

    def _one(self, text: str) -> np.ndarray:
        parts = [chunk.audio_float_array for chunk in self.voice.synthesize(text, self.config)]
        audio = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        if self.pitch == 1.0 or audio.size < 2:
            return audio
        length = max(2, int(round(audio.size / self.pitch)))
        return np.interp(np.linspace(0, audio.size - 1, length), np.arange(audio.size), audio).astype(np.float32)
