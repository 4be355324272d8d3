"""The docs' commands, run: the README's tour on the farm its own `farm up` starts, the producer
page's runnable blocks on that farm, and the worked family of docs/adding-a-family.md on a worker.

The tour runs as a newcomer runs it: a clean environment (no FARM_* variable, so `farm up` embeds
a Redis, and the worker's media root and models are the working folder's; the data folder, where
storage defaults to, is the test's), `farm up` from the block marked ``<!-- tour:farm -->``, then
the block marked ``<!-- tour -->`` in bash with the broker URL `farm up` printed. The working
folder stands for the repo root: the repo's ``tasks/`` (for the bundled clip) and, as the reader's
own, a video at ``media/cam.mp4``. No model: the tour's TTS speaks on the espeak rung, from the tts
extra's libespeak-ng wheel.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.result import AsyncResult

from tests.conftest import REPO
from tests.support.docs import code_blocks, marked
from tests.support.farm_app import farm_app

pytestmark = pytest.mark.integration
README = REPO / "README.md"
PRODUCERS = REPO / "docs" / "producers.md"
ADDING = REPO / "docs" / "adding-a-family.md"
PLACEHOLDER = "redis://127.0.0.1:PORT/0"  # the tour's stand-in for the URL `farm up` prints
DOC_MEDIA = "/media/cam/2026-11-29.mp4"  # the producer page's example file
WORKED_FAMILY = "mediafarm.tasks.families.loudness"
BIN = Path(sys.executable).parent
FARM = BIN / "farm"


def newcomer_env(home: Path) -> dict[str, str]:
    """No FARM_* setting; the data folder (where storage defaults to) inside ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", COLUMNS="200", XDG_DATA_HOME=str(home / "data"))
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


class FarmUp:
    """`farm up` running in the background, its output collected as it comes."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)

    def text(self) -> str:
        return "".join(self.output)

    def broker_url(self, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r"farm up.*broker (redis://127\.0\.0\.1:\d+/\d+)", self.text())
            if found:
                return found.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"`farm up` printed no broker URL:\n{self.text()[-4000:]}")

    def stop(self) -> int:
        """Ctrl-C, as the tour says; its process group is killed only if it will not stop."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


@pytest.fixture
def repo_root_copy(tmp_path: Path) -> Path:
    """A folder that stands for the repo root, with what the tour's reader brings."""
    (tmp_path / "tasks").symlink_to(REPO / "tasks", target_is_directory=True)
    from tests.support.yolo import make_video

    (tmp_path / "media").mkdir()
    make_video(tmp_path / "media" / "cam.mp4", audio_seconds=8.0)
    return tmp_path


@pytest.fixture
def farm_up(repo_root_copy: Path) -> Iterator[FarmUp]:
    if not FARM.exists():
        pytest.skip(f"no `farm` script beside {sys.executable} (install the package: pip install -e .)")
    command = marked(README, "tour:farm").text
    argv = shlex.split(command, comments=True)
    assert argv == ["farm", "up"], f"the tour's first block should start the farm: {command!r}"
    farm = FarmUp(argv, repo_root_copy, newcomer_env(repo_root_copy))
    yield farm
    code = farm.stop()
    assert code == 0, f"`farm up` ended with {code} on Ctrl-C:\n{farm.text()[-3000:]}"


def _text(part: bytes | str | None) -> str:
    return part.decode(errors="replace") if isinstance(part, bytes) else part or ""


def test_the_readme_tour_runs_on_the_farm_its_farm_up_starts(farm_up: FarmUp, repo_root_copy: Path) -> None:
    url = farm_up.broker_url()
    tour = marked(README, "tour").text
    assert PLACEHOLDER in tour, f"the tour should export the URL `farm up` printed as {PLACEHOLDER}"
    # The test's own probe after the reader's commands: the job id the tour kept in $job.
    script = "set -euo pipefail\n" + tour.replace(PLACEHOLDER, url) + '\necho "tour job: $job"\n'
    env = newcomer_env(repo_root_copy)
    # `bash -x`: a tour that hangs says at which command. It must end before the test's own timeout
    # (pytest-timeout's 300 s), or the failure shows the test's threads instead of the tour's output.
    try:
        proc = run(["bash", "-x", "-c", script], repo_root_copy, env, timeout=240)
    except subprocess.TimeoutExpired as exc:
        said = "".join(_text(part) for part in (exc.stdout, exc.stderr))
        pytest.fail(f"the tour did not end in 240 s:\n{said[-6000:]}\n--- farm up ---\n{farm_up.text()[-3000:]}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"the tour failed:\n{out[-6000:]}\n--- farm up ---\n{farm_up.text()[-3000:]}"
    assert "speech spans" in proc.stdout  # vad --wait printed its result

    # The subtitle job it only watched: settled, on the rung this machine has, with its history.
    job = re.search(r"tour job: (\S+)", proc.stdout).group(1)
    envelope = AsyncResult(job, app=farm_app(url)).get(timeout=300)
    assert envelope["variant"] == "pocketsphinx", envelope["attempts"]
    assert [a["outcome"] for a in envelope["attempts"]] == ["unavailable", "unavailable", "unavailable", "ok"]
    env["FARM_BROKER_URL"] = url
    history = run([str(FARM), "status", job], repo_root_copy, env)
    assert history.returncode == 0 and f"{job}: SUCCESS" in history.stdout, history.stdout + history.stderr
    assert "whisper-large" in history.stdout and "pocketsphinx" in history.stdout

    # What the other jobs saved where the tour said they would.
    out_dir = repo_root_copy / "out"
    assert (out_dir / "hello.wav").stat().st_size > 10_000
    assert (out_dir / "scene" / "dialogue.wav").stat().st_size > 10_000
    assert {"dialogue.vtt", "dialogue.srt"} <= {p.name for p in (out_dir / "scene").iterdir()}
    assert list((out_dir / "clips").glob("clips/clip_*")), sorted(p.name for p in (out_dir / "clips").rglob("*"))

    # The producer page's runnable blocks, against the same farm, on the tour's clip.
    for marker in ("run: client", "run: celery"):
        code = marked(PRODUCERS, marker).text
        assert DOC_MEDIA in code, f"{marker}: the block should name {DOC_MEDIA}"
        code = code.replace(DOC_MEDIA, str(repo_root_copy / "media" / "talk.ogg"))
        block = run([sys.executable, "-c", code], repo_root_copy, env)
        assert block.returncode == 0, f"docs/producers.md <!-- {marker} -->:\n{block.stdout}{block.stderr[-4000:]}"
        assert "silero-onnx" in block.stdout, block.stdout


def test_the_worked_family_of_adding_a_family_runs_on_a_real_worker(start_worker, media_root: Path,
                                                                      tmp_path: Path) -> None:  # fmt: skip
    """The page's files, as written, made a plugin module (``FARM_FAMILY_MODULES``, no file of the
    farm edited): its engine test passes, and a real worker runs a job of it from `farm submit`."""
    if not FARM.exists():
        pytest.skip(f"no `farm` script beside {sys.executable} (install the package: pip install -e .)")
    files = {b.marker.removeprefix("file: "): b.text for b in code_blocks(ADDING)
             if (b.marker or "").startswith("file: ")}  # fmt: skip
    folder = "tasks/families/loudness/"
    assert set(files) == {f"{folder}spec.py", f"{folder}engines.py", f"{folder}__init__.py",
                          "tests/tasks/families/test_loudness_engines.py"}  # fmt: skip
    package = "docs_example_loudness"
    plugins = tmp_path / "plugins"
    (plugins / package).mkdir(parents=True)
    for path, text in files.items():
        target = plugins / package / Path(path).name if path.startswith(folder) else plugins / Path(path).name
        target.write_text(text.replace(WORKED_FAMILY, package) + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")]),
           "FARM_FAMILY_MODULES": os.pathsep.join([os.environ["FARM_FAMILY_MODULES"], package]), "COLUMNS": "200"}

    # Step 5's test, as a user runs it.
    unit = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(plugins)], plugins, env)
    assert unit.returncode == 0 and "1 passed" in unit.stdout, unit.stdout + unit.stderr

    start_worker("cpu", concurrency=1, queues=["loudness"], env=env)
    listed = run([str(FARM), "families"], tmp_path, env)
    assert re.search(r"loudness .*farm\.loudness\.measure .*fine → coarse", listed.stdout), listed.stdout
    clip = media_root / "docs-loudness.ogg"
    shutil.copyfile(REPO / "tasks" / "media" / "samples" / "speech.ogg", clip)
    sent = run([str(FARM), "submit", "loudness", str(clip), "--wait", "--json"], tmp_path, env)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    envelope = json.loads(sent.stdout)
    assert envelope["variant"] == "fine" and envelope["output"]["window_ms"] == 100
    assert -60 < envelope["output"]["peak_dbfs"] < 0 and envelope["output"]["duration"] > 5
    assert [a["name"] for a in envelope["artifacts"]] == ["levels.csv"]
