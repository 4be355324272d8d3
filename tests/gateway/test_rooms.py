"""Dialogue rooms (``WebSocket /v1/rooms/{room}``) with a real WebSocket client (``websockets``),
against a real gateway, Redis and prefork worker: lines come back in seq order in their speakers'
voices, a killed line comes back on its next rung in its place, the bound is told, bad frames are
named, a client without a token is refused. The chunk rule itself is tried on made-up snapshots.

The worker's TTS ladder is espeak-ng, then Piper. Its espeak-ng is a gate that holds any text
holding "Patience" for a few seconds: a long line without a long wait on two cores, and a window
to kill a line between two of its chunks.
"""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from mediafarm import register_speaker, remove_speaker
from mediafarm.config.settings import get_settings
from mediafarm.gateway.security import owner_of
from mediafarm.gateway.ws.room_feed import Chunk, Done, Failed, LineFeed, Restart
from mediafarm.gateway.ws.room_frames import FrameError, parse_frame, room_job_id
from mediafarm.tasks.app import app
from mediafarm.tasks.producer.handles import JobHandle, Snapshot
from mediafarm.tasks.wire import keys
from tests.conftest import REPO
from tests.gateway.conftest import TOKEN, gateway_config, running_gateway
from tests.support.docs import code_blocks
from tests.support.kills import kill_running
from tests.support.piper_voice import link_joe_voice
from tests.support.speech import held_espeak
from tests.support.voices import voice_distance

websockets_sync = pytest.importorskip("websockets.sync.client", reason="rooms need the gateway extra's websockets")
QUEUE = "room-test"
# espeak-ng held 3 s on a line saying "Patience": a slow chunk, and a window to kill a line.
HOLD_S = 3
# Short engine calls: a line of three sentences is three chunks.
LADDER = """
[ladders.tts]
rungs = [
  {{ name = "espeak", engine = "espeak", params = {{ binary = "{gate}", max_chars = 40 }} }},
  {{ name = "piper", engine = "piper", params = {{ max_chars = 40 }} }},
]
"""
# Semitones between two speakers' espeak-ng voices (their slots' variants), as the dialogue tests measured.
VOICES_DIFFER = 5.0


# --- the chunk rule, on made-up snapshots ---------------------------------------------------------


def attempt(outcome: str | None, rung: str) -> dict[str, Any]:
    return {"rung": rung, "variant": rung, "outcome": outcome, "reason": "SIGKILL" if outcome == "killed" else ""}


def run_feed(snapshots: list[Snapshot]) -> list[Any]:
    feed, told = LineFeed(), []
    for snapshot in snapshots:
        for step in feed.steps(snapshot):
            feed.commit(step)
            told.append(step)
    return told


def test_a_killed_attempts_chunks_are_discarded_by_a_restart_never_mixed() -> None:
    a, b = {"chunk": 0, "artifact": "a0"}, {"chunk": 1, "artifact": "a1"}
    life = [
        Snapshot("PENDING", (), ()),
        Snapshot("STARTED", (attempt(None, "espeak"),), (a,)),
        Snapshot("STARTED", (attempt(None, "espeak"),), (a, b)),
        Snapshot("RETRY", (attempt("killed", "espeak"),), (a, b)),  # killed: its record not yet followed
        Snapshot("STARTED", (attempt("killed", "espeak"), attempt(None, "piper")), ()),
        Snapshot("STARTED", (attempt("killed", "espeak"), attempt(None, "piper")), ("P0",)),
        Snapshot("SUCCESS", (attempt("killed", "espeak"), attempt("ok", "piper")), ("P0", "P1"), envelope={"x": 1}),
    ]
    told = run_feed(life)
    assert [type(s).__name__ for s in told] == ["Chunk", "Chunk", "Restart", "Chunk", "Chunk", "Done"]
    assert [(s.attempt, s.index, s.rung) for s in told if isinstance(s, Chunk)] == [
        (0, 0, "espeak"), (0, 1, "espeak"), (1, 0, "piper"), (1, 1, "piper")]  # fmt: skip
    restart = told[2]
    assert isinstance(restart, Restart) and (restart.attempt, restart.rung, restart.discarded) == (1, "piper", 2)
    assert restart.reason.startswith("killed")
    # Killed before it sent anything: no restart, the next attempt's chunks from its first.
    quiet = run_feed([life[0], life[4], life[6]])
    assert [type(s).__name__ for s in quiet] == ["Chunk", "Chunk", "Done"]
    # A chunk not committed (its file was gone) is offered again from the next snapshot.
    feed = LineFeed()
    assert [s.index for s in feed.steps(life[2]) if isinstance(s, Chunk)] == [0, 1]
    feed.commit(feed.steps(life[2])[0])
    assert [s.index for s in feed.steps(life[2]) if isinstance(s, Chunk)] == [1]


def test_a_failed_line_sends_no_chunk_of_its_last_attempt_and_says_why() -> None:
    failed = Snapshot("FAILURE", (attempt("oom", "piper"),), ("x",),
                      failure={"kind": "ladder_exhausted", "reason": "every rung failed"})  # fmt: skip
    told = run_feed([failed])
    assert len(told) == 1 and isinstance(told[0], Failed) and told[0].failure["kind"] == "ladder_exhausted"
    assert isinstance(run_feed([Snapshot("SUCCESS", (attempt("ok", "espeak"),), (), envelope={})])[0], Done)


def test_a_line_frame_is_the_tts_request_it_stands_for() -> None:
    line = parse_frame('{"seq": 3, "speaker": "narrator", "text": "Hi.", "speed": 1.5, "ladder": "piper"}')
    assert (line.seq, line.speaker) == (3, "narrator")
    assert line.fields == {"text": "Hi.", "speaker": "narrator", "format": "wav", "speed": 1.5, "ladder": "piper"}


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        ('{"seq": "1", "speaker": "a", "text": "Hi."}', "seq"),
        ('{"seq": -1, "speaker": "a", "text": "Hi."}', "seq"),
        ('{"seq": 1, "text": "Hi."}', "speaker"),
        ('{"seq": 1, "speaker": "no such!", "text": "Hi."}', "speaker"),
        ('{"seq": 1, "speaker": "a", "text": "..."}', "text"),
        ('{"seq": 1, "speaker": "a", "text": "Hi.", "speed": 9}', "speed"),
        ('{"seq": 1, "speaker": "a", "text": "Hi.", "volume": 3}', "volume"),
        ('{"type": "shout", "seq": 1}', "type"),
        ('{"type": "end", "finish": "yes"}', "finish"),
        ('{"seq": 1, "speaker": "a", "text": "Hi.", "ladder": 3}', "ladder"),
        ("[1, 2]", None),
        ("not json", None),
    ],
)
def test_a_frame_that_does_not_fit_names_its_field(frame: str, field: str | None) -> None:
    with pytest.raises(FrameError) as caught:
        parse_frame(frame)
    assert caught.value.field == field, str(caught.value)
    assert field is None or field in str(caught.value)


# --- a real gateway, Redis and worker --------------------------------------------------------------


@pytest.fixture(scope="module")
def room_worker(start_worker, session_dir: Path):
    link_joe_voice(get_settings().models_dir)
    gate = held_espeak(session_dir / "espeak-room-gate.sh", HOLD_S)
    config = session_dir / "farm-room-test.toml"
    config.write_text((REPO / "tests" / "support" / "farm-test.toml").read_text() + LADDER.format(gate=gate))
    return start_worker("cpu", concurrency=2, queues=[QUEUE], env={"FARM_CONFIG_FILE": str(config)})


@pytest.fixture(scope="module")
def speakers() -> Iterator[tuple[str, str]]:
    """Two speakers with no voice of their own: each gets its slot's, distinct on every rung."""
    names = (f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}")
    for name in names:
        register_speaker(name)
    yield names
    for name in names:
        remove_speaker(name)


@pytest.fixture(scope="module")
def room_url(room_worker) -> Iterator[str]:
    with running_gateway(gateway_config(room_queue=QUEUE)) as url:
        yield url.replace("http://", "ws://")


@pytest.fixture(scope="module")
def idle_room_url() -> Iterator[str]:
    """A gateway whose rooms hold two lines, sent to a queue no worker takes (they never end), and
    whose dropped connections' lines wait half a second for their client."""
    with running_gateway(gateway_config(room_queue="room-nobody", room_max_lines=2, room_linger=0.5)) as url:
        yield url.replace("http://", "ws://")


def connect(base: str, room: str, **options: Any) -> Any:
    options.setdefault("additional_headers", {"Authorization": f"Bearer {TOKEN}"})
    return websockets_sync.connect(f"{base}/v1/rooms/{room}", open_timeout=30, **options)


def read_frames(ws: Any, until: Any, timeout: float = 90.0) -> list[dict[str, Any]]:
    """Frames until ``until(frame)`` holds; each chunk announcement gets its audio (``audio``) and
    the time it came (``at``)."""
    frames: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            message = ws.recv(timeout=max(deadline - time.monotonic(), 0.1))
        except TimeoutError:
            told = [{k: v for k, v in f.items() if k != "audio"} for f in frames]
            raise AssertionError(f"nothing more from the room in {timeout} s; it sent: {told}") from None
        if isinstance(message, bytes):
            assert frames and frames[-1]["type"] == "chunk" and "audio" not in frames[-1], "audio without announcement"
            assert len(message) == frames[-1]["bytes"]
            frames[-1]["audio"] = message
            if until(frames[-1]):
                return frames
            continue
        frame = json.loads(message)
        frame["at"] = time.time()
        frames.append(frame)
        if frame["type"] != "chunk" and until(frame):
            return frames


def line_ended(seq: int) -> Any:
    return lambda f: f["type"] in ("line_end", "error") and f.get("seq") == seq


def job_end(job_id: str) -> float:
    last = JobHandle(job_id, "tts").attempts()[-1]
    return last["started"] + last["duration"]


def assert_tiled(frames: list[dict[str, Any]]) -> None:
    """The audio frames of one attempt of a line: every piece of every chunk, in order, each
    starting in the room's track where the one before it ended."""
    assert frames and (frames[0]["chunk"], frames[0]["piece"]) == (0, 0)
    for before, after in zip(frames, frames[1:]):
        if after["chunk"] == before["chunk"]:
            assert after["piece"] == before["piece"] + 1
        else:
            assert (after["chunk"], after["piece"]) == (before["chunk"] + 1, 0)
            assert before["piece"] == before["pieces"] - 1
        assert abs(after["start"] - before["end"]) < 0.0015
    assert frames[-1]["piece"] == frames[-1]["pieces"] - 1
    assert all(f["end"] - f["start"] <= 1.001 for f in frames)  # at most a second each


def decode(chunks: list[dict[str, Any]]) -> tuple[np.ndarray, int]:
    parts = [sf.read(io.BytesIO(c["audio"]), dtype="float32") for c in chunks]
    assert all(rate == parts[0][1] == c["sample_rate"] for (_, rate), c in zip(parts, chunks, strict=True))
    return np.concatenate([p for p, _ in parts]), parts[0][1]


def test_lines_come_back_in_seq_order_in_their_speakers_voices(room_url, speakers) -> None:
    alice, bob = speakers
    room = f"order-{uuid.uuid4().hex[:6]}"
    long_line = "This line is the long one. Patience, it takes a while to say. And it ends here."
    with connect(room_url, room) as ws:
        assert json.loads(ws.recv(timeout=10))["max_lines"] == 8
        ws.send(json.dumps({"seq": 0, "speaker": alice, "text": long_line}))
        ws.send(json.dumps({"seq": 1, "speaker": bob, "text": "Short one."}))
        ws.send(json.dumps({"seq": 2, "speaker": alice, "text": "Alice again, quickly."}))
        frames = read_frames(ws, line_ended(2))
    owner = owner_of(TOKEN)
    ids = [room_job_id(owner, room, seq) for seq in range(3)]
    assert [f["job"] for f in frames if f["type"] == "accepted"] == ids
    audio = [f for f in frames if f["type"] in ("chunk", "line_end")]
    # Strictly in seq order: every chunk of a line, then its end, then the next line.
    assert [(f["seq"], f["type"]) for f in audio] == sorted(((f["seq"], f["type"]) for f in audio),
                                                           key=lambda x: (x[0], x[1] == "line_end"))  # fmt: skip
    chunks = {seq: [f for f in audio if f["type"] == "chunk" and f["seq"] == seq] for seq in range(3)}
    ends = {f["seq"]: f for f in audio if f["type"] == "line_end"}
    for seq in range(3):
        assert_tiled(chunks[seq])
    assert chunks[0][-1]["chunk"] == 2 and chunks[1][-1]["chunk"] == 0 == chunks[2][-1]["chunk"]
    # The short lines ran beside the long one and ended first; they waited only for their turn,
    # and the long line's first chunk reached the client before its job had ended.
    assert job_end(ids[1]) < job_end(ids[0]) and job_end(ids[2]) < job_end(ids[0])
    assert chunks[0][0]["at"] < job_end(ids[0])
    # Each in its speaker's voice: the voice the farm recorded, and the audio itself.
    assert [ends[s]["speaker"] for s in range(3)] == [alice, bob, alice]
    assert ends[0]["voice"] == ends[2]["voice"] != ends[1]["voice"]
    assert all(ends[s]["rung"] == "espeak" and ends[s]["attempts"][0]["outcome"] == "ok" for s in range(3))
    (a0, rate), (b1, _), (a2, _) = (decode(chunks[s]) for s in range(3))
    assert voice_distance(a0, b1, rate) > VOICES_DIFFER > voice_distance(a0, a2, rate)
    # The room's track: each line starts where the one before ended; chunks tile their line.
    assert ends[0]["start"] == 0.0 and ends[1]["start"] == ends[0]["end"] and ends[2]["start"] == ends[1]["end"]
    for seq in range(3):
        assert chunks[seq][0]["start"] == ends[seq]["start"]
        assert abs(chunks[seq][-1]["end"] - ends[seq]["end"]) < 0.002
        samples = sum(len(sf.read(io.BytesIO(c["audio"]))[0]) for c in chunks[seq])
        assert abs(samples / rate - ends[seq]["duration"]) < 0.002


def test_a_line_killed_mid_way_comes_back_on_its_next_rung_in_its_place(room_url, speakers) -> None:
    alice, bob = speakers
    room = f"kill-{uuid.uuid4().hex[:6]}"
    with connect(room_url, room) as ws:
        ws.recv(timeout=10)
        ws.send(json.dumps({"seq": 7, "speaker": alice, "text": "The kettle sings. Patience, the water is hot. Tea."}))
        ws.send(json.dumps({"seq": 8, "speaker": bob, "text": "Two sugars for me."}))
        first = read_frames(ws, lambda f: f["type"] == "chunk" and f["seq"] == 7)
        # Its first chunk is out; the gate holds the second: kill the line's child there.
        kill_running(JobHandle(room_job_id(owner_of(TOKEN), room, 7), "tts"), "espeak")
        frames = first + read_frames(ws, line_ended(8))
    line = [f for f in frames if f.get("seq") == 7 and f["type"] in ("chunk", "restart", "line_end")]
    kinds = [f["type"] for f in line]
    cut = kinds.index("restart")  # the killed attempt's frames (its first chunk), then the restart
    killed = line[:cut]
    assert killed and all(f["type"] == "chunk" and f["attempt"] == 0 and f["chunk"] == 0 for f in killed), kinds
    assert kinds.count("restart") == 1 and kinds[-1] == "line_end", kinds
    restart = line[cut]
    assert (restart["rung"], restart["attempt"], restart["discarded"], restart["start"]) == ("piper", 1, len(killed),
                                                                                            0.0)  # fmt: skip
    assert restart["reason"].startswith("killed")
    again = [f for f in line[cut + 1 :] if f["type"] == "chunk"]
    assert all(c["rung"] == "piper" and c["attempt"] == 1 for c in again)
    assert_tiled(again)
    end = line[-1]
    assert again[0]["start"] == 0.0 and again[-1]["chunk"] + 1 == end["chunks"]
    assert end["rung"] == "piper" and end["voice"].startswith("piper ")
    assert [(a["variant"], a["outcome"]) for a in end["attempts"]] == [("espeak", "killed"), ("piper", "ok")]
    decode(again)
    # In its place: the next line after it, from where it ended.
    after = [f for f in frames if f.get("seq") == 8 and f["type"] in ("chunk", "line_end")]
    assert after[0]["start"] == end["end"] and after[-1]["type"] == "line_end" and after[-1]["rung"] == "espeak"
    assert frames.index(after[0]) > frames.index(end)


def test_a_line_that_fails_for_good_gets_an_error_in_its_place_and_the_room_goes_on(room_url, speakers) -> None:
    room = f"fail-{uuid.uuid4().hex[:6]}"
    with connect(room_url, room) as ws:
        ws.recv(timeout=10)
        ws.send(json.dumps({"seq": 0, "speaker": speakers[0], "text": "Never spoken.", "ladder": "no-such-ladder"}))
        ws.send(json.dumps({"seq": 1, "speaker": speakers[1], "text": "Spoken all the same."}))
        frames = read_frames(ws, line_ended(1))
    told = [f for f in frames if f["type"] in ("chunk", "line_end", "error")]
    failed = told[0]
    assert (failed["type"], failed["code"], failed["seq"], failed["kind"]) == ("error", "failed", 0, "rejected")
    assert "no-such-ladder" in failed["message"]
    assert {f["seq"] for f in told[1:]} == {1} and told[-1]["type"] == "line_end"
    assert told[1]["start"] == 0.0 == told[-1]["start"]  # a failed line takes no time in the track


def test_a_room_past_its_bound_is_told_so_and_end_cancels_its_lines(idle_room_url) -> None:
    room = f"bound-{uuid.uuid4().hex[:6]}"
    with connect(idle_room_url, room) as ws:
        assert json.loads(ws.recv(timeout=10))["max_lines"] == 2
        for seq in range(3):
            ws.send(json.dumps({"seq": seq, "speaker": "default", "text": f"Line {seq}."}))
        frames = read_frames(ws, lambda f: f.get("seq") == 2)
        busy = frames[-1]
        assert [f["type"] for f in frames] == ["accepted", "accepted", "error"]
        assert (busy["code"], busy["max_lines"], busy["in_flight"]) == ("busy", 2, 2) and "max_lines 2" in busy["message"]
        ws.send(json.dumps({"type": "end"}))
        end = json.loads(ws.recv(timeout=10))
        assert end == {"type": "end", "sent": [], "cancelled": [0, 1]}
        with pytest.raises(Exception) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1000


def test_a_dropped_connections_lines_wait_for_their_client_then_are_cancelled(idle_room_url) -> None:
    room = f"drop-{uuid.uuid4().hex[:6]}"
    line = json.dumps({"seq": 0, "speaker": "default", "text": "Are you still there?"})
    job_id = room_job_id(owner_of(TOKEN), room, 0)
    cancelled = keys.cancel(job_id)
    with connect(idle_room_url, room) as ws:
        assert json.loads(ws.recv(timeout=10))["linger"] == 0.5
        ws.send(line)
        assert json.loads(ws.recv(timeout=10))["job"] == job_id
    # Back within the grace period, the line sent again: the same job, not cancelled.
    with connect(idle_room_url, room) as ws:
        ws.recv(timeout=10)
        ws.send(line)
        assert json.loads(ws.recv(timeout=10))["job"] == job_id
        time.sleep(1.0)  # the first connection's grace period ends meanwhile
        assert not app.backend.client.exists(cancelled)
    deadline = time.monotonic() + 10  # the second connection dropped, and no one came back
    while not app.backend.client.exists(cancelled):
        assert time.monotonic() < deadline, "the dropped room's line was never cancelled"
        time.sleep(0.1)


def test_bad_frames_get_an_error_naming_the_field_and_the_room_lives_on(idle_room_url) -> None:
    room = f"bad-{uuid.uuid4().hex[:6]}"
    with connect(idle_room_url, room) as ws:
        ws.recv(timeout=10)
        sends = ['{"seq": "zero", "speaker": "default", "text": "Hi."}', b"\x00\x01",
                 '{"seq": 0, "speaker": "nobody-registered", "text": "Hi."}',
                 '{"seq": 0, "speaker": "default", "text": "Hi."}',
                 '{"seq": 5, "speaker": "default", "text": "Skipped ahead."}']  # fmt: skip
        for message in sends:
            ws.send(message)
        frames = [json.loads(ws.recv(timeout=10)) for _ in sends]
    assert [(f["type"], f.get("code"), f.get("field")) for f in frames] == [
        ("error", "invalid", "seq"), ("error", "invalid", None), ("error", "invalid", "speaker"),
        ("accepted", None, None), ("error", "out_of_order", "seq")]  # fmt: skip
    assert "nobody-registered" in frames[2]["message"] and frames[4]["expected"] == 1


def test_a_client_without_an_accepted_token_is_refused_and_a_browsers_subprotocol_token_works(idle_room_url) -> None:
    from websockets.exceptions import ConnectionClosed

    for headers, protocols in (({}, None), ({}, ["farm.v1", "bearer.wrong-token"]),
                               ({"Authorization": "Bearer wrong"}, None)):  # fmt: skip
        with connect(idle_room_url, "r1", additional_headers=headers, subprotocols=protocols) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1008 and "token" in closed.value.rcvd.reason
    with connect(idle_room_url, "r1", additional_headers={}, subprotocols=["farm.v1", f"bearer.{TOKEN}"]) as ws:
        assert ws.subprotocol == "farm.v1"
        assert json.loads(ws.recv(timeout=10))["type"] == "ready"


def test_a_web_page_of_an_origin_not_allowed_cannot_open_a_room_on_a_gateway_without_tokens() -> None:
    from websockets.exceptions import ConnectionClosed

    allowed = "https://game.example"
    with running_gateway(gateway_config(tokens=(), cors_origins=(allowed,))) as url:
        base = url.replace("http://", "ws://")
        evil = "https://evil.example/" + "x" * 200  # a reason longer than a close frame holds, cut short
        with connect(base, "r1", additional_headers={}, origin=evil) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1008 and "evil.example" in closed.value.rcvd.reason
        for origin in (allowed, None):  # the page allowed, and a client that is not a browser
            with connect(base, "r1", additional_headers={}, origin=origin) as ws:
                assert json.loads(ws.recv(timeout=10))["type"] == "ready"


def test_the_docs_room_client_runs_against_a_gateway_without_tokens(room_worker, tmp_path: Path) -> None:
    (block,) = [b for b in code_blocks(REPO / "docs" / "gateway.md") if "/v1/rooms/" in b.text and b.lang == "python"]
    assert "ws://127.0.0.1:8000/v1/rooms/" in block.text
    with running_gateway(gateway_config(tokens=(), room_queue=QUEUE)) as url:
        script = tmp_path / "narrate.py"
        script.write_text(block.text.replace("ws://127.0.0.1:8000", url.replace("http://", "ws://")))
        run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    printed = [ast.literal_eval(line) for line in run.stdout.splitlines()]  # the client prints the frames' dicts
    assert [f["type"] for f in printed] == ["ready", "line_end", "line_end", "end"]
    assert printed[-1] == {"type": "end", "sent": [0, 1], "cancelled": []}
    for end in printed[1:3]:  # each line's files hold its audio, whole
        written = list(tmp_path.glob(f"line{end['seq']}-*.wav"))
        assert written and abs(sum(sf.info(p).frames for p in written) / end["sample_rate"] - end["duration"]) < 0.002
