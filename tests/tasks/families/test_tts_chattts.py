"""The ChatTTS rung through its real loader and ``chat.infer``, on a tiny random model built offline.

Its audio is noise, so the checks are on structure: the model loads from the models dir (never a
hub), chunks come in order, each piece is as long as its token budget allows, a speaker's voice is
the same from its seed and from its stored embedding, and broken weights make the rung unavailable.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mediafarm.config.settings import get_settings
from mediafarm.tasks.app import app
from mediafarm.tasks.families.tts import engines
from mediafarm.tasks.families.tts.speakers import register_speaker, remove_speaker
from mediafarm.tasks.families.tts.spec import ChatTTSParams, TtsRequest
from mediafarm.tasks.runtime.base import drain
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.wire.errors import PermanentFailure, ResourceFailure, RungUnavailable
from mediafarm.tasks.wire.records import Outcome

pytest.importorskip("ChatTTS", reason="ChatTTS is not installed (pip install 'mediafarm[tts]')")

TEXT = "Hello there. This is a test of chunks. They come in order. Goodbye now."
TOKENS = 24  # each piece: at most 24 audio tokens of 512 samples at 24 kHz, 0.512 s
PARAMS = ChatTTSParams(model="chattts", max_chars=30, max_new_token=TOKENS)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from tests.support.tiny_chattts import ensure_tiny_chattts

    return ensure_tiny_chattts(get_settings().models_dir / "chattts")


def run(tmp: Path, params: ChatTTSParams = PARAMS, models_dir: Path | None = None, **fields):
    ctx = EngineContext.local(storage_dir=tmp, models_dir=models_dir or get_settings().models_dir,
                              job_id=f"chattts-{uuid.uuid4().hex[:6]}", redis=app.backend.client)  # fmt: skip
    partials: list[dict] = []
    ctx.publish = partials.append
    result = drain(engines.chattts(ctx, TtsRequest(**{"text": TEXT, **fields}), params), ctx)
    return result, partials, sf.read(ctx.artifacts.path(result.audio), dtype="int16")[0]


def test_loads_from_the_models_dir_and_speaks_chunks_in_order(model_dir: Path, tmp_path: Path) -> None:
    result, partials, audio = run(tmp_path)
    assert result.voice.startswith("ChatTTS 0.2.5 chattts (cpu) seed") and result.sample_rate == 24000
    assert result.chunks == len(partials) == 4 and [p["chunk"] for p in partials] == list(range(result.chunks))
    assert [s["index"] for p in partials for s in p["sentences"]] == [0, 1, 2, 3]
    for sentence in result.sentences:
        assert 0.05 < sentence.end - sentence.start <= TOKENS * 512 / 24000 + 0.001, sentence
    starts = [s.start for s in result.sentences]
    assert starts == sorted(starts) and audio.size / 24000 == pytest.approx(result.duration, abs=0.001)


def test_a_speaker_is_the_same_voice_from_its_seed_or_its_stored_embedding(model_dir: Path, tmp_path: Path) -> None:
    from mediafarm.tasks.families.tts.chattts import embedding_from_seed, load_chattts

    embedding = embedding_from_seed(load_chattts(model_dir, "cpu"), 99)
    by_seed, by_embedding, other = (f"sp-{uuid.uuid4().hex[:8]}" for _ in range(3))
    register_speaker(by_seed, seed=99)
    register_speaker(by_embedding, embedding=embedding)  # what a producer would store
    register_speaker(other, seed=100)
    try:
        _, _, seeded = run(tmp_path, speaker=by_seed)
        _, _, again = run(tmp_path, speaker=by_seed)
        _, _, stored = run(tmp_path, speaker=by_embedding)
        _, _, different = run(tmp_path, speaker=other)
    finally:
        for name in (by_seed, by_embedding, other):
            remove_speaker(name)
    assert seeded.size and np.array_equal(seeded, again)  # no drift between jobs
    assert np.array_equal(seeded, stored)  # the stored embedding round-tripped through Redis intact
    assert not np.array_equal(seeded, different)


def test_an_embedding_that_does_not_fit_the_model_is_bad_input(model_dir: Path, tmp_path: Path) -> None:
    name = f"sp-{uuid.uuid4().hex[:8]}"
    register_speaker(name, embedding="愐穤巩噅廷戇笉屈癐媄垹垧帶爲漈塀殐慄亅倴")
    try:
        with pytest.raises(PermanentFailure, match="embedding does not decode"):
            run(tmp_path, speaker=name)
    finally:
        remove_speaker(name)


@pytest.mark.parametrize("damage", ["missing folder", "missing file", "corrupt file"])
def test_missing_or_corrupt_weights_make_the_rung_unavailable(model_dir: Path, tmp_path: Path, damage: str) -> None:
    models = tmp_path / "models"
    if damage != "missing folder":
        shutil.copytree(model_dir, models / "chattts")
        target = models / "chattts" / "asset" / "Decoder.safetensors"
        if damage == "missing file":
            target.unlink()
        else:
            data = bytearray(target.read_bytes())
            data[len(data) // 2] ^= 0xFF
            target.write_bytes(bytes(data))
    with pytest.raises(RungUnavailable) as info:
        run(tmp_path, models_dir=models)
    assert "FARM_MODELS_DIR" in str(info.value) or "sha256" in str(info.value)


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), Outcome.CUDA_OOM),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 2147483648"), Outcome.OOM),
        (RuntimeError("Error(s) in loading state_dict for GPT"), None),  # not memory: the rung is unavailable
    ],
)
def test_out_of_memory_while_loading_moves_down_not_unavailable(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, outcome: Outcome | None
) -> None:
    import ChatTTS

    from mediafarm.tasks.families.tts.chattts import load_chattts

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(ChatTTS.Chat, "load", fail)
    copy = shutil.copytree(model_dir, tmp_path / "chattts")  # a folder no earlier test cached
    with pytest.raises(RungUnavailable if outcome is None else ResourceFailure) as info:
        load_chattts(copy, "cpu")
    assert getattr(info.value, "outcome", None) is outcome
