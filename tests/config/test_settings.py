from pathlib import Path

import pytest

from mediafarm.config.file import ConfigFileError
from mediafarm.config.ladders import declared_ladders
from mediafarm.config.pools import get_pool, get_pools
from mediafarm.config.settings import FarmSettings


def test_media_roots_split_like_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_MEDIA_ROOTS", "/srv/cam:/srv/tts")
    assert FarmSettings().media_roots == [Path("/srv/cam"), Path("/srv/tts")]


def test_backend_defaults_to_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_BROKER_URL", "redis://h:1/0")
    monkeypatch.delenv("FARM_RESULT_BACKEND", raising=False)
    assert FarmSettings().backend_url == "redis://h:1/0"


def test_default_vad_ladder_is_silero_webrtc_skip() -> None:
    from mediafarm.tasks import families

    assert [v.name for v in families.ladder_for(families.get("vad")).rungs] == ["silero-onnx", "webrtc", "skip"]


def test_unknown_family_and_pool_are_named() -> None:
    from mediafarm.tasks import families

    with pytest.raises(ValueError, match="unknown job family 'nope'"):
        families.get("nope")
    with pytest.raises(ConfigFileError, match="no pool named 'nope'"):
        get_pool("nope")


@pytest.fixture(autouse=True)
def _fresh_caches():
    """Settings and ladders are read once per process; these tests change them."""
    from mediafarm.config.settings import get_settings

    yield
    get_settings.cache_clear()
    declared_ladders.cache_clear()


def test_config_file_overrides_pool_and_ladder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mediafarm.config.settings import get_settings

    path = tmp_path / "farm.toml"
    path.write_text(
        '[pools.cpu]\nchild_rss_cap_mb = 512\n'
        '[ladders.vad]\nrungs = [{ name = "w", engine = "webrtc", params = { aggressiveness = 3 } }]\n'
    )
    monkeypatch.setenv("FARM_CONFIG_FILE", str(path))
    get_settings.cache_clear()
    declared_ladders.cache_clear()
    try:
        from mediafarm.tasks import families

        cpu = get_pools()["cpu"]
        assert cpu.child_rss_cap_mb == 512 and cpu.queues == ("*",)
        ladder = families.ladder_for(families.get("vad"))
        assert [(v.name, v.engine, dict(v.params)) for v in ladder.rungs] == [("w", "webrtc", {"aggressiveness": 3})]
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[pools.x]\nqueues = []\n", "consumes no queue"),
        ("[pools.x]\nqueues = ['vad']\nbogus = 1\n", "unknown keys"),
        ("[ladders.vad]\nrungs = [{ name = 'a' }]\n", "needs at least name and engine"),
        ("[ladders.vad]\nrungs = []\n", "has no rungs"),
        ("not toml [", "not valid TOML"),
    ],
)
def test_bad_config_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, message: str) -> None:
    from mediafarm.config.settings import get_settings

    path = tmp_path / "farm.toml"
    path.write_text(body)
    monkeypatch.setenv("FARM_CONFIG_FILE", str(path))
    get_settings.cache_clear()
    declared_ladders.cache_clear()
    try:
        with pytest.raises(ConfigFileError, match=message):
            get_pools()
            declared_ladders()
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
