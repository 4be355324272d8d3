"""ChatTTS 0.2.5 as a TTS voice: loaded once per pool child from the models dir, never from a hub.

``Chat().load(source="custom", custom_path=...)`` only: ``source="local"`` downloads into the
working directory and ``"huggingface"`` into the hub cache, and a farm fetches nothing at run
time. The loader checks every file's sha256 (ChatTTS's own map) before loading, so missing or
corrupt weights make the rung unavailable (recorded, next rung) instead of failing the job.

A model folder may carry ``mediafarm-chattts.json`` (``{"config": {...}, "sha256": {...}}``): the
shapes it was built with and its files' sums, applied over ChatTTS's defaults. A fine-tuned or
test model uses it (``tests/support/tiny_chattts.py``); the released weights need none.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mediafarm.tasks.kit import PermanentFailure, RungUnavailable, raise_if_out_of_memory

if TYPE_CHECKING:
    from ChatTTS import Chat

MANIFEST = "mediafarm-chattts.json"
SAMPLE_RATE = 24000
# ChatTTS logs every stage of every call at INFO.
_LOG = logging.getLogger("mediafarm.chattts")
_LOG.setLevel(logging.WARNING)


def apply_overrides(config: Any, overrides: Mapping[str, Any]) -> Any:
    """``config`` (ChatTTS's nested dataclasses) with ``overrides`` applied, as new objects.

    ChatTTS's ``Config`` shares its nested defaults between instances (dataclass defaults that
    are instances), so they are replaced, never mutated.
    """
    changes = {}
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise ValueError(f"ChatTTS config has no field {key!r}")
        current = getattr(config, key)
        changes[key] = apply_overrides(current, value) if dataclasses.is_dataclass(current) else value
    return dataclasses.replace(config, **changes)


@dataclasses.dataclass(frozen=True)
class ChatTTSModel:
    """A loaded model. Attributes: chat (the ``ChatTTS.Chat``), device, label (for the result)."""

    chat: Chat
    device: str
    label: str

    @property
    def hidden_size(self) -> int:
        return int(self.chat.config.gpt.hidden_size)


def load_chattts(model_dir: Path, device: str) -> ChatTTSModel:
    """The model in ``model_dir`` on ``device``, loaded once per process (the last one asked for).

    Raises:
        RungUnavailable: the folder is missing, a file is missing or
            fails its sha256 check, or the weights do not load; ``cuda`` with no usable GPU.
        ResourceFailure: out of (GPU) memory while loading.
    """
    return _load(Path(model_dir).expanduser().resolve(), device)


# One model per child: its memory cap is sized for one.
@functools.lru_cache(maxsize=1)
def _load(model_dir: Path, device: str) -> ChatTTSModel:
    if not model_dir.is_dir():
        raise RungUnavailable(f"no ChatTTS model folder at {model_dir} (FARM_MODELS_DIR)")
    # Set before transformers is imported: the tokenizer must never look for a hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import ChatTTS
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise RungUnavailable("device 'cuda' asked for, but torch sees no CUDA device on this pool")
    chat = ChatTTS.Chat(_LOG)
    manifest = model_dir / MANIFEST
    if manifest.is_file():
        try:
            built = json.loads(manifest.read_text())
            chat.config = apply_overrides(chat.config, built.get("config", {}))
            chat.sha256_map = {**chat.sha256_map, **built.get("sha256", {})}
        except (ValueError, TypeError, AttributeError) as exc:
            raise RungUnavailable(f"ChatTTS model folder {model_dir}: unreadable {MANIFEST}: {exc}") from exc
    try:
        loaded = chat.load(source="custom", custom_path=str(model_dir), device=torch.device(device), compile=False)
    except (RuntimeError, ValueError, OSError, KeyError, AssertionError) as exc:
        raise_if_out_of_memory(exc, source="ChatTTS")
        raise RungUnavailable(f"ChatTTS cannot load the model at {model_dir}: {str(exc)[:300]}") from exc
    if not loaded:
        raise RungUnavailable(
            f"ChatTTS model at {model_dir}: a file is missing or fails its sha256 check (see the worker log)"
        )
    return ChatTTSModel(chat, device, f"ChatTTS {_version()} {model_dir.name} ({device})")


def _version() -> str:
    from importlib.metadata import version

    return version("ChatTTS")


# Decoded speaker embeddings as tensors on the model's device, so a voice switch costs nothing.
# Bounded: each entry holds device memory, and a long-lived child meets many speakers.
@functools.lru_cache(maxsize=32)
def speaker_tensor(model: ChatTTSModel, embedding: str) -> Any:
    """A stored embedding string as the tensor ChatTTS applies; PermanentFailure if it does not fit."""
    import torch

    try:
        values = model.chat.speaker._decode(embedding)
    except Exception as exc:  # noqa: BLE001 - lzma/base16384 errors: the string is not an embedding
        raise PermanentFailure(f"the speaker's ChatTTS embedding does not decode: {exc}") from None
    if values.size != model.hidden_size:
        raise PermanentFailure(
            f"the speaker's ChatTTS embedding has {values.size} values; this model ({model.label}) takes "
            f"{model.hidden_size}: register the speaker with a seed, or an embedding made by this model"
        )
    return torch.from_numpy(values.astype(np.float32)).to(model.device)


@functools.lru_cache(maxsize=32)
def embedding_from_seed(model: ChatTTSModel, seed: int) -> str:
    """``chat.sample_random_speaker()`` under a generator seeded with ``seed``: the same speaker on
    every worker and after every restart, for one model on one kind of device."""
    import torch

    with torch.random.fork_rng(devices=[] if model.device == "cpu" else None):
        torch.manual_seed(seed)
        return str(model.chat.sample_random_speaker())


class ChatTTSVoice:
    """One speaker on a loaded model. ``speak`` runs one ``chat.infer`` call for a chunk's pieces
    (a batch, one waveform back per piece, so sentence times are exact)."""

    rate = SAMPLE_RATE

    def __init__(self, model: ChatTTSModel, embedding: str, *, speed: float, max_new_token: int, temperature: float,
                 language: str | None) -> None:  # fmt: skip
        self.model = model
        self.label = model.label
        self.spk = speaker_tensor(model, embedding)
        # Sampling is seeded by the voice itself: one embedding, one way of speaking a text, in
        # every job, whether the speaker was stored as a seed or as the embedding it gives.
        self.seed = zlib.crc32(embedding.encode())
        # ChatTTS knows ten speeds, [speed_0] .. [speed_9]; 5 is its normal pace.
        self.prompt = f"[speed_{min(9, max(0, round(5 * speed)))}]"
        self.max_new_token, self.temperature = max_new_token, temperature
        self.language = language if language in ("en", "zh") else None

    def speak(self, texts: Sequence[str]) -> list[np.ndarray]:
        chat = self.model.chat
        params = chat.InferCodeParams(
            prompt=self.prompt, spk_emb=self.spk, temperature=self.temperature, max_new_token=self.max_new_token,
            manual_seed=self.seed, show_tqdm=False,
        )  # fmt: skip
        try:
            wavs = chat.infer(
                list(texts), lang=self.language, skip_refine_text=True, split_text=False,
                do_text_normalization=False, do_homophone_replacement=False, params_infer_code=params,
            )  # fmt: skip
        except RuntimeError as exc:
            raise_if_out_of_memory(exc, source="ChatTTS")
            raise
        if len(wavs) != len(texts):
            raise RuntimeError(f"ChatTTS returned {len(wavs)} waveforms for {len(texts)} texts")
        return [np.asarray(w, dtype=np.float32).reshape(-1) for w in wavs]
