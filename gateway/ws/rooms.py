"""Dialogue rooms: ``WebSocket /v1/rooms/{room}``, lines in, each line's audio out in seq order.

Each line a client sends becomes a TTS job at once (``submit``, the speaker's voice, id
``room:<owner>:<room>:<seq>``), so every accepted line is synthesised concurrently by the farm's
workers, on its own ladder. One sender per room follows only the line at the head of the room:
it sends that line's chunks as its job announces them (``room_feed``), then its ``line_end``, then
moves to the next line, whose audio, made meanwhile, is waiting in the farm's storage and Redis:
nothing of a later line is held in the gateway's memory. A line that fails for good gets an error
frame in its place and the room moves on.

Two coroutines per connection: the reader (frames in: lines, end) and the sender (the head line's
chunks out); a lock keeps each chunk's announcement and its audio frame adjacent. Every farm call
blocks, so each runs in a worker thread.

Leaving: an ``end`` frame cancels the room's unfinished lines at once; a dropped connection's
wait for their client first (``room_lease``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError
from starlette.websockets import WebSocketState

from mediafarm.gateway.common.submit_errors import BROKER_AWAY, SUBMIT_ERRORS, refusal
from mediafarm.gateway.common.ws_close import CLOSE_INVALID, CLOSE_NORMAL, CLOSE_SERVER_ERROR, close, error
from mediafarm.gateway.settings import GatewayConfig
from mediafarm.gateway.ws.room_feed import Chunk, Done, Failed, LineFeed, Restart
from mediafarm.gateway.ws.room_frames import ROOM_NAME, End, FrameError, Line, audio_frames, parse_frame, room_job_id
from mediafarm.gateway.ws.room_lease import Lease
from mediafarm.gateway.ws.socket_admission import PROTOCOL, admit
from mediafarm.tasks.families.tts import get_speaker
from mediafarm.tasks.producer.bells import Bell, bell
from mediafarm.tasks.producer.client import submit
from mediafarm.tasks.producer.handles import JobHandle, Snapshot
from mediafarm.tasks.producer.job_feed import JobWatch
from mediafarm.tasks.wire.artifacts import UnsafeArtifactName
from mediafarm.tasks.wire.errors import Overloaded, PermanentFailure

router = APIRouter()
_ROOM = re.compile(ROOM_NAME)
# A text frame longer than this is refused unread: a line's text is bounded by the TTS request model
# (100,000 characters, up to 4 bytes each in UTF-8) and the rest of a line is small.
MAX_FRAME_CHARS = 500_000
# How long the sender waits out an unreachable Redis before it tries again.
REDIS_RETRY_S = 1.0


class _UnknownSpeaker(Exception):
    """The line's speaker is not registered (not one of submit's refusals: the line names it)."""


@dataclass
class _Accepted:
    line: Line
    job: JobHandle


@dataclass
class _Room:
    websocket: WebSocket
    config: GatewayConfig
    owner: str
    name: str
    send_lock: anyio.Lock = field(default_factory=anyio.Lock)
    pending: list[_Accepted] = field(default_factory=list)  # accepted, not yet wholly sent; seq order
    next_seq: int | None = None
    track: float = 0.0  # seconds of the room's track sent so far
    sent: list[int] = field(default_factory=list)
    finishing: bool = False
    ended: bool = False  # by the client's end frame (not a dropped connection)
    connection: str = field(default_factory=lambda: uuid.uuid4().hex)
    wake: anyio.Event = field(default_factory=anyio.Event)

    async def send_json(self, frame: dict[str, Any]) -> None:
        async with self.send_lock:
            await self.websocket.send_json(frame)


@router.websocket("/v1/rooms/{room}")
async def room_socket(websocket: WebSocket, room: str) -> None:
    config: GatewayConfig = websocket.app.state.config
    owner = await admit(websocket, config, "rooms")
    if owner is None:
        return
    if not _ROOM.match(room):
        await close(websocket, CLOSE_INVALID, "a room name is 1-100 letters, digits, '.', '_' or '-'")
        return
    state = _Room(websocket, config, owner, room)
    lease = Lease(owner, room, state.connection)
    try:
        await anyio.to_thread.run_sync(lease.take)
    except (RedisError, OperationalError) as exc:
        await close(websocket, CLOSE_SERVER_ERROR, f"the farm's Redis cannot be reached: {exc}")
        return
    await state.send_json({"type": "ready", "room": room, "protocol": PROTOCOL, "max_lines": config.room_max_lines,
                           "linger": config.room_linger})  # fmt: skip
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_sender, state, tasks.cancel_scope.cancel)
            await _reader(state)
            tasks.cancel_scope.cancel()
    except* (WebSocketDisconnect, OSError):  # the client left while a frame was being sent to it
        pass
    finally:
        lines = [(accepted.line.seq, accepted.job) for accepted in state.pending]
        if state.ended:
            with anyio.CancelScope(shield=True):
                cancelled = await anyio.to_thread.run_sync(lease.leave, lines)
            await _say_end(websocket, state, cancelled)
        else:
            lease.linger(config.room_linger, lines)


async def _say_end(websocket: WebSocket, room: _Room, cancelled: list[int]) -> None:
    if websocket.client_state is not WebSocketState.CONNECTED:
        return
    try:
        await websocket.send_json({"type": "end", "sent": room.sent, "cancelled": cancelled})
        await websocket.close(CLOSE_NORMAL)
    except (WebSocketDisconnect, RuntimeError):  # the client left first
        pass


async def _reader(room: _Room) -> None:
    """Frames in until the client ends the room or leaves."""
    while True:
        message = await room.websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        if text is None:
            await room.send_json(error("a room takes JSON text frames, not binary ones", code="invalid"))
            continue
        if len(text) > MAX_FRAME_CHARS:
            await room.send_json(error(f"a frame may hold at most {MAX_FRAME_CHARS:,} characters", code="invalid"))
            continue
        try:
            frame = parse_frame(text)
        except FrameError as exc:
            await room.send_json(error(str(exc), code="invalid", seq=exc.seq, field=exc.field))
            continue
        if isinstance(frame, End):
            if not frame.finish:
                room.ended = True
                return
            room.finishing = True
            room.wake.set()
            continue
        if room.finishing:
            await room.send_json(error("the room is finishing (end with finish): it takes no more lines",
                                       code="invalid", seq=frame.seq))  # fmt: skip
            continue
        await _accept(room, frame)


async def _accept(room: _Room, line: Line) -> None:
    if room.next_seq is not None and line.seq != room.next_seq:
        await room.send_json(error(f"seq: expected {room.next_seq}, the line after the last one accepted",
                                   code="out_of_order", seq=line.seq, field="seq", expected=room.next_seq))  # fmt: skip
        return
    limit = room.config.room_max_lines
    if len(room.pending) >= limit:
        # Told, not stalled: the client sends this seq again once a line_end has come.
        await room.send_json(error(
            f"the room has {len(room.pending)} lines in flight, its bound (max_lines {limit}): send seq "
            f"{line.seq} again after the next line_end", code="busy", seq=line.seq, max_lines=limit,
            in_flight=len(room.pending),
        ))  # fmt: skip
        return
    job_id = room_job_id(room.owner, room.name, line.seq)

    def send() -> JobHandle:
        try:
            get_speaker(line.speaker)
        except PermanentFailure as exc:  # no such speaker
            raise _UnknownSpeaker(str(exc)) from None
        return submit("tts", queue=room.config.room_queue, job_id=job_id, tenant=room.owner, **line.fields)

    try:
        job = await anyio.to_thread.run_sync(send)
    except _UnknownSpeaker as exc:
        await room.send_json(error(f"speaker: {exc}", code="invalid", seq=line.seq, field="speaker"))
        return
    except SUBMIT_ERRORS as exc:
        await room.send_json(_refused(exc, line.seq))
        return
    room.pending.append(_Accepted(line, job))
    room.next_seq = line.seq + 1
    room.wake.set()
    await room.send_json({"type": "accepted", "seq": line.seq, "job": job.id, "in_flight": len(room.pending),
                          "max_lines": limit})  # fmt: skip


def _refused(exc: BaseException, seq: int) -> dict[str, Any]:
    """The error frame of a line the farm refused (``submit_errors``)."""
    code = refusal(exc, named_id=True)  # a line's job id is the room's and the seq's
    if isinstance(exc, Overloaded):  # admission control: nothing was sent, the seq stays free
        return error(f"{exc}; send seq {seq} again in {exc.retry_after:g} s", code=code, seq=seq,
                     retry_after=exc.retry_after, reason=exc.reason)  # fmt: skip
    if code == "conflict":  # the id was used before with another line
        return error(f"seq {seq} was sent to this room before with another line: {exc}", code=code, seq=seq,
                     field="seq")  # fmt: skip
    if code == "unavailable":
        return error(f"{BROKER_AWAY}: {exc}", code=code, seq=seq)
    return error(str(exc), code=code, seq=seq)


async def _sender(room: _Room, leave: Callable[[], Any]) -> None:
    """The head line's audio out, line after line, in seq order; leaves once finishing and empty."""
    while True:
        if not room.pending:
            if room.finishing:
                room.ended = True
                leave()
                return
            await room.wake.wait()
            room.wake = anyio.Event()
            continue
        head = room.pending[0]
        await _stream_line(room, head)
        room.pending.pop(0)


def _read_if_changed(job: JobHandle, watch: JobWatch, rung: bool) -> Snapshot | None:
    """The job's snapshot if its bell ``rung`` or a look shows that anything a room follows changed
    (``job_feed.JobWatch``), else None."""
    return job.snapshot() if rung or watch.changed() else None


async def _stream_line(room: _Room, head: _Accepted) -> None:
    with bell(head.job.id, kinds=("attempt", "partial")) as ring:  # before the first look: a chunk after it rings
        await _follow_line(room, head, ring)


async def _follow_line(room: _Room, head: _Accepted, ring: Bell) -> None:
    feed = LineFeed()
    frames = 0  # audio frames sent of the attempt being streamed
    watch = JobWatch(head.job)
    rung = True  # the first look reads the job
    while True:
        try:
            snapshot = await anyio.to_thread.run_sync(_read_if_changed, head.job, watch, rung)
        except (RedisError, OperationalError):
            await anyio.sleep(REDIS_RETRY_S)
            continue
        if snapshot is None:
            rung = await ring.changed(room.config.room_poll)
            continue
        for step in feed.steps(snapshot):
            if isinstance(step, Chunk):
                sent = await _send_chunk(room, head, step)
                if sent is None:
                    break  # that chunk's attempt is gone: the next snapshot says what followed it
                frames = (frames if step.attempt == feed.attempt else 0) + sent
            elif isinstance(step, Restart):
                await room.send_json({
                    "type": "restart", "seq": head.line.seq, "speaker": head.line.speaker, "attempt": step.attempt,
                    "rung": step.rung, "discarded": frames, "reason": step.reason, "start": round(room.track, 3),
                })  # fmt: skip
                frames = 0
            elif isinstance(step, Done):
                await _send_line_end(room, head, step)
            else:
                await room.send_json(error(
                    f"line {head.line.seq} was not spoken: {step.failure.get('reason', '')}", code="failed",
                    seq=head.line.seq, kind=step.failure.get("kind"), job=head.job.id,
                ))  # fmt: skip
            feed.commit(step)
            if isinstance(step, (Done, Failed)):
                return
        rung = await ring.changed(room.config.room_poll)


async def _send_chunk(room: _Room, head: _Accepted, step: Chunk) -> int | None:
    """Send a chunk's audio frames, each announced; how many, or None when its audio could not be
    read as its attempt's."""
    data = await anyio.to_thread.run_sync(_read_chunk, room.config, head.job, step)
    if data is None:
        return None
    pieces = audio_frames(data)
    start = float(step.partial.get("start", 0.0))
    for number, piece in enumerate(pieces):
        at = start + (piece.offset / piece.rate if piece.rate else 0.0)
        length = piece.samples / piece.rate if piece.rate else float(step.partial.get("end", start)) - start
        announce = {
            "type": "chunk", "seq": head.line.seq, "speaker": head.line.speaker, "chunk": step.index,
            "piece": number, "pieces": len(pieces), "attempt": step.attempt, "rung": step.rung,
            "start": round(room.track + at, 3), "end": round(room.track + at + length, 3), "line_start": round(at, 3),
            "samples": piece.samples, "sample_rate": piece.rate, "format": "wav", "bytes": len(piece.wav),
        }  # fmt: skip
        async with room.send_lock:  # the announcement and its audio, with nothing between them
            await room.websocket.send_json(announce)
            await room.websocket.send_bytes(piece.wav)
    return len(pieces)


async def _send_line_end(room: _Room, head: _Accepted, step: Done) -> None:
    output = step.envelope.get("output", {})
    duration = float(output.get("duration", 0.0))
    await room.send_json({
        "type": "line_end", "seq": head.line.seq, "speaker": head.line.speaker, "job": head.job.id,
        "rung": output.get("rung", step.envelope.get("rung", "")), "voice": output.get("voice", ""),
        "start": round(room.track, 3), "end": round(room.track + duration, 3), "duration": duration,
        "chunks": output.get("chunks"), "sample_rate": output.get("sample_rate"),
        "attempts": [{k: a.get(k) for k in ("rung", "variant", "outcome", "reason")}  # variant: for one release
                     for a in step.envelope.get("attempts", [])],
    })  # fmt: skip
    room.track += duration
    room.sent.append(head.line.seq)


def _read_chunk(config: GatewayConfig, job: JobHandle, step: Chunk) -> bytes | None:
    """A chunk's WAV file, or None if it cannot be known to be its attempt's (``JobHandle.partial_file``)."""
    try:
        return job.partial_file(step.partial, step.attempt + 1, config.storage_dir)
    except (OSError, UnsafeArtifactName):
        return None
