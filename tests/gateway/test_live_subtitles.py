"""Live subtitles of pushed audio (``WebSocket /v1/live/subtitles``) with a real WebSocket client
(``websockets``), a real gateway, Redis and worker, and espeak-ng speech at known times.

The pushed stream's clock is its own sample count, so a sentence's true onset in the track is its
cue time: the cues that come back are checked against it directly."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import webvtt

from mediafarm.config.settings import get_settings
from mediafarm.tasks.producer.handles import JobHandle
from tests.conftest import REPO
from tests.gateway.conftest import TOKEN, gateway_config, running_gateway
from tests.support.docs import code_blocks
from tests.support.live_stream import real_time_pieces, track_pcm
from tests.support.speech import PHRASES, RATE, make_track

websockets_sync = pytest.importorskip("websockets.sync.client", reason="pushes need the gateway extra's websockets")
ConnectionClosed = pytest.importorskip("websockets.exceptions").ConnectionClosed
pytestmark = pytest.mark.integration
BOUND_S = 0.112  # the subtitle story's perceptible offset
FRAME_S = 0.1  # what a live client sends at a time


@pytest.fixture(scope="module")
def track(tmp_path_factory):
    return make_track(tmp_path_factory.mktemp("push") / "push.wav", gaps=(1.0, 2.0, 2.5, 2.0, 2.0), phrases=PHRASES[:4])


@pytest.fixture()
def live_url(gateway_url: str) -> str:
    return gateway_url.replace("http://", "ws://") + "/v1/live/subtitles"


def connect(url: str, **options: Any) -> Any:
    options.setdefault("additional_headers", {"Authorization": f"Bearer {TOKEN}"})
    return websockets_sync.connect(url, open_timeout=30, **options)


def _push_in_real_time(ws: Any, pcm: bytes) -> float:
    """Send ``pcm`` (16 kHz mono) in FRAME_S pieces at the pace it plays; the time the last went out."""
    for piece in real_time_pieces(pcm, RATE, FRAME_S):
        ws.send(piece)
    return time.monotonic()


def _collect(ws: Any, frames: list[dict[str, Any]], done: threading.Event) -> None:
    try:
        for message in ws:
            frame = json.loads(message)
            frame["at"] = time.monotonic()
            frames.append(frame)
            if frame["type"] == "end":
                break
    finally:
        done.set()


def _seconds(stamp: str) -> float:
    """WebVTT's ``hh:mm:ss.ttt`` (webvtt-py's own ``start_in_seconds`` drops the milliseconds)."""
    hours, minutes, seconds = stamp.split(":")
    return round(int(hours) * 3600 + int(minutes) * 60 + float(seconds), 3)


def _cues_of(segments: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """The distinct cues of the segments' WebVTT (a cue spanning windows is in each)."""
    cues = set()
    for frame in segments:
        for cue in webvtt.from_buffer(io.StringIO(frame["vtt"])):
            cues.add((_seconds(cue.start), _seconds(cue.end), cue.text))
    return sorted(cues)


def test_pushed_audio_gets_its_cues_back_while_it_plays_on_its_own_clock(cpu_worker, tiny_en, live_url, track) -> None:
    frames: list[dict[str, Any]] = []
    done = threading.Event()
    with connect(live_url) as ws:
        ws.send(json.dumps({"type": "start", "sample_rate": RATE, "channels": 1, "chunk_seconds": 2,
                            "stall_timeout_s": 10, "language": "en"}))  # fmt: skip
        ready = json.loads(ws.recv(timeout=30))
        assert ready["type"] == "ready" and ready["stream"].startswith("push://"), ready
        threading.Thread(target=_collect, args=(ws, frames, done), daemon=True).start()
        pushed_at = _push_in_real_time(ws, track_pcm(track.path))
        ws.send(json.dumps({"type": "end"}))
        assert done.wait(120), f"no end frame: {frames}"
    segments = [f for f in frames if f["type"] == "segment"]
    end = frames[-1]
    assert end["type"] == "end" and end["state"] == "SUCCESS", end
    output = end["output"]
    # The client's end is the stream's end, told apart from a stall; nothing was lost on the way.
    assert output["end_reason"].startswith("ended"), output["end_reason"]
    assert output["timing"]["gaps"] == [] and output["timing"]["discontinuities"] == []
    # Segments came back while the audio was still being pushed, in order, each once.
    assert segments and segments[0]["at"] < pushed_at
    names = [f["name"] for f in segments]
    assert names == sorted(set(names)) and names[0] == "chunks/segment_00000.vtt"
    # One cue per sentence, each starting within 112 ms of its true onset on the pushed clock.
    cues = _cues_of(segments)
    assert len(cues) == len(track.truth), cues
    assert max(min(abs(c[0] - start) for c in cues) for start, _ in track.truth) <= BOUND_S, (cues, track.truth)
    assert "lazy dog" in cues[0][2].lower()
    # The job's own record agrees with what the socket delivered.
    job = JobHandle(ready["job"], "subtitle-live")
    assert job.state() == "SUCCESS"
    saved = json.loads((get_settings().storage_dir / job.id / "subtitles.json").read_text())
    assert [(c["start"], c["end"]) for c in saved["cues"]] == [(c[0], c[1]) for c in cues]


def test_stereo_at_48k_is_taken_as_pushed(cpu_worker, tiny_en, live_url, track) -> None:
    audio, _ = sf.read(track.path, dtype="float32")
    import av

    resampler = av.AudioResampler(format="s16", layout="stereo", rate=48000)
    frame = av.AudioFrame.from_ndarray(audio.reshape(1, -1), format="flt", layout="mono")
    frame.sample_rate = RATE
    stereo = b"".join(bytes(f.planes[0]) for f in [*resampler.resample(frame), *resampler.resample(None)])
    with connect(live_url) as ws:
        ws.send(json.dumps({"type": "start", "sample_rate": 48000, "channels": 2, "stall_timeout_s": 10}))
        ready = json.loads(ws.recv(timeout=30))
        assert ready["sample_rate"] == 48000 and ready["channels"] == 2
        # Faster than real time, in odd-sized pieces: the job reads it as fast as it can.
        for i in range(0, len(stereo), 9999):
            ws.send(stereo[i : i + 9999])
        ws.send(json.dumps({"type": "end"}))
        frames = [json.loads(m) for m in ws]
    end = frames[-1]
    assert end["type"] == "end" and end["state"] == "SUCCESS", frames[-3:]
    cues = _cues_of([f for f in frames if f["type"] == "segment"])
    assert len(cues) == len(track.truth)
    assert max(min(abs(c[0] - start) for c in cues) for start, _ in track.truth) <= BOUND_S


@pytest.mark.parametrize(
    ("first", "reason"),
    [
        (b"\x00\x01", "the first frame must be"),
        ('{"type": "start", "sample_rate": 7}', "sample_rate 7"),
        ('{"type": "start", "channels": 6}', "mono or stereo"),
        ('{"type": "start", "sample_rate": "16k"}', "whole number"),
        ('{"type": "start", "stream": "udp://127.0.0.1:5000"}', "send no 'stream'"),
        ('{"type": "start", "chunk_seconds": 0.1}', "chunk_seconds"),
        ('{"type": "start", "colour": "blue"}', "colour"),
        ('{"type": "start", "sample_rate": 96000}', "sample_rate 96000"),
        # submit()'s own keywords are not request fields: a client picks no queue, id, priority or tenant.
        ('{"type": "start", "queue": "gpu0.subtitle"}', "unknown field(s) queue"),
        ('{"type": "start", "job_id": "mine"}', "unknown field(s) job_id"),
        ('{"type": "start", "priority": 9, "tenant": "someone"}', "unknown field(s) priority, tenant"),
    ],
)
def test_a_start_that_does_not_fit_is_refused_naming_the_problem(gateway_url, live_url, first, reason) -> None:
    with connect(live_url) as ws:
        ws.send(first)
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=30)
    assert closed.value.rcvd.code == 4400 and reason in closed.value.rcvd.reason, closed.value.rcvd


def test_a_push_without_a_token_is_refused(live_url) -> None:
    with connect(live_url, additional_headers={}) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd.code == 1008 and "bearer token" in closed.value.rcvd.reason


def test_a_client_that_leaves_without_end_ends_the_stream_and_the_job_finishes(cpu_worker, tiny_en, live_url, track):
    pcm = track_pcm(track.path)
    with connect(live_url) as ws:
        ws.send(json.dumps({"type": "start", "stall_timeout_s": 60}))
        ready = json.loads(ws.recv(timeout=30))
        ws.send(pcm[: len(pcm) // 2])  # about two sentences, then the connection drops
    job = JobHandle(ready["job"], "subtitle-live")
    began = time.monotonic()
    output = job.wait(timeout=120)["output"]
    # Ended by the drop (not by the 60 s stall timeout), with what it heard.
    assert output["end_reason"].startswith("ended") and time.monotonic() - began < 55
    assert output["cues"] >= 1 and np.isclose(output["duration"], len(pcm) // 4 / RATE, atol=0.1)


def test_the_docs_live_client_runs_against_a_gateway_without_tokens(cpu_worker, tiny_en, track, tmp_path) -> None:
    blocks = code_blocks(REPO / "docs" / "gateway.md")
    (block,) = [b for b in blocks if "/v1/live/subtitles" in b.text and b.lang == "python"]
    assert "ws://127.0.0.1:8000/v1/live/subtitles" in block.text
    with running_gateway(gateway_config(tokens=())) as url:
        script = tmp_path / "live.py"
        script.write_text(block.text.replace("ws://127.0.0.1:8000", url.replace("http://", "ws://")))
        run = subprocess.run([sys.executable, str(script), str(track.path)], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("{'type': 'ready'") and run.stdout.rstrip().endswith("{'end': 'SUCCESS'}")
    assert run.stdout.count("WEBVTT") >= 8 and "lazy dog" in run.stdout  # ~18 s in 2 s segments


HELD_QUEUE = "live-held"


@pytest.fixture()
def held_url() -> Iterator[str]:
    """A gateway whose live jobs go to a queue no worker takes until a test starts one
    (``held_worker``): a job that reads nothing yet, so how far ahead a client is stays the test's."""
    with running_gateway(gateway_config(live_queue=HELD_QUEUE)) as url:
        yield url.replace("http://", "ws://") + "/v1/live/subtitles"


@pytest.fixture()
def held_worker(start_worker, tiny_en) -> Iterator[Any]:
    """Starts the held queue's worker when called; stops it when the test ends."""
    from mediafarm.workers.launch import stop_worker

    started = []
    yield lambda: started.append(start_worker("cpu", concurrency=1, queues=[HELD_QUEUE]))
    for worker in started:
        stop_worker(worker.process, timeout=20)


def test_a_client_far_ahead_of_its_job_is_told_to_hold_then_to_resume(held_url, held_worker) -> None:
    second = bytes(RATE * 2)  # a second of silence
    with connect(held_url) as ws:
        ws.send(json.dumps({"type": "start", "stall_timeout_s": 10}))
        json.loads(ws.recv(timeout=30))
        for _ in range(70):  # 70 s while no job reads: past the 60 s a client may be ahead
            ws.send(second)
        hold = json.loads(ws.recv(timeout=30))
        assert hold["type"] == "hold" and hold["ahead"] > 60, hold
        held_worker()  # the job runs and reads on; the client may go on after resume
        # Its empty segments may come before the resume.
        frames = [json.loads(ws.recv(timeout=90))]
        while frames[-1]["type"] == "segment":
            frames.append(json.loads(ws.recv(timeout=60)))
        assert frames[-1] == {"type": "resume"}, frames[-1]
        ws.send(json.dumps({"type": "end"}))
        frames = [json.loads(m) for m in ws]
    assert frames[-1]["type"] == "end" and frames[-1]["state"] == "SUCCESS", frames[-1]
    assert frames[-1]["output"]["duration"] == pytest.approx(70.0, abs=0.1)  # every second of it read


def test_a_client_that_ignores_a_hold_or_sends_too_big_a_frame_is_closed(held_url, held_worker) -> None:
    with connect(held_url) as ws:
        ws.send(json.dumps({"type": "start"}))
        ready = json.loads(ws.recv(timeout=30))
        with pytest.raises(ConnectionClosed) as closed:
            for _ in range(120):
                ws.send(bytes(RATE * 2))
            while True:
                ws.recv(timeout=30)
    assert closed.value.rcvd.code == 1013 and "hold" in closed.value.rcvd.reason
    # The audio taken before the close is the stream, which ended there: the job finishes with it.
    held_worker()
    assert JobHandle(ready["job"], "subtitle-live").wait(timeout=120)["output"]["end_reason"].startswith("ended")
    with connect(held_url) as ws:
        ws.send(json.dumps({"type": "start"}))
        json.loads(ws.recv(timeout=30))
        ws.send(bytes((1 << 20) + 2))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=30)
    assert closed.value.rcvd.code == 1009 and "at most 1,048,576 bytes" in closed.value.rcvd.reason
