"""Artifacts in an S3-compatible object store (issue #30 items 1-3), against a real SeaweedFS on
loopback and real prefork workers: a worker, the producer and the gateway share no storage folder,
only Redis and the store. A stale write is refused, the store's outage costs no job, and the
gateway serves an artifact by stream and by presigned redirect."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from mediafarm.config.storage_url import S3Place
from mediafarm.tasks.producer.client import JobHandle, submit
from mediafarm.tasks.wire import object_store
from mediafarm.tasks.wire.errors import TransientFailure
from mediafarm.tasks.wire.records import ArtifactInfo
from tests.gateway.conftest import TOKEN, gateway_config, running_gateway
from tests.support.seaweed import BUCKET, SeaweedS3

pytestmark = pytest.mark.integration

PREFIX = "jobs"
QUEUE = "object-store-jobs"


@pytest.fixture(scope="module")
def s3(seaweed: SeaweedS3) -> SeaweedS3:
    return seaweed


@pytest.fixture(scope="module")
def s3_worker(s3: SeaweedS3, start_worker, tmp_path_factory: pytest.TempPathFactory):
    """A worker whose storage folder is its own (no other process reads it)."""
    own = tmp_path_factory.mktemp("worker-own-storage")
    env = {**s3.env(), "FARM_STORAGE_URL": f"s3://{BUCKET}/{PREFIX}", "FARM_STORAGE_DIR": str(own),
           "FARM_MEDIA_URLS": f"s3://{BUCKET}/inputs"}  # fmt: skip
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
    # The producer's own storage folder never held it, and the worker kept no copy once it was stored.
    assert not (get_settings().storage_dir / job.id).exists()
    assert not (s3_worker.storage / job.id).exists()
    got = job.download("words.txt", tmp_path)
    assert got.read_bytes() == b"ONE\nTWO\nTHREE\n"
    assert job.read_artifact("words.txt") == b"ONE\nTWO\nTHREE\n"
    head = s3.client().head_object(Bucket=BUCKET, Key=info.url.split("/", 3)[3])
    assert head["Metadata"]["sha256"] == info.sha256 == hashlib.sha256(b"ONE\nTWO\nTHREE\n").hexdigest()
    assert (head["Metadata"]["job"], head["Metadata"]["attempt"]) == (job.id, str(attempt))
    assert head["Metadata"]["worker"] == s3_worker.node and head["Metadata"]["rung"] == envelope["rung"]


def test_media_named_by_s3_url_gives_what_the_same_file_gives(s3, s3_worker, speech_track) -> None:
    from mediafarm import JobRejected

    s3.client().upload_file(str(speech_track.path), BUCKET, "inputs/talks/talk one.wav")
    by_path = submit("vad", queue=QUEUE, media=str(speech_track.path)).wait(timeout=120)
    by_url = submit("vad", queue=QUEUE, media=f"s3://{BUCKET}/inputs/talks/talk%20one.wav").wait(timeout=120)
    assert by_url["output"]["spans"] == by_path["output"]["spans"] and by_url["output"]["spans"]
    # Off the list (another folder of the bucket): refused naming the rule; a missing key: bad input.
    for media, problem in ((f"s3://{BUCKET}/{PREFIX}/secret.wav", "is not in FARM_MEDIA_URLS"),
                           (f"s3://{BUCKET}/inputs/none.wav", "not in the object store")):  # fmt: skip
        with pytest.raises(JobRejected, match=problem) as caught:
            submit("vad", queue=QUEUE, media=media).wait(timeout=60)
        assert [a["outcome"] for a in caught.value.attempts] == ["rejected"]


def test_farm_gc_removes_expired_jobs_objects_and_an_ended_jobs_stored_checkpoint(s3, s3_worker) -> None:
    from mediafarm.tasks.app import app
    from mediafarm.workers.retention import expired_objects, remove

    store, place, client = object_store.store_at(), S3Place(BUCKET, PREFIX), s3.client()
    gone = f"expired-{uuid.uuid4()}"  # a job whose result and history expired: its files stayed
    client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{gone}/0/words.txt", Body=b"old words")
    ended = toy_job()  # a job that ended, whose worker died before removing its stored checkpoint
    ended.wait(timeout=60)
    client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{ended.id}/.checkpoint/checkpoint.json", Body=b"{}")
    client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/not.a.job/file", Body=b"not the farm's")

    def found(**when: float) -> dict[str, Any]:
        return {str(r.path): r for r in expired_objects(place, store, app.backend, **when)}

    # Within the grace nothing of theirs goes.
    assert not [p for p in found(grace=3600) if gone in p or ended.id in p]
    removals = found(grace=5, now=time.time() + 10)
    expired, checkpoint = (
        removals[f"s3://{BUCKET}/{PREFIX}/{gone}/"],
        removals[f"s3://{BUCKET}/{PREFIX}/{ended.id}/.checkpoint/"],
    )
    assert (expired.reason, expired.size) == ("result and history expired", len(b"old words"))
    assert checkpoint.reason == "stored checkpoint of a job that has ended"
    assert f"s3://{BUCKET}/{PREFIX}/{ended.id}/" not in removals and not [p for p in removals if "not.a.job" in p]
    # `farm gc` lists them too, after the storage folder's.
    from tests.conftest import REPO

    env = {**os.environ, "FARM_STORAGE_URL": f"s3://{BUCKET}/{PREFIX}", "COLUMNS": "400"}
    listed = subprocess.run([sys.executable, "-m", "mediafarm.workers.cli", "gc", "--dry-run", "--grace", "0"], env=env,
                            cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert f"would remove s3://{BUCKET}/{PREFIX}/{gone}/ (result and history expired)" in listed.stdout
    for removal in removals.values():
        remove(removal, store)
    assert store.objects(BUCKET, f"{PREFIX}/{gone}/") == []
    left = [key for key, _, _ in store.objects(BUCKET, f"{PREFIX}/{ended.id}/")]
    assert left and not [k for k in left if "/.checkpoint/" in k]  # its artifacts stay with its result
    assert ended.read_artifact("words.txt") == b"ONE\nTWO\nTHREE\n"
    assert store.objects(BUCKET, f"{PREFIX}/not.a.job/")


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

    def publish(infos: list[ArtifactInfo], folder: Path, attempt: int) -> list[ArtifactInfo]:
        """What an attempt's success copies (a publisher of its own each time, as each attempt has)."""
        return object_store.AttemptPublisher(folder, place, job_id, attempt, writer, store).artifacts(infos)

    [first] = publish([info(winner)], winner, 0)
    # The same attempt publishing again (its own object): kept, no error.
    assert publish([info(winner)], winner, 0) == [first]
    # Another process under the same attempt's key, with other bytes: refused, the object unchanged.
    with pytest.raises(TransientFailure, match="written by another process"):
        publish([info(stale)], stale, 0)
    bucket, key = object_store.split_url(str(first.url))
    assert b"".join(store.get(bucket, key).chunks()) == b"the winner's words\n"
    # A big artifact goes in parts, create-only as well.
    big = tmp_path / "big"
    big.mkdir()
    (big / "words.txt").write_bytes(os.urandom(object_store.MULTIPART_BYTES + 1024))
    [parts] = publish([info(big)], big, 1)
    assert store.metadata(*object_store.split_url(str(parts.url)))["sha256"] == info(big).sha256
    with pytest.raises(TransientFailure, match="written by another process"):
        publish([info(stale)], stale, 1)


def test_a_worker_refuses_to_start_on_a_store_that_refuses_it(s3, monkeypatch) -> None:
    from mediafarm.config.settings import FarmSettings
    from mediafarm.workers import guards

    def with_url(url: str) -> None:
        monkeypatch.setattr(guards, "get_settings", lambda: FarmSettings(storage_url=url))

    monkeypatch.setattr(guards, "BUCKET_WAIT_S", 0.5)
    with_url("s3://no-such-bucket/jobs")
    [problem] = guards.storage_problems()
    assert problem.startswith("FARM_STORAGE_URL s3://no-such-bucket/jobs:") and "no bucket 'no-such-bucket'" in problem
    # A bucket the store makes while the worker waits (a cluster started at once) lets it start.
    monkeypatch.setattr(guards, "BUCKET_WAIT_S", 30.0)
    late = f"late-{uuid.uuid4().hex[:8]}"
    with_url(f"s3://{late}/jobs")
    maker = threading.Timer(1.0, lambda: s3.client().create_bucket(Bucket=late))
    maker.start()
    started = time.monotonic()
    assert guards.storage_problems() == []
    assert time.monotonic() - started >= 1.0
    maker.join()
    with_url(f"s3://{BUCKET}/{PREFIX}")
    assert guards.storage_problems() == []
    # Credentials the store does not know.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    monkeypatch.setattr(object_store, "_stores", {})
    [problem] = guards.storage_problems()
    assert "refused" in problem and "AWS credentials" in problem
    # A store that cannot be reached yet is no reason to refuse: attempts wait for it.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setattr(object_store, "_stores", {})
    assert guards.storage_problems() == []


def test_the_stores_outage_costs_no_job_and_a_download_names_the_store(s3, s3_worker, tmp_path: Path) -> None:
    done = toy_job("before the outage")
    done.wait(timeout=60)
    s3.stop()
    try:
        with pytest.raises(object_store.StoreUnavailable, match=s3.endpoint):
            done.download("words.txt", tmp_path)
        with running_gateway(gateway_config()) as base:  # the gateway says so too, and to come back
            away = httpx.get(f"{base}/v1/jobs/{done.id}/artifacts/words.txt", timeout=60,
                             headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        assert away.status_code == 503 and away.headers["retry-after"] == "5" and s3.endpoint in away.text
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
            # Several ranges: the whole file (HTTP allows it); a malformed one: 400, as for a file.
            several = client.get(url, headers={"Range": "bytes=0-1,4-5"})
            assert several.status_code == 200 and several.content == whole.content
            assert client.get(url, headers={"Range": "bytes=abc"}).status_code == 400
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


# ---------------------------------------------------------------------------------------------
# Live outputs: what a streaming job announces is in the store before a client hears of it (item 1)


def test_a_tts_jobs_chunks_are_in_the_store_as_they_are_announced(s3, s3_worker) -> None:
    from mediafarm.config.settings import get_settings

    text = " ".join(["The first line is spoken here.", "A second line follows it.", "And a third one ends it."])
    job = submit("tts", queue=QUEUE, text=text)
    envelope = job.wait(timeout=120)
    attempt = len(envelope["attempts"]) - 1
    partials = job.partials()
    assert len(partials) >= 2, partials
    stored = {a["name"]: ArtifactInfo.from_json(a) for a in envelope["artifacts"]}
    for partial in partials:
        name = partial["artifact"]
        assert partial["url"] == f"s3://{BUCKET}/{PREFIX}/{job.id}/{attempt}/{name}"
        # The producer's folder never held it: read from the object, by the announcement alone.
        assert not (get_settings().storage_dir / job.id).exists()
        data = job.partial_file(partial, len(envelope["attempts"]))
        assert data is not None and data[:4] == b"RIFF"
        # The same object the finished job lists, copied once and named the same.
        assert stored[name].url == partial["url"]
        assert hashlib.sha256(data).hexdigest() == stored[name].sha256
        head = s3.client().head_object(Bucket=BUCKET, Key=partial["url"].split("/", 3)[3])
        assert head["Metadata"]["sha256"] == stored[name].sha256 and head["Metadata"]["attempt"] == str(attempt)
    # A newer attempt's count: the announcement is no longer the job's.
    assert job.partial_file(partials[0], len(envelope["attempts"]) - 1) is None


def test_live_subtitle_segments_reach_a_gateway_that_shares_no_folder_with_the_worker(
    s3, s3_worker, tiny_en, tmp_path: Path
) -> None:
    websockets_sync = pytest.importorskip("websockets.sync.client", reason="pushes need the gateway extra")
    from tests.support.live_stream import real_time_pieces, track_pcm
    from tests.support.speech import PHRASES, RATE, make_track

    track = make_track(tmp_path / "push.wav", gaps=(1.0, 2.0, 1.5), phrases=PHRASES[:2])
    own = tmp_path / "gateway-own-storage"  # empty: the worker writes elsewhere
    own.mkdir()
    frames: list[dict[str, Any]] = []
    with running_gateway(gateway_config(storage_dir=own, live_queue=QUEUE)) as base:
        url = base.replace("http://", "ws://") + "/v1/live/subtitles"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with websockets_sync.connect(url, open_timeout=30, additional_headers=auth) as ws:
            ws.send(json.dumps({"type": "start", "sample_rate": RATE, "channels": 1, "chunk_seconds": 2,
                                "stall_timeout_s": 10, "language": "en"}))  # fmt: skip
            ready = json.loads(ws.recv(timeout=30))
            assert ready["type"] == "ready", ready
            for piece in real_time_pieces(track_pcm(track.path), RATE, 0.1):
                ws.send(piece)
            ws.send(json.dumps({"type": "end"}))
            while not frames or frames[-1]["type"] != "end":
                frames.append(json.loads(ws.recv(timeout=120)))
    assert frames[-1]["state"] == "SUCCESS", frames[-1]
    assert not [f for f in frames if f["type"] == "error"], frames
    segments = [f for f in frames if f["type"] == "segment"]
    assert segments and "lazy dog" in " ".join(f["vtt"] for f in segments).lower()
    assert not any(own.iterdir())
    job = JobHandle(ready["job"], "subtitle-live")
    partials = job.partials()
    announced = {p["segment"]: p["url"] for p in partials}
    for frame in segments:
        key = announced[frame["name"]].split("/", 3)[3]
        assert s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read().decode() == frame["vtt"]
    # The playlist, rewritten as the stream goes, has a copy of its own beside the attempt's files,
    # which lists every segment announced (`farm submit --live --out` follows it from there).
    attempt = len(job.attempts()) - 1
    [copy] = {p["playlist"] for p in partials}
    assert copy == f"s3://{BUCKET}/{PREFIX}/{job.id}/{attempt}/.live/chunks/playlist.m3u8"
    listed = s3.client().get_object(Bucket=BUCKET, Key=copy.split("/", 3)[3])["Body"].read().decode()
    assert listed.startswith("#EXTM3U") and all(name.split("/")[-1] in listed for name in announced)
    assert listed == job.read_artifact("chunks/playlist.m3u8").decode()


def test_farm_submit_live_follows_segments_and_playlist_from_the_store(s3, s3_worker, tiny_en, tmp_path) -> None:
    """`farm submit --live --out` on a host whose folder the worker never wrote: every segment and
    the growing playlist come from the store while the stream plays."""
    from tests.integration.test_subtitle_live_jobs import _started
    from tests.support.live_stream import free_port, playlist_while_playing, publish_udp
    from tests.support.speech import PHRASES, make_track

    track = make_track(tmp_path / "udp.wav", gaps=(1.0, 2.0, 2.0, 1.5), phrases=PHRASES[:3])
    port, out = free_port(), tmp_path / "out"
    farm = subprocess.Popen(
        [sys.executable, "-m", "mediafarm.workers.cli", "submit", "subtitle", f"udp://127.0.0.1:{port}", "--live",
         "--queue", QUEUE, "--out", str(out), "-p", "stall_timeout_s=4", "-p", "chunk_seconds=2"],
        env={**os.environ, "COLUMNS": "200", "FARM_STORAGE_DIR": str(tmp_path / "host-storage")},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert farm.stdout is not None
    job_id = farm.stdout.readline().split(":")[0].strip()
    _started(JobHandle(job_id, "subtitle-live"))
    publisher = publish_udp(track.path, port)
    playlist = playlist_while_playing(out, publisher)
    assert publisher.wait(40) == 0
    stdout, _ = farm.communicate(timeout=60)
    assert farm.returncode == 0, stdout
    assert playlist.read_text().rstrip().endswith("#EXT-X-ENDLIST") and (out / "subtitles.vtt").exists()
    assert not (tmp_path / "host-storage").exists()


# ---------------------------------------------------------------------------------------------
# Uploads: the media in the store, read by a worker that shares no folder with the gateway (item 1)


def test_uploads_live_in_the_store_for_every_gateway_and_a_worker_with_no_shared_folder_reads_them(
    s3, s3_worker, speech_track, tmp_path: Path
) -> None:
    from mediafarm.gateway.common.intake import prepare
    from mediafarm.tasks import registry
    from mediafarm.tasks.app import app
    from mediafarm.tasks.wire import keys
    from mediafarm.tasks.wire.upload_objects import UploadObjects, uploads_place
    from mediafarm.tasks.wire.upload_store import UploadStore
    from mediafarm.workers.retention import expired_upload_objects, remove

    data = speech_track.path.read_bytes()
    url = f"s3://{BUCKET}/{PREFIX}"
    place, store = uploads_place(url), object_store.store_at()

    def stored() -> list[str]:
        return [key for key, _, _ in store.objects(BUCKET, f"{PREFIX}/.gateway-uploads/")]

    def gateway(name: str):  # each with an uploads folder of its own: they share only Redis and the store
        return running_gateway(gateway_config(storage_url=url, uploads_dir=tmp_path / name, upload_max_count=2,
                                              upload_max_bytes=len(data)))  # fmt: skip

    def client(base: str) -> httpx.Client:
        return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)

    with gateway("a") as a, gateway("b") as b, client(a) as on_a, client(b) as on_b:
        sent = on_a.post("/v1/uploads", params={"filename": "talk.wav"}, content=data,
                         headers={"content-type": "audio/wav"})  # fmt: skip
        assert sent.status_code == 201, sent.text
        upload = sent.json()
        assert "url" not in upload and "path" not in upload  # where the farm keeps it is its own business
        # Whole in the store, create-only with its sha256, and its record beside it; nothing left on A.
        [media] = [k for k in stored() if k.endswith("/media.wav")]
        assert f"/{upload['id']}/" in media and sorted(k.rsplit("/", 1)[1] for k in stored()) == ["media.wav",
                                                                                                   "meta.json"]
        head = s3.client().head_object(Bucket=BUCKET, Key=media)
        assert head["Metadata"]["sha256"] == upload["sha256"] == hashlib.sha256(data).hexdigest()
        assert head["ContentLength"] == len(data) and not [p for p in (tmp_path / "a").rglob("*") if p.is_file()]
        # Gateway B knows it, and counts it: the token's bound (2) holds across gateways.
        assert on_b.get(f"/v1/uploads/{upload['id']}").json() == upload
        second = on_b.post("/v1/uploads", params={"filename": "b.wav"}, content=data[:50_000],
                           headers={"content-type": "audio/wav"})  # fmt: skip
        assert second.status_code == 201, second.text
        third = on_a.post("/v1/uploads", params={"filename": "c.wav"}, content=data[:50_000],
                          headers={"content-type": "audio/wav"})  # fmt: skip
        assert third.status_code == 429, third.text
        # DELETE on A takes what B received.
        assert on_a.delete(f"/v1/uploads/{second.json()['id']}").status_code == 204
        assert not [k for k in stored() if second.json()["id"] in k]
        # By its URL, however spelt, an upload is refused: only its owner's upload:<id> names one.
        folder_key = media.replace(".gateway-uploads", "%2Egateway-uploads")
        for spelt in (f"s3://{BUCKET}/{media}", f"S3://{BUCKET}/{media}", f"s3://{BUCKET.upper()}/{media}",
                      f"s3://{BUCKET}:/{media}", f"s3://{BUCKET}/{folder_key}", f"s3://{BUCKET}//{media}"):  # fmt: skip
            refused = on_b.post("/v1/jobs/vad", json={"media": spelt})
            assert refused.status_code == 422 and "upload:<id>" in refused.text, (spelt, refused.text)
    # A job naming it is sent with the object's URL (the gateway's own check, called here: over HTTP
    # the job would go to the vad family's queue, not this test's worker), and a worker that shares
    # no folder with either gateway reads it there.
    uploads = UploadStore(tmp_path / "c", len(data), 2, UploadObjects(store, place))
    owner = media.split("/")[-3]
    intake = prepare(registry.load()["vad"], {"media": upload["ref"]}, owner, uploads, ())
    assert intake.fields["media"] == f"s3://{BUCKET}/{media}"
    job = submit("vad", queue=QUEUE, **intake.fields)
    uploads.attach(intake.uploads[0], job.id)
    by_upload = job.wait(timeout=120)
    by_path = submit("vad", queue=QUEUE, media=str(speech_track.path)).wait(timeout=120)
    assert by_upload["output"]["spans"] == by_path["output"]["spans"] and by_upload["output"]["spans"]
    # `farm gc`, from the store alone: an upload is kept while its job's result is, and goes after;
    # one whose receiving never finished goes once the grace has passed.
    folder = f"s3://{BUCKET}/{media.rsplit('/', 1)[0]}"
    unfinished = f"{PREFIX}/.gateway-uploads/{owner}/{uuid.uuid4().hex}/.receiving"
    s3.client().put_object(Bucket=BUCKET, Key=unfinished, Body=b"")

    def removals() -> dict[str, str]:
        return {str(r.path): r.reason for r in expired_upload_objects(place, store, app.backend, ttl=3600, grace=0)}

    assert removals() == {f"s3://{BUCKET}/{unfinished.rsplit('/', 1)[0]}": "an upload that never finished"}
    app.backend.client.delete(app.backend.get_key_for_task(job.id), keys.history(job.id), keys.submitted(job.id))
    found = removals()
    assert found[folder] == "upload whose jobs' results expired" and len(found) == 2
    for removal in expired_upload_objects(place, store, app.backend, ttl=3600, grace=0):
        remove(removal)
    assert stored() == []


# ---------------------------------------------------------------------------------------------
# A job that moves hosts resumes there (item 5)

RESUME_QUEUE = "object-store-resume"


def stored_manifest(s3: SeaweedS3, job_id: str) -> dict | None:
    from botocore.exceptions import ClientError

    try:
        raw = s3.client().get_object(Bucket=BUCKET, Key=f"{PREFIX}/{job_id}/.checkpoint/checkpoint.json")["Body"].read()
    except ClientError:
        return None
    return json.loads(raw)


def test_a_job_whose_whole_host_dies_resumes_on_another_host_from_the_stored_checkpoint(
    s3, start_worker, tiny_en, media_root, speech_track, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from mediafarm.workers.launch import stop_worker
    from tests.integration.test_vad_subtitle_resume import without_rungs
    from tests.support.chaos_suite import short_limits_config
    from tests.support.speech import write_long_track

    media = media_root / "object-store-talk.wav"
    duration = write_long_track(media, 150.0, speech_track)
    # Every limit under a short visibility timeout, so the dead host's job comes back in a minute.
    config = short_limits_config(tmp_path_factory.mktemp("limits") / "limits.toml", soft=40, hard=45)
    base_env = {**s3.env(), "FARM_STORAGE_URL": f"s3://{BUCKET}/{PREFIX}", "FARM_CONFIG_FILE": str(config),
                "FARM_VISIBILITY_TIMEOUT": "50", "FARM_RESTORE_INTERVAL": "1",
                "FARM_CHECKPOINT_INTERVAL": "0.2"}  # fmt: skip

    def host(name: str):
        own = tmp_path_factory.mktemp(f"host-{name}")
        env = {**base_env, "FARM_STORAGE_DIR": str(own)}
        return start_worker("cpu", concurrency=1, queues=[RESUME_QUEUE], env=env), own

    def job() -> JobHandle:
        return submit("subtitle", queue=RESUME_QUEUE, media=str(media), chunk_seconds=10, formats=["vtt", "srt"],
                      ladder="subtitle_resume")  # fmt: skip

    first, first_folder = host("a")
    second = None
    try:
        whole = job()
        whole_envelope = whole.wait(timeout=120)
        moved = job()
        deadline = time.monotonic() + 120
        while not ((kept := stored_manifest(s3, moved.id)) and kept["position"] >= 0.5 * duration):
            assert time.monotonic() < deadline, f"no stored checkpoint past half way: {moved.attempts()}"
            time.sleep(0.05)
        # The whole host goes: the worker and its children, then its disk.
        os.killpg(first.main_pid(), signal.SIGKILL)
        first.process.wait(10)
        shutil.rmtree(first_folder)
        second, second_folder = host("b")
        envelope = moved.wait(timeout=150)
        # A re-render on a host whose folder lacks the source's files reads them from the store:
        # the worker that finished the job kept no copy of what it put there.
        assert not (second_folder / moved.id).exists()
        render = submit("subtitle-render", queue=RESUME_QUEUE, source=moved.id, formats=["vtt"])
        rendered = render.wait(timeout=60)
    finally:
        if second is not None:
            stop_worker(second.process, timeout=20)

    lost, resumed = envelope["attempts"]
    assert (lost["outcome"], resumed["outcome"]) == ("worker_lost", "ok")
    assert (lost["worker"], resumed["worker"]) == (first.node, second.node)
    assert kept["position"] <= resumed["resumed_from"]["position"] < duration
    assert resumed["rung_index"] >= lost["rung_index"]
    # The cues are the unkilled run's, word for word and to the millisecond.
    names = sorted(a["name"] for a in envelope["artifacts"])
    assert names == sorted(a["name"] for a in whole_envelope["artifacts"])
    for name in names:
        got, want = moved.read_artifact(name), whole.read_artifact(name)
        if name == "subtitles.json":
            assert without_rungs(json.loads(got)) == without_rungs(json.loads(want))
        else:
            assert got == want, name
    assert rendered["output"]["files"] == {"vtt": "subtitles.vtt"}
    assert render.read_artifact("subtitles.vtt") == moved.read_artifact("subtitles.vtt")
    # The job ended: its stored checkpoint is gone.
    assert stored_manifest(s3, moved.id) is None
