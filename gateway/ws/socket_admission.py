"""Who may open one of the gateway's WebSockets (dialogue rooms, live subtitles), checked the same way.

A socket is accepted before any check, so that a refusal reaches a browser as a close code and a
reason (a refused handshake is only an HTTP status it does not show). The token subprotocol is never
echoed back: only ``farm.v1``, when offered.
"""

from __future__ import annotations

from fastapi import WebSocket

from mediafarm.gateway.common.ws_close import CLOSE_POLICY, close
from mediafarm.gateway.security import LOCAL, known_token, owner_of
from mediafarm.gateway.settings import GatewayConfig

# The subprotocol the gateway's sockets speak (``Sec-WebSocket-Protocol``), and the prefix of the
# one that carries a browser's token (browsers cannot set an Authorization header on a WebSocket).
PROTOCOL = "farm.v1"
TOKEN_PROTOCOL_PREFIX = "bearer."


def credentials(websocket: WebSocket) -> str | None:
    """The token a client gave: ``Authorization: Bearer`` or a ``bearer.<token>`` subprotocol."""
    scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    for offered in websocket.scope.get("subprotocols", []):
        if offered.startswith(TOKEN_PROTOCOL_PREFIX) and len(offered) > len(TOKEN_PROTOCOL_PREFIX):
            return offered[len(TOKEN_PROTOCOL_PREFIX) :]
    return None


async def admit(websocket: WebSocket, config: GatewayConfig, what: str) -> str | None:
    """Accept the socket, then check its origin and token; the caller's owner name, or None once
    the socket was closed with the reason (``what`` names the route in it: "rooms")."""
    await websocket.accept(subprotocol=PROTOCOL if PROTOCOL in websocket.scope.get("subprotocols", []) else None)
    origin = websocket.headers.get("origin")
    if origin is not None and origin not in config.cors_origins:
        # A browser names the page that opened the socket, and a WebSocket has no CORS: without
        # this check any web page a user visits could open a socket on a loopback gateway that has
        # no tokens. Clients that are not browsers send no Origin.
        await close(websocket, CLOSE_POLICY, f"origin {origin[:100]} may not open {what} (FARM_CORS_ORIGINS)")
        return None
    if not config.tokens:
        return LOCAL
    token = credentials(websocket)
    if token is None:
        await close(websocket, CLOSE_POLICY, "this gateway needs a bearer token: an Authorization header, "
                                             f"or the subprotocol {TOKEN_PROTOCOL_PREFIX}<token>")  # fmt: skip
        return None
    if not known_token(config, token):
        await close(websocket, CLOSE_POLICY, "the bearer token is not one this gateway accepts")
        return None
    return owner_of(token)
