"""A job of every family the CPU pool consumes, through the cluster's gateway (the official ``openai``
client for speech and transcription, ``POST /v1/jobs/<family>`` for the rest) and by ``farm submit``
from the host against the published broker; each artifact fetched over HTTP equals its sha256."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import av
import httpx
import openai
import pytest

from mediafarm.workers.cli import _sample
from tests.cluster.conftest import Cluster, artifacts_match, wait_job
from tests.support.camera import make_numbered

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> httpx.Client:
    with cluster.client() as c:
        yield c


@pytest.fixture(scope="module")
def speech(cluster: Cluster) -> str:
    """The bundled espeak-ng clip in ./media, as the containers see it."""
    shutil.copy(_sample(), cluster.media / "speech.ogg")
    return f"{cluster.media_in_containers}/speech.ogg"


@pytest.fixture(scope="module")
def video(cluster: Cluster) -> str:
    make_numbered(cluster.media / "camera.mp4", seconds=6, fps=10, audio=True)
    return f"{cluster.media_in_containers}/camera.mp4"


def succeeded(client: httpx.Client, answer: httpx.Response, timeout: float = 300) -> dict:
    assert answer.status_code == 202, answer.text
    view = wait_job(client, answer.json()["id"], timeout)
    assert view["state"] == "SUCCESS", json.dumps(view, indent=1)[-3000:]
    return view


def test_vad_runs_silero_without_torch(client: httpx.Client, speech: str) -> None:
    view = succeeded(client, client.post("/v1/jobs/vad", json={"media": speech}))
    assert view["result"]["variant"] == "silero-onnx", view["attempts"]
    assert "onnx" in view["result"]["output"]["model"]
    assert len(view["result"]["output"]["spans"]) == 3  # the clip's three sentences
    artifacts_match(client, view)


def test_transcription_through_the_openai_client(cluster: Cluster, client: httpx.Client) -> None:
    with openai.OpenAI(base_url=cluster.urls["gateway"] + "/v1", api_key=cluster.token, max_retries=0,
                       timeout=300) as oai:  # fmt: skip
        models = {m.id for m in oai.models.list()}
        assert "whisper-1" in models and "tts-1" in models, models
        with open(_sample(), "rb") as audio:
            raw = oai.audio.transcriptions.with_raw_response.create(model="whisper-1", file=audio,
                                                                    response_format="text")  # fmt: skip
    text = raw.parse()
    # The real tiny.en (placed in ./models by the session) hears the clip's espeak-ng sentences.
    assert raw.headers["x-farm-rung"] == "whisper-tiny", raw.headers
    assert isinstance(text, str) and len(text.split()) >= 6, text


def test_speech_through_the_openai_client(cluster: Cluster) -> None:
    with openai.OpenAI(base_url=cluster.urls["gateway"] + "/v1", api_key=cluster.token, max_retries=0,
                       timeout=300) as oai:  # fmt: skip
        speech = oai.audio.speech.create(model="tts-1", voice="default", input="Hello from the cluster.",
                                         response_format="wav")  # fmt: skip
    # Piper (its voice placed in ./models by the session) on onnxruntime: no torch in the CPU image.
    assert speech.response.headers["x-farm-rung"] == "piper", speech.response.headers
    with av.open(io.BytesIO(speech.content)) as container:
        stream = container.streams.audio[0]
        seconds = sum(f.samples for f in container.decode(stream)) / stream.rate
    assert seconds > 0.5, seconds


def test_subtitle_then_render_and_dialogue(client: httpx.Client, speech: str) -> None:
    subtitle = succeeded(client, client.post("/v1/jobs/subtitle", json={"media": speech, "formats": ["srt", "vtt"]}))
    assert {"srt", "vtt"} <= {Path(n).suffix.lstrip(".") for n in artifacts_match(client, subtitle)}
    render = succeeded(client, client.post("/v1/jobs/subtitle-render",
                                           json={"source": subtitle["id"], "formats": ["vtt"]}))  # fmt: skip
    assert artifacts_match(client, render)
    script = {"lines": [{"speaker": "default", "text": "Hello."}, {"speaker": "default", "text": "Hello again."}]}
    dialogue = succeeded(client, client.post("/v1/jobs/dialogue", json={"script": script, "pause": 0.2}))
    assert artifacts_match(client, dialogue)


def test_yolo_and_camfilter_on_the_cpu_rungs(client: httpx.Client, video: str) -> None:
    yolo = succeeded(client, client.post("/v1/jobs/yolo", json={"media": video}))
    # No torch in the CPU image: YOLO's detector rungs are the GPU image's; motion runs here.
    assert yolo["result"]["variant"] == "motion", yolo["attempts"]
    artifacts_match(client, yolo)
    camfilter = succeeded(client, client.post("/v1/jobs/camfilter", json={"media": video}))
    artifacts_match(client, camfilter)


def test_farm_submit_from_the_host_against_the_published_broker(cluster: Cluster, speech: str, tmp_path: Path) -> None:
    broker = cluster.broker  # redis://127.0.0.1:<port>/0
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env |= {"FARM_BROKER_URL": broker, "FARM_RESULT_BACKEND": broker.rsplit("/", 1)[0] + "/1"}
    done = subprocess.run([sys.executable, "-m", "mediafarm.workers.cli", "submit", "vad", speech, "--wait", "--json"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    envelope = json.loads(done.stdout)
    assert envelope["variant"] == "silero-onnx" and len(envelope["output"]["spans"]) == 3, envelope


def test_the_host_reads_a_jobs_files_from_the_published_store_with_no_shared_folder(cluster: Cluster,
                                                                                   tmp_path: Path) -> None:  # fmt: skip
    """No container shares its storage folder (test_services): a producer on the host gets a TTS
    job's audio through the broker and the store alone, each file checked against its sha256."""
    broker = cluster.broker
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FARM_", "AWS_"))}
    env |= {"FARM_BROKER_URL": broker, "FARM_RESULT_BACKEND": broker.rsplit("/", 1)[0] + "/1",
            "FARM_STORAGE_DIR": str(tmp_path / "host-storage"), "AWS_ENDPOINT_URL": cluster.urls["objects"],
            "AWS_ACCESS_KEY_ID": "farm", "AWS_SECRET_ACCESS_KEY": "farm-local-secret",
            "AWS_DEFAULT_REGION": "us-east-1"}  # the Compose file's dev defaults  # fmt: skip
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "mediafarm.workers.cli", "submit", "tts", "Hello from the store.",
                           "--wait", "--json", "--out", str(out)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    envelope = json.loads(done.stdout)
    artifacts = envelope["artifacts"]
    assert artifacts and not (tmp_path / "host-storage").exists()
    for artifact in artifacts:
        assert artifact["url"].startswith(f"s3://farm/jobs/{envelope['job_id']}/"), artifact
        saved = out / artifact["name"]
        assert hashlib.sha256(saved.read_bytes()).hexdigest() == artifact["sha256"], artifact["name"]
