"""The farm installs under one namespace: every package is listed, and a producer's own modules never clash."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Folder in the repository -> the package it installs as.
ROOTS = {
    "mediafarm": "mediafarm",
    "config": "mediafarm.config",
    "tasks": "mediafarm.tasks",
    "workers": "mediafarm.workers",
    "gateway": "mediafarm.gateway",
}


def _setuptools() -> dict:
    with (REPO / "pyproject.toml").open("rb") as fh:
        return tomllib.load(fh)["tool"]["setuptools"]


def _packages_on_disk() -> set[str]:
    found = set()
    for folder, package in ROOTS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder)
            found.add(".".join([package, *relative.parts]))
    return found


def test_every_folder_with_an_init_is_a_listed_package() -> None:
    on_disk = _packages_on_disk()
    assert {"mediafarm", "mediafarm.tasks.families.vad"} <= on_disk  # the walk itself works
    assert on_disk - set(_setuptools()["packages"]) == set()


def test_package_dirs_map_the_namespace_onto_the_folders() -> None:
    assert _setuptools()["package-dir"] == {package: folder for folder, package in ROOTS.items()}


def test_the_image_s_dependency_skeleton_has_the_source_s_package_folders(tmp_path: Path) -> None:
    # The Dockerfile installs the dependencies from pyproject.toml and this skeleton alone.
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import package_skeleton
    finally:
        sys.path.remove(str(REPO / "scripts"))
    (tmp_path / "pyproject.toml").write_bytes((REPO / "pyproject.toml").read_bytes())
    made = {path.relative_to(tmp_path) for path in package_skeleton.make(tmp_path)}
    source = {init.parent.relative_to(REPO) for folder in ROOTS for init in (REPO / folder).rglob("__init__.py")}
    assert made == source and all((tmp_path / path / "__init__.py").is_file() for path in made)


def _python(code: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _producer_env(**extra: str) -> dict[str, str]:
    """The environment of a producer service: no PYTHONPATH, none of the test session's farm settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


def test_producer_with_its_own_tasks_and_config_modules_imports_the_farm(tmp_path: Path, redis_url: str) -> None:
    (tmp_path / "tasks.py").write_text("MARKER = 'producer tasks'\n")
    (tmp_path / "config.py").write_text("MARKER = 'producer config'\n")
    result = _python(
        """
        from mediafarm import submit, JobRejected
        import mediafarm.tasks.app
        import tasks, config
        from mediafarm.tasks.wire.errors import JobFailed
        assert issubclass(JobRejected, JobFailed) and callable(submit)
        assert mediafarm.tasks.app.app.main == "mediafarm"
        print(tasks.MARKER, "|", config.MARKER)
        """,
        cwd=tmp_path,
        env=_producer_env(FARM_BROKER_URL=redis_url),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "producer tasks | producer config"


def test_importing_the_settings_does_not_build_the_celery_app(tmp_path: Path) -> None:
    result = _python(
        """
        import sys
        import mediafarm.config.settings
        print("mediafarm.tasks.app" in sys.modules, "mediafarm.tasks.producer.client" in sys.modules)
        """,
        cwd=tmp_path,
        env=_producer_env(),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_a_producer_imports_no_media_or_model_package(tmp_path: Path, redis_url: str) -> None:
    # The core install (what a producer service has) carries none of these: a family's spec
    # module that imported one would break every producer (the TTS spec once pulled PyAV).
    result = _python(
        """
        import sys
        import mediafarm
        import mediafarm.tasks.app, mediafarm.tasks.producer.client, mediafarm.workers.cli
        from mediafarm.tasks import registry
        registry.load()
        heavy = ["av", "numpy", "soundfile", "torch", "onnxruntime", "ultralytics", "ChatTTS", "cv2",
                 "faster_whisper", "ctranslate2", "silero_vad", "piper", "pocketsphinx"]
        print(sorted(m for m in heavy if m in sys.modules))
        """,
        cwd=tmp_path,
        env=_producer_env(FARM_BROKER_URL=redis_url),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
