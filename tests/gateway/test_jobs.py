"""Jobs over HTTP against a real gateway, Redis and prefork worker: submit, follow, fetch, cancel."""

from __future__ import annotations

import hashlib
import time
import uuid
from typing import Any

import httpx
import pytest

from mediafarm import register_speaker, remove_speaker, submit
from mediafarm.tasks.app import app
from mediafarm.tasks.wire import keys

pytestmark = pytest.mark.integration


def wait_ended(client: httpx.Client, location: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(location).json()
        if job["state"] in ("SUCCESS", "FAILURE", "REVOKED") and all(a["outcome"] for a in job["attempts"]):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.05)


def test_a_job_is_submitted_followed_and_its_artifact_fetched_with_range_and_etag(cpu_worker, client) -> None:
    sent = client.post("/v1/jobs/toy", json={"text": "one two three"})
    assert sent.status_code == 202, sent.text
    job_id = sent.json()["id"]
    assert sent.headers["location"] == f"/v1/jobs/{job_id}" and sent.json()["family"] == "toy"
    job = wait_ended(client, sent.headers["location"])
    assert job["state"] == "SUCCESS" and job["failure"] is None
    assert job["result"]["output"] == {"words": ["ONE", "TWO", "THREE"], "engine": "stream"}
    assert [p["word"] for p in job["partials"]] == ["ONE", "TWO", "THREE"]
    [artifact] = job["result"]["artifacts"]
    url = job["links"]["artifacts"]["words.txt"]
    whole = client.get(url)
    assert whole.status_code == 200 and whole.content == b"ONE\nTWO\nTHREE\n"
    assert whole.headers["etag"] == f'"{hashlib.sha256(whole.content).hexdigest()}"' == f'"{artifact["sha256"]}"'
    assert whole.headers["accept-ranges"] == "bytes" and whole.headers["content-type"].startswith("text/plain")
    # A client that has it already gets 304 and no body; another version of it does not match.
    assert client.get(url, headers={"If-None-Match": whole.headers["etag"]}).status_code == 304
    assert client.get(url, headers={"If-None-Match": '"0000"'}).status_code == 200
    part = client.get(url, headers={"Range": "bytes=4-7"})
    assert part.status_code == 206 and part.content == b"TWO\n"
    assert part.headers["content-range"] == f"bytes 4-7/{len(whole.content)}"
    tail = client.get(url, headers={"Range": "bytes=-6"})
    assert tail.status_code == 206 and tail.content == b"THREE\n"
    assert client.get(url, headers={"Range": "bytes=500-"}).status_code == 416
    # If-Range with the current ETag honours the range; with an old one the whole file comes.
    assert client.get(url, headers={"Range": "bytes=0-2", "If-Range": whole.headers["etag"]}).content == b"ONE"
    assert client.get(url, headers={"Range": "bytes=0-2", "If-Range": '"old"'}).status_code == 200
    missing = client.get(f"/v1/jobs/{job_id}/artifacts/nope.txt")
    assert missing.status_code == 404 and "no artifact 'nope.txt'" in missing.json()["detail"]


def test_a_job_through_the_gateway_is_the_same_kind_of_thing_as_one_sent_with_submit(cpu_worker, client) -> None:
    # A downgrade, so the history has more than one attempt to compare.
    sent = client.post("/v1/jobs/toy", json={"text": "alpha beta gamma delta", "fail_after": 2})
    direct = submit("toy", text="alpha beta gamma delta", fail_after=2).wait(timeout=60)
    through = wait_ended(client, sent.headers["location"])["result"]
    assert through.keys() == direct.keys()
    # Each job's own: its id, its attempts' times, its files' places, its trace's timings.
    own = ("job_id", "attempts", "artifacts", "trace")
    assert {k: v for k, v in through.items() if k not in own} == {k: v for k, v in direct.items() if k not in own}
    assert [s for s, _, _ in through["trace"]["steps"]] == [s for s, _, _ in direct["trace"]["steps"]]
    assert (
        [(a["rung_index"], a["rung"], a["outcome"]) for a in through["attempts"]]
        == [(a["rung_index"], a["rung"], a["outcome"]) for a in direct["attempts"]]
        == [(0, "streaming", "oom"), (1, "plain", "ok")]
    )
    assert [a.keys() for a in through["attempts"]] == [a.keys() for a in direct["attempts"]]
    assert [(a["name"], a["size"], a["sha256"]) for a in through["artifacts"]] == [
        (a["name"], a["size"], a["sha256"]) for a in direct["artifacts"]
    ]
    # The handle a producer makes for the gateway's job reads the same envelope.
    from mediafarm import handle

    assert handle(through["job_id"]).wait(timeout=5) == through


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({}, "toy request: text: Field required"),
        ({"text": ""}, "toy request: text: String should have at least 1 character"),
        ({"text": "a b", "fail_after": "many"}, "toy request: fail_after: Input should be a valid integer"),
        ({"text": "a b", "colour": "red"}, "toy request: colour: Extra inputs are not permitted"),
        (["a", "b"], "toy request: the body must be a JSON object"),
    ],
)
def test_a_bad_body_is_422_naming_the_field(client, body: Any, named: str) -> None:
    answer = client.post("/v1/jobs/toy", json=body)
    assert answer.status_code == 422 and named in answer.json()["detail"], answer.text


def test_a_body_that_is_not_json_or_too_large_is_refused(client) -> None:
    broken = client.post("/v1/jobs/toy", content=b"{not json", headers={"content-type": "application/json"})
    assert broken.status_code == 422 and "not JSON" in broken.json()["detail"]
    huge = client.post("/v1/jobs/toy", json={"text": "x" * (1 << 20)})
    assert huge.status_code == 413


def test_a_field_that_takes_a_file_path_in_python_takes_its_json_value_over_http(client, media_root) -> None:
    # In Python the dialogue's script may be a file the producer reads; the gateway reads no file for a client.
    script = media_root / "gateway-script.json"
    script.write_text('{"lines": [{"speaker": "default", "text": "Hi."}]}')
    answer = client.post("/v1/jobs/dialogue", json={"script": str(script)})
    assert answer.status_code == 422
    assert "dialogue request: script: over HTTP this field is given as its JSON value" in answer.json()["detail"]


def test_unknown_families_jobs_and_ids_are_404(client) -> None:
    assert client.post("/v1/jobs/no-such-family", json={}).status_code == 404
    assert "unknown job family 'no-such-family'" in client.post("/v1/jobs/no-such-family", json={}).json()["detail"]
    for path in (f"/v1/jobs/{uuid.uuid4()}", f"/v1/jobs/{uuid.uuid4()}/events", f"/v1/jobs/{uuid.uuid4()}/artifacts/a"):
        answer = client.get(path)
        assert answer.status_code == 404 and "no job" in answer.json()["detail"], path
    assert client.delete(f"/v1/jobs/{uuid.uuid4()}").status_code == 404


def test_an_idempotency_key_is_the_job_id_and_the_same_key_twice_is_the_same_job(cpu_worker, client) -> None:
    key = f"order-{uuid.uuid4().hex[:12]}"
    first = client.post("/v1/jobs/toy", json={"text": "same job"}, headers={"Idempotency-Key": key})
    again = client.post("/v1/jobs/toy", json={"text": "same job"}, headers={"Idempotency-Key": key})
    assert first.status_code == again.status_code == 202 and first.json()["id"] == again.json()["id"] == key
    job = wait_ended(client, first.headers["location"])
    assert len(job["attempts"]) == 1  # sent once
    other = client.post("/v1/jobs/toy", json={"text": "another job"}, headers={"Idempotency-Key": key})
    assert other.status_code == 409 and "already submitted" in other.json()["detail"]
    bad = client.post("/v1/jobs/toy", json={"text": "x"}, headers={"Idempotency-Key": "../etc"})
    assert bad.status_code == 422 and "Idempotency-Key" in bad.json()["detail"]


def test_delete_cancels_a_running_job_and_it_ends_cancelled(cpu_worker, client) -> None:
    sent = client.post("/v1/jobs/toy", json={"text": " ".join(["word"] * 40), "word_pause": 0.2})
    location = sent.headers["location"]
    deadline = time.monotonic() + 30
    while not client.get(location).json()["partials"]:  # its engine is running
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cancel = client.delete(location)
    assert cancel.status_code == 202 and cancel.json()["cancel"] == "requested"
    job = wait_ended(client, location, timeout=30)
    assert job["state"] == "REVOKED" and job["failure"]["kind"] == "cancelled", job
    assert [a["outcome"] for a in job["attempts"]] == ["cancelled"]
    assert len(job["partials"]) < 40


def test_a_pipeline_family_is_submitted_and_followed_like_any_job(cpu_worker, client) -> None:
    speaker = f"gw-{uuid.uuid4().hex[:6]}"
    register_speaker(speaker)
    try:
        script = {"lines": [{"speaker": speaker, "text": "Hello there."}, {"speaker": speaker, "text": "Bye now."}]}
        sent = client.post("/v1/jobs/dialogue", json={"script": script, "pause": 0.2})
        assert sent.status_code == 202 and sent.json()["pipeline"] is True, sent.text
        job = wait_ended(client, sent.headers["location"], timeout=90)
        assert job["state"] == "SUCCESS", job
        assert job["stages"]["parts"] == {"total": 2, "done": 2, "failed": 0}
        assert len(job["result"]["output"]["lines"]) == 2
        track = next(name for name in job["links"]["artifacts"] if name.endswith(".wav"))
        audio = client.get(job["links"]["artifacts"][track])
        assert audio.status_code == 200 and audio.content[:4] == b"RIFF"
        unknown = client.post("/v1/jobs/dialogue", json={"script": {"lines": [{"speaker": "nobody-x", "text": "Hi."}]}})
        assert unknown.status_code == 422 and "nobody-x" in unknown.json()["detail"]
    finally:
        remove_speaker(speaker)


def test_the_openapi_document_holds_each_familys_own_request_model(client) -> None:
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/v1/jobs/toy"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ToyRequest"}
    toy = schema["components"]["schemas"]["ToyRequest"]
    assert toy["required"] == ["text"] and toy["additionalProperties"] is False
    assert {"/v1/jobs/{job_id}/events", "/v1/uploads", "/v1/jobs/vad"} <= schema["paths"].keys()
    assert client.get("/docs").status_code == 200


def test_a_job_state_is_read_from_the_farm_not_kept_by_the_gateway(cpu_worker, client) -> None:
    # A job sent with submit() and an id is followed through the gateway like its own.
    job = submit("toy", text="from python", job_id=f"py-{uuid.uuid4().hex[:8]}")
    job.wait(timeout=60)
    seen = client.get(f"/v1/jobs/{job.id}").json()
    assert seen["state"] == "SUCCESS" and seen["family"] == "toy"
    assert app.backend.client.exists(keys.submitted(job.id))
