"""FamilySpec checks its own ladder, parses requests strictly; the registry refuses clashes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from mediafarm.config.file import _read
from mediafarm.config.ladders import declared_ladders, rung
from mediafarm.config.limits import TimeLimits
from mediafarm.config.settings import get_settings
from mediafarm.tasks import registry as families
from mediafarm.tasks.wire.errors import InvalidRequest, MediaNotFound, MediaOutsideRoots
from mediafarm.tasks.wire.family import EngineSpec, FamilySpec, MediaPath, Params, Request


class EchoRequest(Request):
    media: MediaPath
    count: int = 1


class EchoResult(BaseModel):
    text: str = ""


class EchoParams(Params):
    level: int = Field(1, ge=0, le=3)


def make_spec(**overrides: Any) -> FamilySpec:
    fields: dict[str, Any] = dict(
        name="echo",
        task_name="farm.echo.run",
        request=EchoRequest,
        result=EchoResult,
        engines={"echo": EngineSpec("tests.tasks.test_family:no_engine", EchoParams)},
        ladder=(rung("loud", "echo", level=3), rung("quiet", "echo")),
        limits=TimeLimits(soft=10, hard=20),
    )
    fields.update(overrides)
    return FamilySpec(**fields)


# --- the spec checks itself when it is built -------------------------------------------------


def test_default_ladder_naming_an_unknown_engine_is_refused_naming_the_rung() -> None:
    with pytest.raises(ValueError, match=r"rung 'fancy' names an unknown engine 'missing'"):
        make_spec(ladder=(rung("fancy", "missing"),))


@pytest.mark.parametrize("params", [{"level": 9}, {"volume": 1}, {"level": "high"}])
def test_default_ladder_with_params_the_engine_rejects_is_refused_naming_the_rung(params: dict) -> None:
    with pytest.raises(ValueError, match=r"rung 'loud' \(engine 'echo'\): params do not fit"):
        make_spec(ladder=(rung("loud", "echo", **params),))


def test_cli_argument_must_be_a_request_field() -> None:
    with pytest.raises(ValueError, match="'text' is not a field of EchoRequest"):
        make_spec(cli_argument="text")


def test_queue_defaults_to_the_family_name() -> None:
    assert make_spec().queue == "echo"
    assert make_spec(queue="echo-gpu").queue == "echo-gpu"


# --- requests ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"media": "a.wav", "colour": "red"}, "colour"),  # unknown
        ({"count": 2}, "media"),  # missing
        ({"media": "a.wav", "count": "many"}, "count"),  # mistyped
    ],
)
def test_parse_request_refuses_bad_fields_naming_the_field(fields: dict, field: str) -> None:
    with pytest.raises(InvalidRequest, match=rf"^echo request: {field}: "):
        make_spec().parse_request(fields)


def test_producer_side_keeps_the_media_path_as_given() -> None:
    request = make_spec().parse_request({"media": "/not/on/this/machine.wav"})
    assert str(request.media) == "/not/on/this/machine.wav"
    assert request.model_dump(mode="json")["media"] == "/not/on/this/machine.wav"


def test_producer_side_still_refuses_an_empty_media_path() -> None:
    with pytest.raises(InvalidRequest, match="media: Value error, must be a non-empty path"):
        make_spec().parse_request({"media": "  "})


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    root = tmp_path / "media"
    root.mkdir()
    (root / "clip.wav").write_bytes(b"RIFF")
    (tmp_path / "secret.wav").write_bytes(b"RIFF")
    return root


def test_worker_side_resolves_the_media_path_inside_the_roots(root: Path) -> None:
    request = make_spec().parse_request({"media": "clip.wav"}, media_roots=[root])
    assert request.media == (root / "clip.wav").resolve()
    assert isinstance(request.media, Path)


def test_worker_side_refuses_media_outside_the_roots(root: Path) -> None:
    with pytest.raises(MediaOutsideRoots):
        make_spec().parse_request({"media": str(root.parent / "secret.wav")}, media_roots=[root])


def test_worker_side_refuses_missing_media(root: Path) -> None:
    with pytest.raises(MediaNotFound):
        make_spec().parse_request({"media": "gone.wav"}, media_roots=[root])


# --- engines ----------------------------------------------------------------------------------


def test_engine_missing_a_package_is_unavailable_naming_it() -> None:
    engine = EngineSpec("x:y", needs=("json", "mediafarm_no_such_package_xyz"))
    assert engine.unavailable(rung("r", "e")) == "package 'mediafarm_no_such_package_xyz' is not installed on this pool"


def test_the_skip_message_names_the_extra_that_installs_the_package() -> None:
    engine = EngineSpec("x:y", needs=("json", "mediafarm_no_such_package_xyz"), extra="subtitle")
    expected = (
        "package 'mediafarm_no_such_package_xyz' is not installed on this pool: pip install 'mediafarm[subtitle]'"
    )
    assert engine.missing() == expected
    assert engine.unavailable(rung("r", "e")) == expected
    assert EngineSpec("x:y", needs=("json",), extra="subtitle").missing() is None


def test_missing_parent_of_a_dotted_need_is_unavailable_not_a_crash() -> None:
    engine = EngineSpec("x:y", needs=("mediafarm_no_such_package_xyz.sub",))
    assert "mediafarm_no_such_package_xyz.sub" in engine.unavailable(rung("r", "e"))


def test_cuda_rung_without_the_variable_looks_for_nvidia_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    import glob

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    reason = EngineSpec("x:y").unavailable(rung("gpu", "e", device="cuda"))
    assert (reason is None) == bool(glob.glob("/dev/nvidia[0-9]*"))


@pytest.mark.parametrize("visible", ["", "-1"])
def test_cuda_rung_is_unavailable_without_visible_gpus(monkeypatch: pytest.MonkeyPatch, visible: str) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    reason = EngineSpec("x:y").unavailable(rung("gpu", "e", device="cuda"))
    assert reason is not None and "needs a GPU" in reason


def test_rungs_with_their_needs_met_are_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert EngineSpec("x:y", needs=("json",)).unavailable(rung("cpu", "e")) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert EngineSpec("x:y").unavailable(rung("gpu", "e", device="cuda")) is None


# --- the registry -----------------------------------------------------------------------------


@pytest.fixture()
def registry() -> Iterator[None]:
    """The registry as loaded, restored afterwards so no throwaway family leaks into other tests."""
    families.load()
    before = dict(families._families)
    yield
    families._families.clear()
    families._families.update(before)


def test_registering_the_same_spec_twice_is_harmless(registry: None) -> None:
    spec = make_spec()
    assert families.register(spec) is spec
    assert families.register(spec) is spec
    assert families.get("echo") is spec


@pytest.mark.parametrize(
    "clash",
    [
        dict(task_name="farm.echo.other"),  # same name
        dict(name="echo2"),  # same task name (farm.echo.run)
        dict(name="echo3", task_name="farm.echo3.run", queue="echo"),  # same queue
    ],
)
def test_register_refuses_a_second_family_sharing_name_task_or_queue(registry: None, clash: dict) -> None:
    first = families.register(make_spec())
    second = make_spec(**clash)
    with pytest.raises(ValueError, match="already registered|shares its task name or queue"):
        families.register(second)
    assert families.load()[first.name] is first
    assert second.name == first.name or second.name not in families.load()


def test_register_refuses_the_queue_of_a_builtin_family(registry: None) -> None:
    with pytest.raises(ValueError, match="'vad'"):
        families.register(make_spec(name="vad2", task_name="farm.vad2.run", queue="vad"))


def test_ladder_for_an_unknown_ladder_is_an_invalid_request() -> None:
    vad = families.get("vad")
    with pytest.raises(InvalidRequest, match="no ladder 'nope'"):
        families.ladder_for(vad, "nope")


def test_ladder_for_a_ladder_of_another_family_is_an_invalid_request() -> None:
    # kill_once is declared for the chaos family in tests/support/farm-test.toml.
    with pytest.raises(InvalidRequest, match="no ladder 'kill_once'"):
        families.ladder_for(families.get("vad"), "kill_once")
    assert families.ladder_for(families.get("chaos"), "kill_once").family == "chaos"


def test_ladder_for_a_rung_of_the_familys_own_ladder_starts_there_and_keeps_the_rungs_below() -> None:
    tts = families.get("tts")
    ladder = families.ladder_for(tts, "piper")
    assert [r.name for r in ladder.rungs] == ["piper", "espeak"] and ladder.family == "tts"
    assert ladder.name == "tts from piper"
    with pytest.raises(InvalidRequest, match=r"nor is it a rung of its own; .*rungs: \['chattts'"):
        families.ladder_for(tts, "alloy")


# --- operator file mistakes -------------------------------------------------------------------


def _clear_config_caches() -> None:
    get_settings.cache_clear()
    declared_ladders.cache_clear()
    _read.cache_clear()


@pytest.fixture()
def operator_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    def use(text: str) -> None:
        path = tmp_path / "farm.toml"
        path.write_text(text)
        monkeypatch.setenv("FARM_CONFIG_FILE", str(path))
        _clear_config_caches()

    _clear_config_caches()
    yield use
    monkeypatch.undo()
    _clear_config_caches()


def test_session_config_file_has_no_ladder_problems() -> None:
    assert families.ladder_problems() == []


def test_ladder_problems_names_unregistered_families_and_bad_rungs(operator_file: Callable[[str], None]) -> None:
    operator_file(
        "[limits.ghost]\nsoft = 1\nhard = 2\n"
        '[ladders.orphan]\nfamily = "phantom"\nrungs = [{ name = "r", engine = "e" }]\n'
        '[ladders.vad]\nrungs = [{ name = "w", engine = "nope" }]\n'
        '[ladders.vad-loud]\nfamily = "vad"\nrungs = [{ name = "loud", engine = "webrtc", params = { aggressiveness = 9 } }]\n'
    )
    problems = families.ladder_problems()
    assert len(problems) == 4, problems
    assert problems[0].startswith("[limits.ghost]: no job family named 'ghost'")
    assert any(p.startswith("[ladders.orphan]: no job family named 'phantom'") for p in problems)
    assert any(p.startswith("[ladders.vad] rung 'w' names an unknown engine 'nope'") for p in problems)
    assert any(p.startswith("[ladders.vad-loud] rung 'loud' (engine 'webrtc'): params do not fit") for p in problems)
