"""OpenAI's routes (speech, transcriptions, models) with the official ``openai`` client as the real
client, over HTTP, against the real gateway, Redis and a prefork worker the session starts."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import av
import httpx
import numpy as np
import openai
import pytest

from mediafarm.config.settings import get_settings
from mediafarm.gateway.security import owner_of
from mediafarm.tasks.producer.handles import JobHandle
from mediafarm.tasks.wire import capability
from tests.gateway.conftest import TOKEN
from tests.integration.test_subtitle_jobs import wer, words_of
from tests.support.kills import kill_running, killing
from tests.support.piper_voice import link_joe_voice

pytestmark = pytest.mark.integration
# The first sentence is a chunk of its own (the first audio comes soon); the rest are 400-character chunks.
LONG = "Hello there. " + " ".join(
    f"Sentence number {i} goes on for a while, so that the chunk it falls in takes the engine some time to speak."
    for i in range(7)
)
SHORT = "Hello from the farm. This sentence comes second."


@pytest.fixture(scope="module")
def oai(gateway_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway_url + "/v1", api_key=TOKEN, max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def joe_voice() -> None:
    """The real Piper voice where the tts ladder's piper rung looks for it."""
    link_joe_voice(get_settings().models_dir)


def decoded_seconds(data: bytes) -> tuple[float, int]:
    """Seconds of audio in an encoded file, by decoding every frame (PyAV), and its rate."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return samples / stream.rate, stream.rate


def job_view(client: httpx.Client, job_id: str) -> dict:
    return client.get(f"/v1/jobs/{job_id}").json()


def test_speech_streams_its_first_chunk_before_the_job_has_finished(cpu_worker, joe_voice, oai, client) -> None:
    with oai.audio.speech.with_streaming_response.create(
        model="piper", voice="default", input=LONG, response_format="pcm"
    ) as response:
        job_id, rung = response.headers["x-farm-job"], response.headers["x-farm-rung"]
        rate = int(response.headers["x-farm-sample-rate"])
        pieces = response.iter_bytes()
        first = next(pieces)
        at_first_bytes = job_view(client, job_id)  # read when the first audio had arrived
        body = first + b"".join(pieces)
    done = job_view(client, job_id)
    assert rung == "piper" and done["state"] == "SUCCESS" and done["result"]["variant"] == "piper"
    chunks = done["result"]["output"]["chunks"]
    assert chunks >= 3
    # The order of events: the first audio was here while the job was still making later chunks.
    assert at_first_bytes["state"] != "SUCCESS" and len(at_first_bytes["partials"]) < chunks, at_first_bytes
    assert first and len(body) % 2 == 0
    samples = np.frombuffer(body, dtype="<i2")
    assert len(samples) / rate == pytest.approx(done["result"]["output"]["duration"], abs=0.01)
    assert np.abs(samples).max() > 1000  # speech, not silence


def test_a_rung_killed_before_its_first_chunk_leaves_no_trace_but_the_rung_header(cpu_worker, joe_voice, oai,
                                                                                   client) -> None:  # fmt: skip
    key = f"speech-{uuid.uuid4().hex}"
    with killing(key, {"piper"}) as killed:
        with oai.audio.speech.with_streaming_response.create(
            model="piper", voice="default", input=SHORT, response_format="pcm", extra_headers={"Idempotency-Key": key}
        ) as response:
            assert response.headers["x-farm-job"] == key and response.headers["x-farm-rung"] == "espeak"
            body = response.read()
    done = job_view(client, key)
    assert killed and [a["outcome"] for a in done["attempts"]] == ["killed", "ok"]
    assert len(body) / 2 / int(response.headers["x-farm-sample-rate"]) == pytest.approx(
        done["result"]["output"]["duration"], abs=0.001
    )
    # The same key again: the same job's audio from its start, spoken once.
    again = oai.audio.speech.create(model="piper", voice="default", input=SHORT, response_format="pcm",
                                    extra_headers={"Idempotency-Key": key})  # fmt: skip
    assert again.content == body and job_view(client, key)["attempts"] == done["attempts"]


def test_a_rung_killed_after_its_first_chunk_was_sent_ends_the_body_cut_short(cpu_worker, joe_voice, oai,
                                                                               client) -> None:  # fmt: skip
    with oai.audio.speech.with_streaming_response.create(
        model="piper", voice="default", input=LONG, response_format="wav"
    ) as response:
        job_id, pieces = response.headers["x-farm-job"], response.iter_bytes()
        assert next(pieces)[:4] == b"RIFF"
        kill_running(JobHandle(job_id, "tts"), "piper")
        # espeak-ng speaks the text again in another voice: it cannot follow piper's first chunk.
        # (The openai client's own HTTP library raises its RemoteProtocolError.)
        with pytest.raises(Exception, match="incomplete chunked read") as cut:
            for _ in pieces:
                pass
        assert type(cut.value).__name__ == "RemoteProtocolError"
    # The job itself goes on, and its whole audio is there, on the rung below.
    envelope = JobHandle(job_id, "tts").wait(timeout=120)
    assert envelope["variant"] == "espeak" and [a["outcome"] for a in envelope["attempts"]] == ["killed", "ok"]


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "pcm"])
def test_every_format_decodes_to_the_jobs_whole_audio(cpu_worker, oai, client, fmt: str) -> None:
    with oai.audio.speech.with_streaming_response.create(
        model="espeak", voice="default", input=SHORT, response_format=fmt, speed=1.2
    ) as response:
        assert response.headers["x-farm-rung"] == "espeak"
        job_id, rate = response.headers["x-farm-job"], int(response.headers["x-farm-sample-rate"])
        assert response.headers["transfer-encoding"] == "chunked" and "content-length" not in response.headers
        body = response.read()
    output = job_view(client, job_id)["result"]["output"]
    if fmt == "pcm":
        seconds = len(body) / 2 / rate
    else:
        seconds, decoded_rate = decoded_seconds(body)
        assert decoded_rate == (48000 if fmt == "opus" else rate)
    # mp3 and Opus pad their first and last frames: a few tens of milliseconds more.
    assert seconds == pytest.approx(output["duration"], abs=0.001 if fmt in ("wav", "pcm") else 0.12)
    if fmt == "wav":
        # The streamed samples are the job's own file's, sample for sample.
        assert body[:4] == b"RIFF" and body[40:44] == b"\xff\xff\xff\xff"  # size unknown while streaming
        whole = client.get(f"/v1/jobs/{job_id}/artifacts/{output['audio']}").content
        with av.open(io.BytesIO(whole)) as container:
            expected = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
        assert np.array_equal(np.frombuffer(body[44:], dtype="<i2"), expected)


def test_speech_errors_name_the_field_the_model_or_the_voice(cpu_worker, oai, gateway_url) -> None:
    # The client reads no body of a failed audio request: the kind of error is what it tells.
    with pytest.raises(openai.NotFoundError):
        oai.audio.speech.create(model="tts-1", voice="alloy", input="Hi.")
    with pytest.raises(openai.UnprocessableEntityError):
        oai.audio.speech.create(model="tts-1", voice="default", input="Hi.", response_format="aac")
    with httpx.Client(base_url=gateway_url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:

        def detail(status: int, **body: object) -> str:
            answer = http.post("/v1/audio/speech", json={"model": "tts-1", "voice": "default", "input": "Hi.", **body})
            assert answer.status_code == status, answer.text
            error = answer.json()["error"]  # OpenAI's shape, beside the gateway's own detail
            assert error["message"] == answer.json()["detail"] and error["type"] == "invalid_request_error"
            return error["message"]

        assert "voice 'alloy'" in detail(404, voice="alloy") and "farm speakers add" in detail(404, voice="alloy")
        assert "model 'gpt-4o-mini-tts'" in detail(404, model="gpt-4o-mini-tts")
        assert "tts-1, tts-1-hd" in detail(404, model="gpt-4o-mini-tts")
        assert "speech request: response_format" in detail(422, response_format="aac")
        assert "speech request: speed" in detail(422, speed=3.5)
        assert "speech request: input" in detail(422, input="")
        missing = http.post("/v1/audio/speech", json={"model": "tts-1", "voice": "default"})
        assert missing.status_code == 422 and "input: Field required" in missing.json()["detail"]
    with openai.OpenAI(base_url=gateway_url + "/v1", api_key="wrong", max_retries=0) as stranger:
        with pytest.raises(openai.AuthenticationError):
            stranger.audio.speech.create(model="tts-1", voice="default", input="Hi.")
        with pytest.raises(openai.AuthenticationError, match="not one this gateway accepts"):
            stranger.models.list()


@pytest.fixture(scope="module")
def talk(speech_track, tmp_path_factory) -> Path:
    """The espeak-ng track as Ogg Opus, as a client would upload it (smaller than the tests' upload limit)."""
    target = tmp_path_factory.mktemp("openai") / "talk.ogg"
    with av.open(str(speech_track.path)) as source, av.open(str(target), "w") as out:
        stream = out.add_stream("libopus", rate=48000, layout="mono")
        stream.bit_rate = 24000
        resampler = av.AudioResampler(format="flt", layout="mono", rate=48000)
        for frame in source.decode(audio=0):
            for resampled in resampler.resample(frame):
                resampled.pts = None
                out.mux(stream.encode(resampled))
        out.mux(stream.encode(None))
    return target


def truth() -> list[str]:
    from tests.support.speech import PHRASES

    return words_of(" ".join(PHRASES))


def cue_words(text: str) -> list[str]:
    """The words of an SRT or WebVTT file: its lines but the header, numbers and timings."""
    lines = [line for line in text.splitlines() if line.strip() and "-->" not in line and not line.strip().isdigit()]
    return words_of(" ".join(line for line in lines if line.strip() != "WEBVTT"))


@pytest.fixture(scope="module")
def talk_bound(tiny_en, talk) -> float:
    """The WER bound of the uploaded track, as the accuracy test sets one: what faster-whisper's own
    transcribe hears in it on the rung's model, beam and threads, plus 5 points, never above 0.20."""
    from types import SimpleNamespace

    from tests.integration.test_subtitle_accuracy import CLEAN_MAX_WER, CLEAN_OVER_BARE, bare_wer

    return min(bare_wer(tiny_en, SimpleNamespace(path=talk, words=truth())) + CLEAN_OVER_BARE, CLEAN_MAX_WER)


def sentences_heard(heard: list[str]) -> list[float]:
    """For each sentence of the track, the share of its words the transcript has, aligned in order."""
    import difflib

    from tests.support.speech import PHRASES

    reference, owner = [], []
    for k, phrase in enumerate(PHRASES[:4]):
        reference += words_of(phrase)
        owner += [k] * len(words_of(phrase))
    matched = [0] * 4
    for block in difflib.SequenceMatcher(a=reference, b=heard, autojunk=False).get_matching_blocks():
        for i in range(block.a, block.a + block.size):
            matched[owner[i]] += 1
    return [matched[k] / len(words_of(p)) for k, p in enumerate(PHRASES[:4])]


def first_cue_start(text: str) -> float:
    """The start of an SRT or WebVTT file's first cue, in seconds."""
    import re

    found = re.search(r"(\d+):(\d\d):(\d\d)[,.](\d{3}) -->", text)
    assert found, text
    h, m, sec, ms = (int(g) for g in found.groups())
    return h * 3600 + m * 60 + sec + ms / 1000


@pytest.mark.parametrize("fmt", ["json", "text", "srt", "vtt", "verbose_json"])
def test_transcriptions_are_close_to_the_truth_in_every_format(cpu_worker, tiny_en, speech_track, talk, talk_bound,
                                                               oai, fmt):  # fmt: skip
    extra = {"timestamp_granularities": ["word", "segment"]} if fmt == "verbose_json" else {}
    with talk.open("rb") as audio:
        answer = oai.audio.transcriptions.create(
            model="whisper-1" if fmt == "json" else "whisper-tiny", file=audio, response_format=fmt,
            language="en", prompt="Household sentences.", temperature=0.0, **extra,
        )  # fmt: skip
    onset = speech_track.truth[0][0]
    if fmt in ("text", "srt", "vtt"):
        assert isinstance(answer, str)
        heard = cue_words(answer) if fmt != "text" else words_of(answer)
        if fmt in ("srt", "vtt"):  # the first cue starts where the first sentence does
            assert abs(first_cue_start(answer) - onset) < 0.5, (onset, answer)
        if fmt == "vtt":
            assert answer.startswith("WEBVTT")
    else:
        heard = words_of(answer.text)
    # Every sentence is there (a lost one would keep the WER of four under 0.35), and the words are
    # as close to the truth as the bare library gets them.
    assert all(share >= 0.5 for share in sentences_heard(heard)), (sentences_heard(heard), heard)
    assert wer(truth(), heard) <= talk_bound, (talk_bound, heard)
    if fmt == "verbose_json":
        assert answer.language == "en" and answer.duration == pytest.approx(speech_track.duration, abs=0.05)
        segments, words = answer.segments, answer.words
        assert segments and words and len(words) >= len(truth()) - 4
        assert abs(segments[0].start - onset) < 0.5 and abs(words[0].start - onset) < 0.5, (onset, segments[0])
        starts = [w.start for w in words]
        assert starts == sorted(starts) and all(w.end >= w.start for w in words)
        # Each sentence's first word starts near its true onset (the track's known silences): by the
        # words, as the comment always said; a segment is Whisper's and may hold two sentences (seen
        # with the wheel's libespeak-ng speech: the last two, 3 s apart, in one).
        onsets = [start for start, _ in speech_track.truth]
        assert all(min(abs(w.start - onset) for w in words) < 0.5 for onset in onsets), (onsets, words)


def test_transcription_errors_name_the_field_or_the_model(cpu_worker, oai, gateway_url, talk) -> None:
    with talk.open("rb") as audio, pytest.raises(openai.NotFoundError, match="model 'gpt-4o-transcribe'"):
        oai.audio.transcriptions.create(model="gpt-4o-transcribe", file=audio)
    with talk.open("rb") as audio:
        with pytest.raises(openai.UnprocessableEntityError, match="transcription request: response_format"):
            oai.audio.transcriptions.create(model="whisper-1", file=audio, response_format="diarized_json")
    with openai.OpenAI(base_url=gateway_url + "/v1", api_key="wrong", max_retries=0) as stranger:
        with talk.open("rb") as audio, pytest.raises(openai.AuthenticationError):
            stranger.audio.transcriptions.create(model="whisper-1", file=audio)
    uploads = get_settings().uploads_folder / owner_of(TOKEN)
    held = sorted(uploads.iterdir()) if uploads.is_dir() else []
    with httpx.Client(base_url=gateway_url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        no_file = http.post("/v1/audio/transcriptions", data={"model": "whisper-1"}, files={"x": ("a.txt", b"a")})
        assert no_file.status_code == 422 and "'file'" in no_file.json()["detail"]
        not_audio = http.post("/v1/audio/transcriptions", data={"model": "whisper-1"},
                              files={"file": ("notes.wav", b"this is no audio at all" * 10)})  # fmt: skip
        assert not_audio.status_code == 422 and "ended FAILURE" in not_audio.json()["detail"], not_audio.text
    # Nothing of these requests is left in the uploads: the file a job read went when the job ended.
    assert sorted(uploads.iterdir()) == held


def test_models_lists_the_ladders_rungs_and_aliases_a_worker_takes(cpu_worker, joe_voice, tiny_en, oai) -> None:
    # The worker judges its rungs afresh at each beat: the voice and tiny.en linked show within one.
    wanted = {"tts", "tts-1", "tts-1-hd", "piper", "espeak", "subtitle", "whisper-1", "whisper-tiny"}
    deadline = time.monotonic() + 3 * capability.INTERVAL_S
    while not wanted <= (models := {m.id: m for m in oai.models.list()}).keys() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert wanted <= models.keys(), sorted(models)
    assert all(m.object == "model" and m.owned_by == "mediafarm" for m in models.values())
    farm = models["piper"].model_extra["farm"]
    assert (farm["family"], farm["rungs"]) == ("tts", ["piper", "espeak"]) and "cpu" in farm["pools"]["piper"]
    assert models["tts-1"].model_extra["farm"]["alias_of"] == "tts"
    # What no live worker can run is not listed: no models folder here has whisper-small's weights.
    assert "whisper-small" not in models and "whisper-small" in models["subtitle"].model_extra["farm"]["unavailable"]
