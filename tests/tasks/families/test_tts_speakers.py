"""The speaker store on the session's real Redis, through the client functions and the `farm speakers` CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from mediafarm import list_speakers, register_speaker, remove_speaker
from mediafarm.tasks.app import app
from mediafarm.tasks.families.tts.speakers import ESPEAK_VOICES, SPEAKERS_KEY, get_speaker
from mediafarm.tasks.wire.errors import InvalidRequest, PermanentFailure, RungUnavailable
from tests.conftest import REPO

# A string of the shape ChatTTS embeddings have (base16384); only ChatTTS itself can tell a real one.
EMBEDDING = "愐穤巩噅廷戇笉屈癐媄垹垧帶爲漈塀殐慄亅倴"


@pytest.fixture
def name() -> str:
    # Names unique per test: the session's Redis is shared by every test of the run.
    return f"sp-{uuid.uuid4().hex[:8]}"


def test_register_list_get_remove_round_trip(name: str) -> None:
    speaker = register_speaker(name, seed=42, espeak_voice="en-gb+m3", piper_speaker=3)
    assert get_speaker(name) == speaker and speaker.chattts_seed == 42 and speaker.espeak == "en-gb+m3"
    assert speaker.piper_pitch == 1.0  # it named a speaker id: no pitch shift
    listed = {s.name: s for s in list_speakers()}
    assert listed["default"].slot == 0 and listed[name] == speaker
    # Stored as JSON in one hash with no expiry: every worker and every restart reads the same.
    assert SPEAKERS_KEY == "mediafarm:speakers"  # the name speakers registered before families kept their keys
    assert app.backend.client.ttl(SPEAKERS_KEY) == -1
    assert remove_speaker(name) is True and remove_speaker(name) is False
    with pytest.raises(PermanentFailure, match=f"no speaker named '{name}'"):
        get_speaker(name)


def test_speakers_get_distinct_voices_they_did_not_name(name: str) -> None:
    a = register_speaker(name + "a")
    b = register_speaker(name + "b", embedding=EMBEDDING)
    try:
        assert len({0, a.slot, b.slot}) == 3
        assert len({get_speaker("default").espeak, a.espeak, b.espeak}) == 3
        assert len({get_speaker("default").piper_pitch, a.piper_pitch, b.piper_pitch}) == 3
        assert a.chattts_seed != get_speaker("default").chattts_seed and b.embedding == EMBEDDING
        assert all(v.startswith("en-us") for v in ESPEAK_VOICES)
    finally:
        remove_speaker(name + "a"), remove_speaker(name + "b")


@pytest.mark.parametrize(
    ("name", "voices", "message"),
    [
        ("default", {}, "built in"),
        ("bad name", {}, "name"),
        ("ok", {"seed": 1, "embedding": EMBEDDING}, "not both"),
        ("ok", {"embedding": "not base16384"}, "embedding"),
        ("ok", {"piper_voice": "../etc/voice.onnx"}, "inside FARM_MODELS_DIR"),
        ("ok", {"espeak_voice": "en us; rm -rf"}, "espeak_voice"),
        ("ok", {"slot": 3}, "slot"),
        ("ok", {"pitch": 3}, "Extra inputs"),
    ],
)
def test_bad_speakers_are_refused_before_redis_is_touched(name: str, voices: dict, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        register_speaker(name, **voices)


def test_a_taken_name_is_refused_and_default_cannot_be_removed(name: str) -> None:
    register_speaker(name, seed=1)
    try:
        with pytest.raises(InvalidRequest, match="already registered"):
            register_speaker(name, seed=2)
        assert get_speaker(name).seed == 1  # the voice never changed under anyone
    finally:
        remove_speaker(name)
    with pytest.raises(InvalidRequest, match="built in"):
        remove_speaker("default")


def test_farm_speakers_add_list_rm(name: str) -> None:
    def farm(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "mediafarm.workers.cli", "speakers", *args]
        env = {**os.environ, "COLUMNS": "200"}
        return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)

    added = farm("add", name, "--seed", "7", "--espeak-voice", "en-us+f4")
    assert added.returncode == 0 and f"speaker {name} registered" in added.stdout, added.stdout + added.stderr
    listed = farm("list")
    row = next(line for line in listed.stdout.splitlines() if name in line)
    assert "seed 7" in row and "en-us+f4" in row and "default" in listed.stdout
    again = farm("add", name, "--seed", "8")
    assert again.returncode == 2 and "already registered" in again.stderr
    assert farm("rm", name).returncode == 0
    missing = farm("rm", name)
    assert missing.returncode == 1 and "no speaker named" in missing.stderr


def test_an_engine_reads_the_speaker_store_only_through_its_contexts_redis(name: str, tmp_path) -> None:
    # A local call (no broker) given no Redis never opens a connection of its own: a registered
    # speaker is refused by name, the built-in one still speaks (checked by test_tts_engines).
    from mediafarm.tasks.families.tts import engines
    from mediafarm.tasks.families.tts.spec import PiperParams, TtsRequest
    from mediafarm.tasks.runtime.context import EngineContext

    register_speaker(name, piper_voice="piper/nowhere.onnx")
    try:
        request = TtsRequest(text="Hi.", speaker=name)
        bare = EngineContext.local(storage_dir=tmp_path, models_dir=tmp_path)
        with pytest.raises(PermanentFailure, match=f"speaker '{name}': this engine context has no Redis"):
            next(engines.piper(bare, request, PiperParams()))
        # Given the farm's Redis, the engine finds the speaker and goes for its voice file.
        given = EngineContext.local(storage_dir=tmp_path, models_dir=tmp_path, redis=app.backend.client)
        with pytest.raises(RungUnavailable, match="model 'piper/nowhere.onnx' is not in the models dir"):
            next(engines.piper(given, request, PiperParams()))
    finally:
        remove_speaker(name)
