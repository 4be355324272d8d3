"""The per-job trace (``tasks.wire.trace``): its marks and spans, its JSON in the envelope, and the
round trips its counting connection counts, against a real Redis."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from mediafarm.tasks.wire import trace
from mediafarm.tasks.wire.records import Envelope
from mediafarm.tasks.wire.trace import Trace, counting_connection


def test_spans_are_each_steps_own_time_and_json_keeps_them_in_milliseconds() -> None:
    tr = Trace(t0=100.0, steps=[("a", 0.002, 1), ("b", 0.0025, 0), ("c", 0.010, 2)])
    assert [(s, round(d, 6), n) for s, d, n in tr.spans()] == [("a", 0.002, 1), ("b", 0.0005, 0), ("c", 0.0075, 2)]
    data = tr.to_json()
    assert data == {"t0": 100.0, "steps": [["a", 2.0, 1], ["b", 2.5, 0], ["c", 10.0, 2]]}
    back = Trace.from_json(data)
    assert back.t0 == 100.0 and [(s, round(at, 6), n) for s, at, n in back.steps] == tr.steps


def test_a_mark_is_the_time_since_t0_and_the_round_trips_since_the_mark_before() -> None:
    tr = Trace(t0=time.time() - 1.0)
    tr.mark("first")
    [(step, at, trips)] = tr.steps
    assert step == "first" and 1.0 <= at < 2.0 and trips == 0


@pytest.mark.parametrize("sent", [None, "yesterday", True, -5, 0, 10**400, float("inf"), float("nan"), 4e12])
def test_a_child_trace_without_a_usable_send_time_starts_at_the_child(sent: object) -> None:
    before = time.time()
    tr = trace.begin(sent)
    try:
        assert before <= tr.t0 <= time.time()
        assert tr.steps[0][0] == "child" and tr.steps[0][1] < 0.1
    finally:
        assert trace.end() is tr


def test_a_child_trace_starts_at_the_send_its_message_names() -> None:
    tr = trace.begin(time.time() - 0.25)
    trace.mark("engine")
    assert trace.end() is tr
    (child, at_child, _), (engine, at_engine, _) = tr.steps
    assert (child, engine) == ("child", "engine") and 0.25 <= at_child <= at_engine < 1.0


def test_marks_outside_a_job_are_dropped() -> None:
    assert trace.end() is None
    trace.mark("nothing")  # no job: no trace, no error
    assert trace.end() is None


def test_the_envelope_carries_the_trace_only_when_it_has_one() -> None:
    bare = Envelope("j", "vad", "silero", 0, {"spans": []})
    assert "trace" not in bare.to_json()
    assert Envelope.from_json(bare.to_json()).trace is None
    traced = Envelope("j", "vad", "silero", 0, {}, trace=Trace(t0=5.0, steps=[("child", 0.001, 0)]))
    data = traced.to_json()
    assert data["trace"] == {"t0": 5.0, "steps": [["child", 1.0, 0]]}
    assert Envelope.from_json(data).trace == Trace.from_json(data["trace"])


def test_the_counting_connection_counts_a_command_or_a_whole_pipeline_as_one_round_trip(redis_url: str) -> None:
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=counting_connection(redis.Connection))
    client = redis.Redis(connection_pool=pool)
    try:
        client.ping()  # the connection's handshake is not the step's
        start = trace.round_trips()
        client.set("trace-test", "1")
        client.get("trace-test")
        assert trace.round_trips() - start == 2
        pipe = client.pipeline()
        for i in range(5):
            pipe.incr("trace-test", i)
        pipe.execute()
        assert trace.round_trips() - start == 3
        # Another thread's round trips are its own, not this thread's step's.
        other = threading.Thread(target=lambda: [client.get("trace-test") for _ in range(4)])
        other.start()
        other.join()
        assert trace.round_trips() - start == 3
        client.delete("trace-test")
    finally:
        pool.disconnect()


def test_one_counting_class_per_connection_class() -> None:
    assert counting_connection(redis.Connection) is counting_connection(redis.Connection)
    assert issubclass(counting_connection(redis.SSLConnection), redis.SSLConnection)


def test_the_farm_backend_counts_its_round_trips() -> None:
    from mediafarm.tasks.app import app

    assert issubclass(app.backend.client.connection_pool.connection_class, redis.Connection)
    assert app.backend.client.connection_pool.connection_class is counting_connection(redis.Connection)


def test_the_cli_shows_a_trace_in_one_line_and_skips_one_it_cannot_read() -> None:
    from mediafarm.cli.job_view import trace_line

    data = {"t0": 10.0, "steps": [["child", 2.4, 0], ["attempt", 3.0, 1], ["engine_end", 16.0, 3]]}
    assert trace_line(data) == "trace: child 2.4 ms · attempt 0.6 ms (1 round trip) · engine_end 13.0 ms (3 round trips)"
    assert trace_line(None) is None and trace_line({"steps": []}) is None and trace_line({"t0": 1, "steps": [1]}) is None
