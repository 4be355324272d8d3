"""What the gateway's WebSockets (dialogue rooms, live subtitles) say when something goes wrong:
the close codes, the ``error`` frame, and a close whose reason fits its frame. Each socket's own
module lists the error codes it sends."""

from __future__ import annotations

from typing import Any

from fastapi import WebSocket

# Close codes (RFC 6455 and the 4000-4999 range left to applications).
CLOSE_NORMAL = 1000  # the socket's work ended: a room's lines sent or cancelled, a live job's end sent
CLOSE_POLICY = 1008  # no token, one the gateway does not accept, or an origin it does not serve
CLOSE_TOO_BIG = 1009  # a frame over the socket's bound (RFC 6455 "Message Too Big")
CLOSE_SERVER_ERROR = 1011  # the farm's Redis stayed unreachable
CLOSE_TRY_AGAIN = 1013  # the farm is overloaded, or the client ignored a hold (RFC 6455 "Try Again Later")
CLOSE_INVALID = 4400  # the socket's opening does not fit: a room's name, a live start frame
# A close frame's reason holds at most 123 bytes of UTF-8 (RFC 6455 5.5); longer ones fail.
MAX_REASON_BYTES = 123


def error(message: str, *, code: str, seq: int | None = None, field: str | None = None,
          **extra: Any) -> dict[str, Any]:  # fmt: skip
    """An ``error`` frame: ``code`` says what kind (``invalid``, ``overloaded`` with ``retry_after``,
    ``unavailable`` ...), ``seq`` and ``field`` what it is about when a frame named them."""
    return {"type": "error", "code": code, "seq": seq, "field": field, "message": message, **extra}


async def close(websocket: WebSocket, code: int, reason: str) -> None:
    """Close with ``reason`` cut to what a close frame holds (a longer one goes in an error frame first)."""
    await websocket.close(code, reason.encode()[:MAX_REASON_BYTES].decode(errors="ignore"))
