"""The gateway's followers are woken by the job's bell, not by looking (``tasks.producer.bells``):
a gateway whose looks are a minute apart still streams every event, chunk and end as it is made.
Were a follower to look instead of being woken, each of these would wait out its minute."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from tests.gateway.conftest import TOKEN, gateway_config, running_gateway
from tests.gateway.test_events import stream
from tests.gateway.test_openai import LONG, joe_voice  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration

LOOK_S = 60.0  # no look within a test: only a push can move a follower


@pytest.fixture(scope="module")
def pushed_url() -> Iterator[str]:
    config = gateway_config(poll_interval=LOOK_S, speech_poll=LOOK_S, room_poll=LOOK_S)
    with running_gateway(config) as url:
        yield url


@pytest.fixture()
def pushed(pushed_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=pushed_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http:
        yield http


def test_events_arrive_as_the_job_makes_them_with_no_look(cpu_worker, pushed) -> None:
    words = [f"w{i}" for i in range(8)]
    job_id = pushed.post("/v1/jobs/toy", json={"text": " ".join(words), "word_pause": 0.2}).json()["id"]
    started = time.monotonic()
    events = stream(pushed, job_id).events
    took = time.monotonic() - started
    partials = [e.json()["output"]["word"] for e in events if e.event == "partial"]
    assert partials == [w.upper() for w in words] and events[-1].event == "end"
    assert events[-1].json()["state"] == "SUCCESS"
    assert took < LOOK_S / 4, f"the stream took {took:.1f} s: a follower waited for a look"


def test_speech_streams_its_chunks_as_they_are_made_with_no_look(cpu_worker, joe_voice, pushed_url) -> None:  # noqa: F811
    with openai.OpenAI(base_url=pushed_url + "/v1", api_key=TOKEN, max_retries=0, timeout=120) as oai:
        started = time.monotonic()
        with oai.audio.speech.with_streaming_response.create(
            model="piper", voice="default", input=LONG, response_format="pcm"
        ) as response:
            pieces = response.iter_bytes()
            first = next(pieces)
            first_at = time.monotonic() - started
            body = first + b"".join(pieces)
        took = time.monotonic() - started
    assert first and len(body) % 2 == 0 and np.abs(np.frombuffer(body, dtype="<i2")).max() > 1000
    assert first_at < took and took < LOOK_S / 4, f"first byte {first_at:.1f} s, whole {took:.1f} s"
