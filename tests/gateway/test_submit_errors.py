"""A refused submit is answered one way on every route: each of submit's errors to its status."""

from __future__ import annotations

from kombu.exceptions import OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError

from mediafarm.gateway.common.submit_errors import http_refusal, refusal
from mediafarm.tasks.wire.errors import InvalidRequest, Overloaded


def test_each_refusal_has_its_status_and_words() -> None:
    busy = http_refusal(Overloaded("tts queues full", retry_after=0.2))
    assert (busy.status_code, busy.headers) == (429, {"Retry-After": "1"})  # never 0: a client would not wait
    assert http_refusal(Overloaded("full", retry_after=7.5)).headers == {"Retry-After": "8"}
    invalid = http_refusal(InvalidRequest("tts request: text: too long"), "key-1", words=lambda e: str(e).upper())
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


def test_an_openai_route_names_every_field_in_its_own_words_without_reading_the_message() -> None:
    from mediafarm.gateway.openai.models import in_openai_words

    names = {"text": "input", "speaker": "voice"}
    both = InvalidRequest.of_fields("tts", [("text", "too long"), ("speaker", "unknown")])
    assert str(both) == "tts request: text: too long; speaker: unknown"  # the family's own words
    assert in_openai_words(both, "tts", "speech", names) == "speech request: input: too long; voice: unknown"
    plain = InvalidRequest("tts request: text: made by hand")  # no fields named: left as it is
    assert in_openai_words(plain, "tts", "speech", names) == str(plain)
    other = InvalidRequest.of_fields("subtitle", [("text", "x")])
    assert in_openai_words(other, "tts", "speech", names) == "subtitle request: text: x"
