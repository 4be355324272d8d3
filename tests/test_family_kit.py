"""A family imports the farm only through the kit (``mediafarm.tasks.kit``), read from the source.

Every import counts, at module level and inside functions (``tests/test_import_graph.py`` walks
them). A family may also import its own package and another family's (the kit's docstring says
why); never the registry, the app, the client, nor any other module of the farm.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

from mediafarm.tasks import kit
from mediafarm.tasks.kit import media as kit_media
from tests.conftest import REPO
from tests.test_import_graph import imported_names, modules
from tests.test_producer_import import HEAVY, WORKER_SIDE, loaded_after

KIT = "mediafarm.tasks.kit"
FAMILIES = "mediafarm.tasks.families"
TOY = REPO / "tests" / "support" / "toy"


def family_modules() -> dict[str, Path]:
    """Every module of every family (the registry itself is the farm's), and the tests' toy family."""
    found = {name: path for name, path in modules().items() if name.startswith(FAMILIES + ".")}
    for path in TOY.glob("*.py"):
        parts = ["tests", "support", "toy"] + ([] if path.stem == "__init__" else [path.stem])
        found[".".join(parts)] = path
    return found


def allowed(name: str) -> bool:
    """May a family import ``name``? Anything outside the farm, the kit, or a family's package."""
    if name.split(".")[0] != "mediafarm":
        return True
    return name == KIT or name.startswith((KIT + ".", FAMILIES + "."))


def farm_imports_outside_the_kit(module: str, path: Path) -> list[str]:
    names = imported_names(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
    return sorted({name for name in names if not allowed(name)})


def test_the_rule_tells_the_kit_and_families_from_the_rest_of_the_farm() -> None:
    assert allowed("mediafarm.tasks.kit") and allowed("mediafarm.tasks.kit.media.audio_blocks")
    assert allowed("mediafarm.tasks.families.tts.speakers") and allowed("numpy") and allowed("tests.support.toy")
    assert not allowed("mediafarm.tasks.registry")  # the registry
    assert not allowed("mediafarm.tasks.kitchen") and not allowed("mediafarm")
    assert not allowed("mediafarm.tasks.app") and not allowed("mediafarm.config.ladders")
    # A function-level import of the app is caught; the kit's names are not.
    source = "def f():\n    from mediafarm.tasks.app import app\nfrom mediafarm.tasks.kit import rung\n"
    names = imported_names(source, "mediafarm.tasks.families.x.y", is_package=False)
    assert sorted(n for n in names if not allowed(n)) == ["mediafarm.tasks.app", "mediafarm.tasks.app.app"]


def test_every_family_module_imports_the_farm_only_through_the_kit() -> None:
    found = family_modules()
    # The walk itself works: every built-in family and the toy are read.
    for family in ("vad", "subtitle", "subtitle_render", "tts", "dialogue", "yolo", "camfilter"):
        assert f"{FAMILIES}.{family}.spec" in found
    assert "tests.support.toy" in found and "tests.support.toy.engines" in found
    outside = {module: names for module, path in found.items() if (names := farm_imports_outside_the_kit(module, path))}
    assert outside == {}, "family modules importing the farm around the kit: " + "; ".join(
        f"{module}: {', '.join(names)}" for module, names in sorted(outside.items())
    )


@pytest.mark.parametrize("module", [kit, kit_media], ids=lambda m: m.__name__)
def test_every_name_the_kit_offers_resolves(module) -> None:
    assert module.__all__ and len(set(module.__all__)) == len(module.__all__)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []
    # A name is re-exported, never a copy: it is the object of the module that defines it.
    for name in module.__all__:
        value = getattr(module, name)
        home = getattr(value, "__module__", None)
        if home and home.startswith("mediafarm.") and not home.startswith(KIT):
            assert getattr(importlib.import_module(home), name, value) is value, name


def test_the_light_kit_loads_no_media_model_or_worker_package(tmp_path: Path, redis_url: str) -> None:
    # Spec modules import the kit and every farm process imports the specs, producers included.
    loaded = loaded_after("import mediafarm.tasks.kit", tmp_path, redis_url)
    assert KIT in loaded and "mediafarm.tasks.wire.family" in loaded  # the walk itself works
    assert [m for m in loaded if m.split(".")[0] in HEAVY + WORKER_SIDE] == []
    # The engine's names (EngineContext, torch_device, alive) come from the runtime on first use.
    assert [m for m in loaded if m.startswith("mediafarm.tasks.runtime")] == []
    assert "mediafarm.tasks.app" not in loaded  # farm_redis builds the app on first use, not on import


def test_a_familys_keys_live_under_the_farms_prefix_outside_the_farms_own_spaces() -> None:
    assert kit.family_key("loudness", "job-1", "levels") == "mediafarm:loudness:job-1:levels"
    assert kit.family_key("speakers") == "mediafarm:speakers"  # the TTS store, where it always was
    for space, problem in (("attempts", "the farm's own"), ("Loud ness", "must match"), ("", "must match")):
        with pytest.raises(ValueError, match=problem):
            kit.family_key(space, "x")
    with pytest.raises(ValueError, match="non-empty"):
        kit.family_key("loudness", "")
    # FARM_SPACES is every space keys.py's own keys use, so no family key can land among them.
    from mediafarm.tasks.wire import keys

    own = {name: value for name, value in vars(keys).items() if callable(value) and value.__module__ == keys.__name__}
    spaces = {
        key(*["x"] * len(inspect.signature(key).parameters)).split(":")[1]
        for name, key in own.items() if name not in {"family_key", "every_key"}
    }  # fmt: skip
    assert len(own) >= 8 and spaces == keys.FARM_SPACES


def test_the_worked_family_of_the_docs_imports_the_farm_only_through_the_kit() -> None:
    # What a newcomer copies from docs/adding-a-family.md must pass the rule the real families do.
    from tests.support.docs import code_blocks

    files = {b.marker.removeprefix("file: "): b.text for b in code_blocks(REPO / "docs" / "adding-a-family.md")
             if (b.marker or "").startswith("file: tasks/families/")}  # fmt: skip
    assert set(files) == {f"tasks/families/loudness/{name}" for name in ("spec.py", "engines.py", "__init__.py")}
    for path, text in files.items():
        module = f"{FAMILIES}.loudness" + ("" if path.endswith("__init__.py") else "." + Path(path).stem)
        names = list(imported_names(text, module, path.endswith("__init__.py")))
        assert sorted({n for n in names if not allowed(n)}) == [], path
        assert any(n.startswith(KIT) for n in names) or path.endswith("__init__.py"), path  # the walk works
