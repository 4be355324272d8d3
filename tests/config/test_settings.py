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
    from mediafarm.tasks import registry

    assert [v.name for v in registry.ladder_for(registry.get("vad")).rungs] == ["silero-onnx", "webrtc", "skip"]


def test_unknown_family_and_pool_are_named() -> None:
    from mediafarm.tasks import registry

    with pytest.raises(ValueError, match="unknown job family 'nope'"):
        registry.get("nope")
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
        from mediafarm.tasks import registry

        cpu = get_pools()["cpu"]
        assert cpu.child_rss_cap_mb == 512 and cpu.queues == ("*",)
        ladder = registry.ladder_for(registry.get("vad"))
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
        # The [breaker] defaults with no [ladders] table: still read at start, not at each job.
        ("[breaker]\nfailures = 0\n", "failures must be >= 1"),
        ("[breaker]\ncooldown = 30\n", "cooldown"),
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


def test_storage_defaults_to_one_absolute_folder_whatever_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `farm up` in one folder and `farm submit --out` from another must agree (issue #18 item 9).
    monkeypatch.delenv("FARM_STORAGE_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    seen = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        seen.append(FarmSettings().storage_dir)
    assert seen == [tmp_path / "data" / "mediafarm" / "storage"] * 2


def test_storage_default_without_xdg_data_home_is_under_the_home_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FARM_STORAGE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for unset_or_relative in ("", "relative/data"):  # a relative XDG_DATA_HOME is ignored (XDG rules)
        monkeypatch.setenv("XDG_DATA_HOME", unset_or_relative)
        assert FarmSettings().storage_dir == tmp_path / "home" / ".local" / "share" / "mediafarm" / "storage"


def test_a_relative_storage_dir_is_made_absolute_once_as_the_process_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FARM_STORAGE_DIR", "farm/storage")
    settings = FarmSettings()
    assert settings.storage_dir == tmp_path / "farm" / "storage" and settings.storage_dir.is_absolute()
    monkeypatch.chdir("/")  # a later change of folder no longer moves it
    assert settings.storage_dir == tmp_path / "farm" / "storage"
    monkeypatch.setenv("FARM_STORAGE_DIR", "~/jobs")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert FarmSettings().storage_dir == tmp_path / "home" / "jobs"


def test_gateway_settings_split_on_commas_and_uploads_are_an_input_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_API_TOKENS", "abc, def ,")
    monkeypatch.setenv("FARM_CORS_ORIGINS", "https://a.example:8443,http://localhost:3000")
    monkeypatch.setenv("FARM_MEDIA_ROOTS", "/srv/cam")
    monkeypatch.setenv("FARM_STORAGE_DIR", "/srv/farm")
    monkeypatch.delenv("FARM_UPLOADS_DIR", raising=False)
    settings = FarmSettings()
    assert settings.api_tokens == ["abc", "def"]
    assert settings.cors_origins == ["https://a.example:8443", "http://localhost:3000"]
    # The uploads live in the storage folder under a name no job folder can have (ids encode '.').
    assert settings.uploads_folder == Path("/srv/farm/.uploads")
    assert settings.media_roots == [Path("/srv/cam")]
    assert settings.input_roots == [Path("/srv/cam"), Path("/srv/farm/.uploads")]
    monkeypatch.setenv("FARM_UPLOADS_DIR", "/srv/uploads")
    assert FarmSettings().input_roots == [Path("/srv/cam"), Path("/srv/uploads")]
