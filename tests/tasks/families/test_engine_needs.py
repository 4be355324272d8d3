"""An engine's packages are stated once, in its ``EngineSpec.needs``: the built-in families name the
extra that installs them, and no engine module guards its own imports."""

from __future__ import annotations

import ast
import importlib
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mediafarm.tasks import registry
from mediafarm.tasks.families.subtitle.engines import speech_spans
from mediafarm.tasks.runtime.context import EngineContext

ROOT = Path(__file__).resolve().parents[3]
BUILTIN_FAMILIES = ROOT / "tasks" / "families"
IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}


def _extras() -> set[str]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return set(tomllib.load(file)["project"]["optional-dependencies"])


@pytest.mark.parametrize("name", sorted(registry.BUILTIN))
def test_every_builtin_engine_names_an_extra_of_the_package(name: str) -> None:
    spec = importlib.import_module(name).FAMILY
    extras = _extras()
    for engine_name, engine in spec.engines.items():
        assert engine.needs, f"{spec.name}.{engine_name} declares no needs"
        assert engine.extra in extras, f"{spec.name}.{engine_name}: extra {engine.extra!r} is not in pyproject.toml"


def _guards(path: Path) -> list[int]:
    """Lines of ``except ImportError`` handlers that raise RungUnavailable (an import guard)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ExceptHandler) or node.type is None:
            continue
        caught = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
        if not any(isinstance(c, ast.Name) and c.id in IMPORT_ERRORS for c in caught):
            continue
        raised = [n for n in ast.walk(node) if isinstance(n, ast.Raise) and n.exc is not None]
        if any("RungUnavailable" in ast.unparse(r.exc) for r in raised):
            lines.append(node.lineno)
    return lines


def test_no_engine_module_guards_its_imports() -> None:
    modules = [*BUILTIN_FAMILIES.rglob("*.py"), ROOT / "tasks" / "runtime" / "gpu.py"]
    guarded = {str(p.relative_to(ROOT)): lines for p in modules if (lines := _guards(p))}
    assert not guarded, f"import guards beside EngineSpec.needs (declare the package there instead): {guarded}"


def test_the_guard_finder_finds_a_guard(tmp_path: Path) -> None:
    example = tmp_path / "engine.py"
    example.write_text(
        "try:\n    import faster_whisper\nexcept (ModuleNotFoundError, OSError) as exc:\n"
        "    raise RungUnavailable('pip install it') from exc\n"
    )
    assert _guards(example) == [3]


def test_the_subtitle_vad_falls_back_to_webrtc_when_the_pool_lacks_silero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("webrtcvad", reason="webrtcvad is the fallback under test (vad extra)")
    media = tmp_path / "tone.wav"
    sf.write(media, (0.3 * np.sin(np.arange(16000 * 2) * 2 * np.pi * 220 / 16000)).astype(np.float32), 16000)
    ctx = EngineContext.local(storage_dir=tmp_path / "storage")
    monkeypatch.setitem(sys.modules, "silero_vad", None)  # find_spec answers None: not installed
    assert speech_spans(ctx, media).model.startswith("webrtcvad")
    monkeypatch.undo()
    if registry.get("vad").engines["silero"].missing() is None:
        assert speech_spans(ctx, media).model.startswith("silero-vad")
