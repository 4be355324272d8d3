"""One storage for one farm (issue #18 item 9): with nothing set, `farm up` started in one folder and
`farm submit --out` run from another find the same storage folder; a producer that looks in another
one is told where it looked and where the worker wrote the files. Real `farm` processes, real Redis."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.workers.test_cli import FARM, clean_env

pytestmark = pytest.mark.integration


def one_line(text: str) -> str:
    """The CLI's output with rich's line wrapping undone."""
    return re.sub(r"\s*\n\s*", " ", text)


def test_up_in_one_folder_and_submit_from_another_share_one_storage(tmp_path: Path) -> None:
    data = tmp_path / "data"  # stands for ~/.local/share: the same for every process of one user
    up_dir, elsewhere = tmp_path / "up-here", tmp_path / "submit-from-here"
    up_dir.mkdir()
    elsewhere.mkdir()
    env = clean_env(XDG_DATA_HOME=str(data), FARM_FAMILY_MODULES="tests.support.toy")
    proc = subprocess.Popen(
        FARM + ["up", "--concurrency", "1"], env=env, cwd=up_dir,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while "Ctrl-C to stop" not in one_line("".join(lines)):  # the announcement, wrapped or not
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stdout.readline())
        announced = one_line("".join(lines))
        storage = data / "mediafarm" / "storage"
        assert f"storage {storage}" in announced, announced
        port = int(re.search(r"127\.0\.0\.1:(\d+)", "".join(lines)).group(1))
        producer = {**env, "FARM_BROKER_URL": f"redis://127.0.0.1:{port}/0"}

        def submit(out: Path, **extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                FARM + ["submit", "toy", "one two three", "--out", str(out)], env={**producer, **extra},
                cwd=elsewhere, capture_output=True, text=True, timeout=120,
            )  # fmt: skip

        done = submit(tmp_path / "out")
        assert done.returncode == 0, done.stdout + done.stderr
        assert (tmp_path / "out" / "words.txt").read_text() == "ONE\nTWO\nTHREE\n"
        (job_folder,) = [p for p in storage.iterdir() if p.is_dir()]
        assert (job_folder / "words.txt").is_file() and not (up_dir / "storage").exists()

        # A producer pointed at another folder fails after the job succeeded, saying where it
        # looked and where the worker wrote the file, and with no traceback.
        lost = submit(tmp_path / "out2", FARM_STORAGE_DIR="wrong/storage")
        message = one_line(lost.stderr + lost.stdout)
        assert lost.returncode == 1, message
        assert f"this process's FARM_STORAGE_DIR is {elsewhere / 'wrong' / 'storage'}" in message
        assert f"its FARM_STORAGE_DIR is {storage}" in message and "Traceback" not in message
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, "".join(lines) + out
