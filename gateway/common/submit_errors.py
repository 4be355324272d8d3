"""A refused submit, in a client's terms: the farm's errors sorted once into the four refusals a
route answers, and their HTTP form (the WebSockets' is ``ws_close``).

- ``overloaded``: admission control refused the job (``Overloaded``): 429 with Retry-After;
- ``conflict``: the job's own id was used before with other fields (a ``ValueError`` of
  ``submit``'s when the client named the id): 409;
- ``invalid``: the fields do not fit (``InvalidRequest``, any other ``ValueError``): 422;
- ``unavailable``: the farm's broker cannot be reached (``RedisError``, Kombu's
  ``OperationalError``): 503.

Beside them, what any route answers when the farm's Redis (``broker_away``) or its object store
(``store_failed``) fails under it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fastapi import HTTPException
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from mediafarm.tasks.wire import object_store
from mediafarm.tasks.wire.errors import InvalidRequest, Overloaded

# The farm's Redis (or the broker) away, refusing, or still loading its data after a restart: what
# any route that touches it may raise, a submit or a read. Answered 503, so a client waits it out.
BROKER_ERRORS = (RedisError, OperationalError)
# What ``submit`` raises when the farm refuses a job; anything else is a bug, answered 500.
SUBMIT_ERRORS = (Overloaded, ValueError, *BROKER_ERRORS)
HTTP_STATUS = {"overloaded": 429, "conflict": 409, "invalid": 422, "unavailable": 503}
BROKER_AWAY = "the farm's broker cannot be reached"


def refusal(exc: BaseException, *, named_id: bool) -> str:
    """Which refusal ``exc`` (one of SUBMIT_ERRORS) is; ``named_id``: the client chose the job's id."""
    if isinstance(exc, Overloaded):
        return "overloaded"
    if isinstance(exc, BROKER_ERRORS):
        return "unavailable"
    if named_id and not isinstance(exc, InvalidRequest):
        return "conflict"
    return "invalid"


def retry_after(exc: Overloaded) -> str:
    """Retry-After in whole seconds, never 0 (a client would retry at once)."""
    return str(max(1, math.ceil(exc.retry_after)))


def http_refusal(exc: BaseException, idempotency_key: str | None = None,
                 words: Callable[[BaseException], str] = str) -> HTTPException:  # fmt: skip
    """The HTTP answer to a refused submit. ``words``: the route's own wording of an invalid
    request (OpenAI's field names on OpenAI's routes)."""
    kind = refusal(exc, named_id=idempotency_key is not None)
    status = HTTP_STATUS[kind]
    if isinstance(exc, Overloaded):
        return HTTPException(status, str(exc), headers={"Retry-After": retry_after(exc)})
    if kind == "unavailable":
        return broker_away(exc)
    if kind == "conflict":
        return HTTPException(status, f"Idempotency-Key {idempotency_key!r}: {exc}")
    return HTTPException(status, words(exc))


def broker_away(exc: BaseException) -> HTTPException:
    """The answer to any route that met one of BROKER_ERRORS: 503, try again in a second."""
    return HTTPException(HTTP_STATUS["unavailable"], f"{BROKER_AWAY}: {exc}", headers={"Retry-After": "1"})


# The object store (FARM_STORAGE_URL) away, or an artifact's object gone (retention): what any
# route that reads an artifact from it may raise.
STORE_ERRORS = (object_store.StoreUnavailable, object_store.ObjectMissing)


def store_failed(exc: BaseException) -> HTTPException:
    """The answer to a route that met one of STORE_ERRORS: 404 for an object gone, else 503."""
    if isinstance(exc, object_store.ObjectMissing):
        return HTTPException(404, str(exc))
    return HTTPException(503, str(exc), headers={"Retry-After": "5"})
