"""Live subtitles of audio a client pushes: ``WebSocket /v1/live/subtitles``, PCM in, WebVTT segments out.

The client's first frame is ``start`` (the PCM format and the subtitle-live request's fields); the
gateway opens a push stream in the farm's Redis (``subtitle_live.push.AudioPush``), submits a
``subtitle-live`` job that reads it, and answers ``ready`` with the job's id. Then binary frames
are the audio (s16le, any split), and the job's segments come back as the worker writes them:
``segment`` frames with their WebVTT, in order, each once, across attempts. ``end`` from the client
ends the stream; the job finishes what it heard, and the gateway sends the job's ``end`` frame (its
result, or its failure) and closes. A client that leaves without ``end`` ends the stream the same
way: the job still finishes, and its result is the job's, under the id ``ready`` gave.

Two coroutines per connection: the reader (frames in, appended to the stream in a worker thread)
and the sender (the job followed, segments out). A client pushing faster than the job reads is
told so: past ``MAX_AHEAD_SECONDS`` of audio the job has not read, a ``hold`` frame, and ``resume``
once the job is within half of it again; a client that goes on past ``HOLD_GRACE_SECONDS`` more is
closed with 1013, so Redis holds a bounded amount. The socket is never left unread to slow a
client down: uvicorn's keep-alive pings would go unanswered and drop it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError
from starlette.websockets import WebSocketState

from mediafarm.gateway.common.submit_errors import SUBMIT_ERRORS, refusal
from mediafarm.gateway.common.ws_close import (
    CLOSE_INVALID,
    CLOSE_NORMAL,
    CLOSE_SERVER_ERROR,
    CLOSE_TOO_BIG,
    CLOSE_TRY_AGAIN,
    close,
    error,
)
from mediafarm.gateway.settings import GatewayConfig
from mediafarm.gateway.ws.socket_admission import admit
from mediafarm.tasks.families.subtitle_live import MAX_AHEAD_SECONDS, AudioPush, LiveSubtitleRequest, PushFormatError
from mediafarm.tasks.producer.bells import Bell, bell
from mediafarm.tasks.producer.client import farm_redis, submit
from mediafarm.tasks.producer.handles import JobHandle
from mediafarm.tasks.producer.job_feed import JobWatch
from mediafarm.tasks.wire.artifacts import UnsafeArtifactName
from mediafarm.tasks.wire.errors import Overloaded
from mediafarm.tasks.wire.plan import READY

router = APIRouter()
FAMILY = "subtitle-live"
# What a start frame may hold besides its type and the PCM format: the request's own fields, but the
# stream (the socket's audio). Nothing of submit's own (queue, job_id, priority, tenant) gets through.
START_FIELDS = frozenset(LiveSubtitleRequest.model_fields) - {"stream"}
# How far past MAX_AHEAD_SECONDS a client that was told to hold may go on before it is closed.
HOLD_GRACE_SECONDS = 30.0
# How long a client has to send its start frame.
START_TIMEOUT_S = 30.0
# A binary frame larger than this is refused: 1 MiB is 30 s of 16 kHz mono, far more than a live frame.
MAX_AUDIO_FRAME = 1 << 20
# Seconds between two looks at the job when its bell is silent (``tasks.producer.bells``; one
# Redis round trip, the job read in full only when it changed): a hold's end is seen this soon.
POLL_S = 0.1


@dataclass
class _Live:
    websocket: WebSocket
    config: GatewayConfig
    push: AudioPush
    job: JobHandle
    send_lock: anyio.Lock = field(default_factory=anyio.Lock)
    sent: set[str] = field(default_factory=set)  # segment names sent
    unread: set[str] = field(default_factory=set)  # segment names whose error frame was sent
    holding: bool = False  # a hold frame was sent, no resume yet

    async def send_json(self, frame: dict[str, Any]) -> None:
        async with self.send_lock:
            await self.websocket.send_json(frame)


@router.websocket("/v1/live/subtitles")
async def live_subtitles(websocket: WebSocket) -> None:
    config: GatewayConfig = websocket.app.state.config
    owner = await admit(websocket, config, "live subtitles")
    if owner is None:
        return
    try:
        with anyio.fail_after(START_TIMEOUT_S):
            message = await websocket.receive()
    except TimeoutError:
        await close(websocket, CLOSE_INVALID, f"no start frame within {START_TIMEOUT_S:g} s")
        return
    if message["type"] == "websocket.disconnect":
        return
    started = await _start(websocket, config, owner, message.get("text"))
    if started is None:
        return
    push, job = started
    live = _Live(websocket, config, push, job)
    try:
        await live.send_json({"type": "ready", "job": job.id, "stream": push.url,
                              "sample_rate": push.format.sample_rate, "channels": push.format.channels})  # fmt: skip
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_sender, live, tasks.cancel_scope)
            left = await _reader(live)
            await _end_stream(push)
            if left:  # no one to send the rest to: the job finishes on its own, its result kept
                tasks.cancel_scope.cancel()
    except* (WebSocketDisconnect, OSError, RuntimeError):  # the client left while a frame was being sent to it
        pass
    except* (RedisError, OperationalError) as group:
        await _close_quietly(live, CLOSE_SERVER_ERROR, f"the farm's Redis cannot be reached: {group.exceptions[0]}")
    finally:
        await _end_stream(push)


async def _close_quietly(live: _Live, code: int, reason: str) -> None:
    """An error frame, then the close, unless the client has already gone."""
    if live.websocket.client_state is not WebSocketState.CONNECTED:
        return
    try:
        async with live.send_lock:
            await live.websocket.send_json(error(reason, code="closing"))
            await close(live.websocket, code, reason)
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass


async def _end_stream(push: AudioPush) -> None:
    with anyio.CancelScope(shield=True):
        try:
            await anyio.to_thread.run_sync(push.end)
        except (RedisError, OperationalError):
            pass  # the stream then stalls: the job ends on its stall timeout


async def _start(
    websocket: WebSocket, config: GatewayConfig, owner: str, text: str | None
) -> tuple[AudioPush, JobHandle] | None:
    """The start frame → the push stream and its job; None once the socket was closed with the reason."""
    try:
        frame = json.loads(text) if text is not None else None
    except ValueError:
        frame = None
    if not isinstance(frame, dict) or frame.get("type") != "start":
        await close(websocket, CLOSE_INVALID, 'the first frame must be {"type": "start", ...} as JSON text')
        return None
    fields = {k: v for k, v in frame.items() if k not in ("type", "sample_rate", "channels")}
    if "stream" in fields:
        await close(websocket, CLOSE_INVALID, "start: the stream is this socket's audio; send no 'stream'")
        return None
    unknown = sorted(set(fields) - START_FIELDS)
    if unknown:
        await websocket.send_json(error(f"start: unknown field(s) {', '.join(unknown)}; a start frame takes "
                                        f"sample_rate, channels and {', '.join(sorted(START_FIELDS))}",
                                        code="invalid"))  # fmt: skip
        await close(websocket, CLOSE_INVALID, f"start: unknown field(s) {', '.join(unknown)}")
        return None
    try:
        push = AudioPush(farm_redis(), sample_rate=_whole(frame, "sample_rate", 16000),
                         channels=_whole(frame, "channels", 1))  # fmt: skip
    except (PushFormatError, ValueError) as exc:
        await close(websocket, CLOSE_INVALID, f"start: {exc}")
        return None

    def send() -> JobHandle:
        return submit(FAMILY, queue=config.live_queue, tenant=owner, stream=push.url, **fields)

    try:
        job = await anyio.to_thread.run_sync(send)
    except (*SUBMIT_ERRORS, TypeError) as exc:  # TypeError: a field submit does not take
        await _refuse_start(websocket, exc)
        return None
    return push, job


async def _refuse_start(websocket: WebSocket, exc: BaseException) -> None:
    """Close the socket of a start the farm refused (``submit_errors``); the reason may be longer
    than a close frame holds, so it goes in an error frame first."""
    kind = "invalid" if isinstance(exc, TypeError) else refusal(exc, named_id=False)
    if kind == "unavailable":
        await close(websocket, CLOSE_SERVER_ERROR, f"the farm's Redis cannot be reached: {exc}")
    elif isinstance(exc, Overloaded):
        await websocket.send_json(error(str(exc), code=kind, retry_after=exc.retry_after))
        await close(websocket, CLOSE_TRY_AGAIN, str(exc))
    else:
        await websocket.send_json(error(f"start: {exc}", code=kind))
        await close(websocket, CLOSE_INVALID, f"start: {exc}")


def _whole(frame: dict[str, Any], name: str, default: int) -> int:
    value = frame.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return value


async def _reader(live: _Live) -> bool:
    """Audio in until the client ends the stream (False) or leaves (True)."""
    while True:
        message = await live.websocket.receive()
        if message["type"] == "websocket.disconnect":
            return True
        data = message.get("bytes")
        if data is None:
            try:
                frame = json.loads(message.get("text") or "")
            except ValueError:
                frame = None
            if isinstance(frame, dict) and frame.get("type") == "end":
                return False
            await live.send_json(error('after start, a frame is audio (binary) or {"type": "end"}', code="invalid"))
            continue
        if len(data) > MAX_AUDIO_FRAME:
            # Dropping it would shift every later byte (a frame may end mid-sample): the stream ends here.
            await _close_quietly(live, CLOSE_TOO_BIG, f"an audio frame may hold at most {MAX_AUDIO_FRAME:,} bytes")
            return True
        ahead = await anyio.to_thread.run_sync(live.push.write, data)
        if ahead > MAX_AHEAD_SECONDS + HOLD_GRACE_SECONDS:
            await _close_quietly(live, CLOSE_TRY_AGAIN, f"the job is {ahead:.0f} s behind the audio pushed: a hold "
                                                         "frame asked to wait for resume")  # fmt: skip
            return True
        if ahead > MAX_AHEAD_SECONDS and not live.holding:
            live.holding = True
            await live.send_json({"type": "hold", "ahead": round(ahead, 1), "max_ahead": MAX_AHEAD_SECONDS})


async def _sender(live: _Live, scope: anyio.CancelScope) -> None:
    """The job's new segments out as they are announced (and ``resume`` after a hold), then its
    end frame; closes the socket and stops the reader (``scope``)."""
    with bell(live.job.id, kinds=("attempt", "partial")) as ring:  # before the first look: a segment after it rings
        await _send_segments(live, scope, ring)


async def _send_segments(live: _Live, scope: anyio.CancelScope, ring: Bell) -> None:
    watch = JobWatch(live.job)
    rung = True  # the first look reads the job
    while True:
        try:
            changed = rung or await anyio.to_thread.run_sync(watch.changed)
            snapshot = await anyio.to_thread.run_sync(live.job.snapshot) if changed else None
            if live.holding and await anyio.to_thread.run_sync(live.push.ahead) <= MAX_AHEAD_SECONDS / 2:
                live.holding = False
                await live.send_json({"type": "resume"})
        except (RedisError, OperationalError):
            await anyio.sleep(1.0)  # Redis away for a moment: the job goes on; so does the look
            continue
        if snapshot is not None:
            # Each attempt announces the segments it writes; one that took over writes only new ones.
            for item in snapshot.partials:
                name = item.get("segment") if isinstance(item, dict) else None
                if isinstance(name, str) and name not in live.sent:
                    await _send_segment(live, item, name)
            if snapshot.state in READY:
                end: dict[str, Any] = {"type": "end", "job": live.job.id, "state": snapshot.state}
                if snapshot.envelope is not None:
                    end["output"] = snapshot.envelope.get("output")
                if snapshot.failure is not None:
                    end["failure"] = snapshot.failure
                async with live.send_lock:
                    await live.websocket.send_json(end)
                    if live.websocket.client_state is WebSocketState.CONNECTED:
                        await live.websocket.close(CLOSE_NORMAL)
                scope.cancel()  # the reader too: the job takes no more audio
                return
        rung = await ring.changed(POLL_S)  # a hold ends by the look at least this often


async def _send_segment(live: _Live, item: dict[str, Any], name: str) -> None:
    """One announced segment, read from its object (``url``) or the storage folder."""

    def read() -> str:
        data = live.job.partial_file(item, None, live.config.storage_dir)
        return (data or b"").decode("utf-8")

    try:
        text = await anyio.to_thread.run_sync(read)
    except (UnsafeArtifactName, OSError, UnicodeDecodeError) as exc:
        if name not in live.unread:  # once: the next looks try it again, quietly
            live.unread.add(name)
            await live.send_json(error(f"segment {name} cannot be read: {exc}", code="missing", name=name))
        return
    live.sent.add(name)
    await live.send_json({"type": "segment", "name": name, "vtt": text})
