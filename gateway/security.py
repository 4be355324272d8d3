"""Who may call the gateway: bearer tokens when FARM_API_TOKENS is set, loopback clients otherwise.

Every ``/v1`` route depends on :func:`caller`; the schema pages (``/docs``, ``/openapi.json``) and
``/healthz`` tell nothing about jobs and stay open. Without tokens the gateway also refuses any
client that is not on loopback (:class:`LoopbackOnly`), whatever address it was told to listen on.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, Request

from mediafarm.gateway.settings import GatewayConfig, is_loopback

# The owner of everything loopback clients upload when no tokens are set.
LOCAL = "local"


@dataclass(frozen=True)
class Caller:
    """Who is calling. Attributes: owner (``t`` and 16 hex digits of the token's sha256, or
    ``local``): whose uploads a request may use; the token itself is never stored."""

    owner: str


def owner_of(token: str) -> str:
    return "t" + hashlib.sha256(token.encode()).hexdigest()[:16]


def caller(request: Request) -> Caller:
    """The FastAPI dependency of every ``/v1`` route: 401 without a token the gateway accepts."""
    config: GatewayConfig = request.app.state.config
    if not config.tokens:
        return Caller(LOCAL)
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(401, "this gateway needs a bearer token (Authorization: Bearer <token>)",
                            headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
    token = token.strip()
    if not known_token(config, token):
        raise HTTPException(401, "the bearer token is not one this gateway accepts (FARM_API_TOKENS)",
                            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})  # fmt: skip
    return Caller(owner_of(token))


def known_token(config: GatewayConfig, token: str) -> bool:
    """Is ``token`` one of the gateway's? (HTTP routes and rooms alike.)"""
    # Every token is compared, in constant time each, so the time taken says nothing about which.
    return any([hmac.compare_digest(t.encode(), token.encode()) for t in config.tokens])


class LoopbackOnly:
    """ASGI middleware: 403 for any client not on loopback (installed when no tokens are set)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        client = scope.get("client")
        if scope["type"] in ("http", "websocket") and not (client and is_loopback(str(client[0]))):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            body = json.dumps({"detail": "this gateway serves loopback clients only: set FARM_API_TOKENS to "
                                         "serve other hosts"}).encode()  # fmt: skip
            await send({"type": "http.response.start", "status": 403,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})  # fmt: skip
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
