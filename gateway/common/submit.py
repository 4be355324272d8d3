"""A job submitted from an HTTP route: the request's submit options (Idempotency-Key, webhook
headers, the JSON body), the call into the farm off the event loop, and a refusal as the HTTP error
``submit_errors`` maps it to. The job routes and OpenAI's routes submit this one way."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import quote

import anyio
from fastapi import Header, HTTPException, Request

from mediafarm.gateway.common.submit_errors import SUBMIT_ERRORS, http_refusal
from mediafarm.gateway.settings import MAX_JSON_BYTES
from mediafarm.tasks.producer.handles import JobHandle

# An Idempotency-Key becomes the job's id, so it must be one a URL path and a storage folder hold.
IDEMPOTENCY_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")


def job_url(job_id: str, tail: str = "") -> str:
    return f"/v1/jobs/{quote(job_id, safe='')}{tail}"


def check_idempotency_key(key: str | None) -> None:
    """422 for a key that cannot be a job's id."""
    if key is not None and not IDEMPOTENCY_KEY.match(key):
        raise HTTPException(422, "Idempotency-Key: 1 to 200 letters, digits, '.', '_', ':' or '-', "
                                 "starting with a letter or digit")  # fmt: skip


async def json_body(request: Request) -> Any:
    """The body as JSON, read to at most MAX_JSON_BYTES (413 past it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_JSON_BYTES:
        raise HTTPException(413, f"a job's body may hold at most {MAX_JSON_BYTES:,} bytes; upload media instead")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_JSON_BYTES:
            raise HTTPException(413, f"a job's body may hold at most {MAX_JSON_BYTES:,} bytes; upload media instead")
    try:
        return json.loads(body or b"null")
    except ValueError as exc:
        raise HTTPException(422, f"the body is not JSON: {exc}") from None


def webhook_options(
    x_webhook: Annotated[
        str | None,
        Header(description="A URL the farm posts the job's events to, signed (Standard Webhooks; docs/operating.md)"),
    ] = None,
    x_webhook_events: Annotated[
        str | None,
        Header(description="Which events, comma-separated: start, progress, attempt, completed (default: completed)"),
    ] = None,
) -> dict[str, Any]:
    """A job's webhook, from its request's headers, as ``submit``'s keywords (it checks them:
    a bad URL is an InvalidRequest, a 422)."""
    return {"webhook": x_webhook, "webhook_events": x_webhook_events}


async def submitted(send: Callable[[], JobHandle], idempotency_key: str | None = None,
                    words: Callable[[BaseException], str] = str) -> JobHandle:  # fmt: skip
    """The job ``send`` submits, called in a worker thread (it blocks on Redis); a refusal is
    raised as its HTTPException (``words``: the route's wording of an invalid request)."""
    try:
        return await anyio.to_thread.run_sync(send)
    except SUBMIT_ERRORS as exc:
        raise http_refusal(exc, idempotency_key, words) from None
