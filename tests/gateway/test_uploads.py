"""Uploads over HTTP: streamed in under the size limit, named by a job as ``upload:<id>``, confined to
their owner, bounded in number; media paths outside the roots refused like the worker refuses them."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mediafarm.config.settings import get_settings
from tests.conftest import REPO
from tests.gateway.conftest import OTHER_TOKEN, TOKEN, UPLOAD_MAX_BYTES, gateway_config, running_gateway
from tests.gateway.test_jobs import wait_ended

pytestmark = pytest.mark.integration
SAMPLE = REPO / "tasks" / "media" / "samples" / "speech.ogg"


def test_an_uploaded_file_is_named_by_a_job_and_the_worker_reads_it(cpu_worker, client) -> None:
    data = SAMPLE.read_bytes()
    sent = client.post("/v1/uploads", params={"filename": "speech.ogg"}, content=data,
                       headers={"content-type": "audio/ogg"})  # fmt: skip
    assert sent.status_code == 201, sent.text
    upload = sent.json()
    assert upload["size"] == len(data) and upload["sha256"] == hashlib.sha256(data).hexdigest()
    assert upload["ref"] == f"upload:{upload['id']}" and upload["media_type"] == "audio/ogg"
    assert sent.headers["location"] == f"/v1/uploads/{upload['id']}" and "path" not in upload
    assert client.get(sent.headers["location"]).json() == upload
    job = client.post("/v1/jobs/vad", json={"media": upload["ref"]})
    assert job.status_code == 202, job.text
    done = wait_ended(client, job.headers["location"], timeout=90)
    assert done["state"] == "SUCCESS", done
    assert len(done["result"]["output"]["spans"]) == 3  # the sample's three sentences
    # The job is recorded beside the upload, so `farm gc` keeps the file as long as its result.
    stored = get_settings().uploads_folder
    assert [p.name for p in stored.glob(f"*/{upload['id']}/jobs/*")] == [done["id"]]


def test_a_multipart_upload_is_streamed_the_same_way(client) -> None:
    data = b"RIFF" + bytes(range(256)) * 100
    sent = client.post("/v1/uploads", files={"file": ("clip.wav", data, "audio/wav")}, data={"note": "x"})
    assert sent.status_code == 201, sent.text
    upload = sent.json()
    assert (upload["filename"], upload["size"], upload["media_type"]) == ("clip.wav", len(data), "audio/wav")
    on_disk = next(get_settings().uploads_folder.glob(f"*/{upload['id']}/media.wav"))
    assert on_disk.read_bytes() == data
    wrong_field = client.post("/v1/uploads", files={"media": ("clip.wav", data, "audio/wav")})
    assert wrong_field.status_code == 422 and "'file'" in wrong_field.json()["detail"]
    no_file = client.post("/v1/uploads", files={"file": (None, "just text")})
    assert no_file.status_code == 422 and "holds no file" in no_file.json()["detail"]


def test_an_upload_over_the_size_limit_is_413_and_leaves_nothing(client) -> None:
    before = set(get_settings().uploads_folder.rglob("*"))
    declared = client.post("/v1/uploads", content=b"x" * (UPLOAD_MAX_BYTES + 1))
    assert declared.status_code == 413 and "FARM_UPLOAD_MAX_MB" in declared.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams in
        for _ in range(UPLOAD_MAX_BYTES // 10_000 + 5):
            yield b"y" * 10_000

    streamed = client.post("/v1/uploads", content=chunks())
    assert streamed.status_code == 413
    multipart = client.post("/v1/uploads", files={"file": ("big.bin", b"z" * (UPLOAD_MAX_BYTES + 1))})
    assert multipart.status_code == 413
    assert set(get_settings().uploads_folder.rglob("*")) == before
    empty = client.post("/v1/uploads", content=b"")
    assert empty.status_code == 422 and "empty" in empty.json()["detail"]


def test_a_token_holds_a_bounded_number_of_uploads_and_can_free_them(tmp_path: Path) -> None:
    # A gateway of its own: a folder of its own and a bound of 2, apart from the other tests' uploads.
    config = gateway_config(uploads_dir=tmp_path / "uploads", upload_max_count=2)
    with running_gateway(config) as url:
        mine = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"})
        other = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {OTHER_TOKEN}"})
        made = [mine.post("/v1/uploads", content=b"data").json()["id"] for _ in range(2)]
        refused = mine.post("/v1/uploads", content=b"one too many")
        assert refused.status_code == 429 and "FARM_UPLOAD_MAX_COUNT" in refused.json()["detail"]
        assert other.post("/v1/uploads", content=b"another token's own").status_code == 201
        assert mine.delete(f"/v1/uploads/{made[0]}").status_code == 204
        assert mine.get(f"/v1/uploads/{made[0]}").status_code == 404
        assert mine.post("/v1/uploads", content=b"room again").status_code == 201
        mine.close()
        other.close()


def test_a_job_may_name_only_its_own_tokens_uploads_and_paths_inside_the_roots(client, gateway_url, media_root,
                                                                               tmp_path: Path) -> None:  # fmt: skip
    mine = client.post("/v1/uploads", content=b"mine").json()
    with httpx.Client(base_url=gateway_url, headers={"Authorization": f"Bearer {OTHER_TOKEN}"}) as other:
        assert other.get(f"/v1/uploads/{mine['id']}").status_code == 404
        theirs = other.post("/v1/jobs/vad", json={"media": mine["ref"]})
        assert theirs.status_code == 422 and "vad request: media: no upload" in theirs.json()["detail"]
    stored = next(get_settings().uploads_folder.glob(f"*/{mine['id']}/media*"))
    by_path = client.post("/v1/jobs/vad", json={"media": str(stored)})
    assert by_path.status_code == 422 and "name an upload as upload:<id>" in by_path.json()["detail"]
    bogus = client.post("/v1/jobs/vad", json={"media": "upload:../../etc/passwd"})
    assert bogus.status_code == 422 and "an upload id is 32 hex digits" in bogus.json()["detail"]
    outside = tmp_path / "outside.wav"
    outside.write_bytes(b"RIFF")
    refused = client.post("/v1/jobs/vad", json={"media": str(outside)})
    assert refused.status_code == 422 and "outside the media roots" in refused.json()["detail"]
    escaping = client.post("/v1/jobs/vad", json={"media": "../../etc/passwd"})
    assert escaping.status_code == 422 and "outside the media roots" in escaping.json()["detail"]
    missing = client.post("/v1/jobs/vad", json={"media": str(media_root / "nope.wav")})
    assert missing.status_code == 422 and "media file not found" in missing.json()["detail"]


def test_expired_uploads_go_with_their_jobs_results(cpu_worker, client) -> None:
    from mediafarm.tasks.app import app
    from mediafarm.workers.retention import expired_uploads

    upload = client.post("/v1/uploads", content=b"kept while its job is").json()
    job = client.post("/v1/jobs/vad", json={"media": upload["ref"]}, headers={"Idempotency-Key": f"gc-{upload['id']}"})
    assert job.status_code == 202
    # Not media: the worker rejects it; waited for, so no write of the worker's comes after ours below.
    assert wait_ended(client, job.headers["location"])["failure"]["kind"] == "rejected"
    unused = client.post("/v1/uploads", content=b"named by no job").json()
    folders = get_settings().uploads_folder
    later = time.time() + 7200

    def going(**when: float) -> set[str]:
        return {r.path.name for r in expired_uploads(folders, app.backend, ttl=86400, grace=3600, **when)}

    # The job is known (submitted, whatever its state): its upload stays; the unused one stays
    # until result_expires has passed since it was made.
    assert {upload["id"], unused["id"]}.isdisjoint(going(now=later))
    assert unused["id"] in going(now=time.time() + 86400 + 3600)
    from mediafarm.tasks.wire import keys

    app.backend.client.delete(keys.submitted(job.json()["id"]), keys.history(job.json()["id"]),
                              app.backend.get_key_for_task(job.json()["id"]))  # fmt: skip
    assert upload["id"] in going(now=later)
