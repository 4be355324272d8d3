"""On a cold pool child, a malformed file is refused before the engine's packages and model load.

The order of events is read from the child itself: after the rejection, the child has mapped no
model runtime (torch, onnxruntime); a good file afterwards loads them, in the same child.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from mediafarm.tasks.producer.client import submit
from mediafarm.tasks.wire.errors import JobRejected

pytestmark = pytest.mark.integration

RUNTIMES = ("libtorch", "onnxruntime")
# A queue of this test's own: the session's other workers consume the family queues.
QUEUE = "probe-vad"


def runtimes_mapped(pid: int) -> set[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {name for name in RUNTIMES if name in maps}


def test_a_cold_child_refuses_a_bad_file_before_loading_a_model(start_worker, media_root: Path, speech_track) -> None:
    worker = start_worker("cpu", concurrency=1, queues=[QUEUE])
    [child] = psutil.Process(worker.main_pid()).children()
    assert runtimes_mapped(child.pid) == set(), "the worker's main process forked a child with a runtime loaded"
    bad = media_root / "probe-notes.wav"
    bad.write_text("not audio at all\n" * 100)

    job = submit("vad", media=str(bad), queue=QUEUE)
    with pytest.raises(JobRejected, match="not a media file FFmpeg can read") as caught:
        job.wait(timeout=60)
    [attempt] = caught.value.attempts
    assert attempt["outcome"] == "rejected" and attempt["pid"] == child.pid
    assert runtimes_mapped(child.pid) == set()

    # The same child then runs a good file: the runtime loads (so the check above could fail).
    envelope = submit("vad", media=str(speech_track.path), queue=QUEUE).wait(timeout=120)
    assert envelope["variant"] == "silero-onnx" and envelope["attempts"][0]["pid"] == child.pid
    assert runtimes_mapped(child.pid) != set()
