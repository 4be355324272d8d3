"""A job whose media is named by URL, through a real worker that fetches it from an HTTP server on
loopback (``FARM_MEDIA_URLS=loopback`` for this worker only): the same result as the same media
named by path, nothing left in the job's folder, and a URL off the list rejected naming the rule."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mediafarm import JobRejected, submit
from mediafarm.config.settings import get_settings
from mediafarm.tasks.runtime.media_fetch import FOLDER
from mediafarm.tasks.wire.artifacts import ArtifactStore
from tests.support.live_stream import http_folder

pytestmark = pytest.mark.integration
QUEUE = "media-url-test"


@pytest.fixture(scope="module")
def url_worker(start_worker):
    return start_worker("cpu", concurrency=1, queues=[QUEUE], env={"FARM_MEDIA_URLS": "loopback"})


def test_media_named_by_url_gives_what_the_same_file_gives(url_worker, speech_track, tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    shutil.copyfile(speech_track.path, served / "talk.wav")
    by_path = submit("vad", queue=QUEUE, media=str(speech_track.path)).wait(timeout=120)
    with http_folder(served) as base:
        job = submit("vad", queue=QUEUE, media=f"{base}/talk.wav")
        by_url = job.wait(timeout=120)
    assert by_url["output"]["spans"] == by_path["output"]["spans"] and by_url["output"]["spans"]
    assert by_url["attempts"][-1]["outcome"] == "ok"
    # The fetched copy went with the attempt: nothing of it stays in the job's folder.
    inputs = ArtifactStore(get_settings().storage_dir, job.id).folder / FOLDER
    assert not inputs.exists() or not any(inputs.iterdir())


def test_a_url_off_the_list_is_rejected_naming_the_setting(url_worker) -> None:
    # 192.0.2.0/24 is TEST-NET-1: never listed here, and never reached (refused before a connect).
    job = submit("vad", queue=QUEUE, media="http://192.0.2.7/talk.wav")
    with pytest.raises(JobRejected, match="host 192.0.2.7 is not in FARM_MEDIA_URLS") as caught:
        job.wait(timeout=60)
    assert [a["outcome"] for a in caught.value.attempts] == ["rejected"]
