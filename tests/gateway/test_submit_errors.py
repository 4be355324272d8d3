"""A refused submit is answered one way on every route: each of submit's errors to its status."""

from __future__ import annotations

from kombu.exceptions import OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError

from mediafarm.gateway.common.submit_errors import http_refusal, refusal
from mediafarm.tasks.errors import InvalidRequest, Overloaded


def test_each_refusal_has_its_status_and_words() -> None:
    busy = http_refusal(Overloaded("tts queues full", retry_after=0.2))
    assert (busy.status_code, busy.headers) == (429, {"Retry-After": "1"})  # never 0: a client would not wait
    assert http_refusal(Overloaded("full", retry_after=7.5)).headers == {"Retry-After": "8"}
    invalid = http_refusal(InvalidRequest("tts request: text: too long"), "key-1", words=str.upper)
    assert (invalid.status_code, invalid.detail) == (422, "TTS REQUEST: TEXT: TOO LONG")
    conflict = http_refusal(ValueError("job key-1 was submitted with other fields"), "key-1")
    assert (conflict.status_code, conflict.detail) == (409, "Idempotency-Key 'key-1': job key-1 was submitted "
                                                             "with other fields")  # fmt: skip
    assert http_refusal(ValueError("priority out of range")).status_code == 422  # no id of the client's
    for away in (RedisConnectionError("refused"), OperationalError("refused")):
        gone = http_refusal(away)
        assert (gone.status_code, gone.detail) == (503, "the farm's broker cannot be reached: refused")


def test_only_a_named_id_turns_a_plain_value_error_into_a_conflict() -> None:
    assert refusal(ValueError("seen before"), named_id=True) == "conflict"
    assert refusal(ValueError("seen before"), named_id=False) == "invalid"
    assert refusal(InvalidRequest("bad field"), named_id=True) == "invalid"
