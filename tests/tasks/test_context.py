"""EngineContext outside a worker, and JobChannel against the session's own Redis."""

from __future__ import annotations

import json
import socket
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import BaseModel
from redis.backoff import NoBackoff
from redis.retry import Retry

from mediafarm.tasks.runtime import context
from mediafarm.tasks.runtime.context import CANCEL_INTERVAL, PROGRESS_INTERVAL, EngineContext, JobChannel
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.errors import Cancelled, PermanentFailure, RungUnavailable
from mediafarm.tasks.wire.plan import Part, Plan
from mediafarm.tasks.wire.records import Progress


class Clock:
    """A monotonic clock the test moves by hand (the throttles read ``time.monotonic``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(context, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    return clock


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture()
def job_id(client: redis.Redis) -> Iterator[str]:
    job_id = f"ctx-{uuid.uuid4().hex}"
    yield job_id
    client.delete(keys.progress(job_id), keys.partials(job_id), keys.cancel(job_id))


def _stored_progress(client: redis.Redis, job_id: str) -> Progress | None:
    raw = client.get(keys.progress(job_id))
    return None if raw is None else Progress.from_json(json.loads(raw))


def test_local_context_drops_progress_and_is_never_cancelled(tmp_path: Path) -> None:
    ctx = EngineContext.local(storage_dir=tmp_path, job_id="solo")
    assert ctx.channel is None
    ctx.progress(0.5, stage="decode")
    ctx.publish({"span": 1})
    ctx.check_cancelled()
    assert ctx.cancelled() is False
    assert ctx.artifacts.folder == tmp_path / "solo"
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere for progress or partials


def test_model_path_missing_is_an_unavailable_rung(tmp_path: Path) -> None:
    ctx = EngineContext.local(storage_dir=tmp_path, models_dir=tmp_path / "models")
    with pytest.raises(RungUnavailable, match="silero.onnx"):
        ctx.model_path("silero.onnx")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "silero.onnx").write_bytes(b"w")
    assert ctx.model_path("silero.onnx") == tmp_path / "models" / "silero.onnx"


def test_report_is_throttled_to_one_write_per_interval(client: redis.Redis, job_id: str, clock: Clock) -> None:
    channel = JobChannel(client, job_id, ttl=60)
    channel.report(Progress(0.1, "first"))
    clock.advance(PROGRESS_INTERVAL / 2)
    channel.report(Progress(0.2, "second"))
    assert _stored_progress(client, job_id).stage == "first"
    clock.advance(PROGRESS_INTERVAL)
    channel.report(Progress(0.3, "third"))
    stored = _stored_progress(client, job_id)
    assert (stored.stage, stored.fraction) == ("third", 0.3)
    assert 0 < client.ttl(keys.progress(job_id)) <= 60


def test_report_tells_flower_through_send_event(client: redis.Redis, job_id: str, clock: Clock) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    channel = JobChannel(client, job_id, ttl=60, send_event=lambda kind, **fields: events.append((kind, fields)))
    channel.report(Progress(0.5, "decode", 12.0))
    assert events == [("task-progress", {"fraction": 0.5, "stage": "decode", "media_seconds": 12.0})]


def test_context_progress_clamps_the_fraction_and_carries_the_attempt(
    client: redis.Redis, job_id: str, clock: Clock, tmp_path: Path
) -> None:
    ctx = EngineContext.local(storage_dir=tmp_path, job_id=job_id)
    ctx.attempt, ctx.rung_index, ctx.rung = 2, 1, "webrtc"
    ctx.channel = JobChannel(client, job_id, ttl=60)
    ctx.progress(1.7, stage="detect")
    stored = _stored_progress(client, job_id)
    assert (stored.fraction, stored.attempt, stored.rung_index, stored.rung) == (1.0, 2, 1, "webrtc")


def test_a_stage_reports_into_its_share_of_the_job(client: redis.Redis, job_id: str, clock: Clock, tmp_path: Path) -> None:
    ctx = EngineContext.local(storage_dir=tmp_path, job_id=job_id)
    ctx.channel = JobChannel(client, job_id, ttl=60)
    recognise = ctx.part(0.2, 1.0)
    recognise.part(0.5, 1.0).progress(0.5, stage="second half")  # 0.2 + 0.8 * (0.5 + 0.5 * 0.5)
    assert _stored_progress(client, job_id).fraction == pytest.approx(0.8)
    assert ctx.share == (0.0, 1.0) and recognise.share == pytest.approx((0.2, 1.0))


class Span(BaseModel):
    start: float
    end: float


def test_publish_appends_json_in_order(client: redis.Redis, job_id: str) -> None:
    channel = JobChannel(client, job_id, ttl=60)
    channel.publish({"word": "one"})
    channel.publish(Span(start=0.0, end=1.5))
    channel.publish("three")
    items = [json.loads(raw) for raw in client.lrange(keys.partials(job_id), 0, -1)]
    assert items == [{"word": "one"}, {"start": 0.0, "end": 1.5}, "three"]
    assert 0 < client.ttl(keys.partials(job_id)) <= 60


def test_cancelled_sees_the_cancel_key_within_the_interval(client: redis.Redis, job_id: str, clock: Clock) -> None:
    channel = JobChannel(client, job_id, ttl=60)
    assert channel.cancelled() is False
    client.set(keys.cancel(job_id), 1)
    assert channel.cancelled() is False  # read less than CANCEL_INTERVAL ago: not read again
    clock.advance(CANCEL_INTERVAL)
    assert channel.cancelled() is True
    client.delete(keys.cancel(job_id))
    clock.advance(CANCEL_INTERVAL)
    assert channel.cancelled() is True  # once cancelled, always cancelled


def test_check_cancelled_raises_cancelled(client: redis.Redis, job_id: str, clock: Clock, tmp_path: Path) -> None:
    ctx = EngineContext.local(storage_dir=tmp_path, job_id=job_id)
    ctx.channel = JobChannel(client, job_id, ttl=60)
    client.set(keys.cancel(job_id), 1)
    with pytest.raises(Cancelled, match=job_id):
        ctx.check_cancelled()


def test_reset_clears_partials_and_progress(client: redis.Redis, job_id: str, clock: Clock) -> None:
    channel = JobChannel(client, job_id, ttl=60)
    channel.publish({"n": 1})
    channel.report(Progress(0.5))
    assert client.exists(keys.partials(job_id), keys.progress(job_id), keys.first_output(job_id)) == 3
    channel.reset()
    assert client.exists(keys.partials(job_id), keys.progress(job_id), keys.first_output(job_id)) == 0
    # The next attempt's first output is its own: stamped again by its first publish only.
    channel.publish({"n": 1})
    first = client.get(keys.first_output(job_id))
    channel.publish({"n": 2})
    assert client.get(keys.first_output(job_id)) == first


@pytest.fixture()
def dead_client() -> Iterator[redis.Redis]:
    """A client of a port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    yield client
    client.close()


def test_redis_errors_in_report_and_cancelled_do_not_fail_the_job(dead_client: redis.Redis) -> None:
    channel = JobChannel(dead_client, "ctx-dead", ttl=60)
    with pytest.raises(redis.ConnectionError):
        dead_client.ping()  # the port really is closed
    channel.report(Progress(0.5))
    assert channel.cancelled() is False


def test_a_local_context_has_no_farm_state_unless_given(tmp_path: Path) -> None:
    from mediafarm.tasks.app import app

    bare = EngineContext.local(storage_dir=tmp_path, job_id="solo")
    assert bare.redis is None and bare.backend is None
    with pytest.raises(PermanentFailure, match=r"job solo reads its pipeline's parts, but .* no result backend"):
        bare.collect()
    given = EngineContext.local(storage_dir=tmp_path, backend=app.backend)
    assert given.redis is app.backend.client  # the backend's Redis, unless another is given
    assert given.part(0.0, 0.5).backend is app.backend  # a stage's context reads the same


def test_collect_reads_the_parts_results_in_plan_order_and_their_files(tmp_path: Path) -> None:
    from mediafarm.tasks.app import app

    fan_in = f"ctx-fan-{uuid.uuid4().hex[:8]}"
    plan = Plan(parts=(Part("toy", f"{fan_in}.b", {"text": "b"}, "second"), Part("toy", f"{fan_in}.a", {}, "first")),
                then=Part("toy", fan_in, {}, "join"))  # fmt: skip
    client = app.backend.client
    client.set(keys.pipeline_plan(fan_in), json.dumps(plan.to_json()), ex=60)
    for part in plan.parts:  # as Celery stores a finished job (JSON meta under the task's key)
        meta = {"status": "SUCCESS", "result": {"job_id": part.job_id, "output": {"label": part.label}}}
        client.set(app.backend.get_key_for_task(part.job_id), json.dumps(meta), ex=60)
    ctx = EngineContext.local(storage_dir=tmp_path, job_id=fan_in, backend=app.backend)
    ctx.artifacts.of_job(plan.parts[0].job_id).write_text("made.txt", "by b")

    collected = ctx.collect(timeout=0)
    assert [(c.part, c.envelope["output"]["label"]) for c in collected] == [(p, p.label) for p in plan.parts]
    assert ctx.artifacts.of_job(collected[0].part.job_id).path("made.txt").read_text() == "by b"
    client.set(app.backend.get_key_for_task(plan.parts[1].job_id), json.dumps({"status": "FAILURE"}), ex=60)
    with pytest.raises(PermanentFailure, match=rf"1 of 2 parts failed: first \({fan_in}.a\): FAILURE"):
        ctx.collect(timeout=0)


@pytest.fixture()
def counted(redis_url: str) -> Iterator[redis.Redis]:
    """A client whose round trips this thread's ``trace.round_trips`` counts, as a worker's does."""
    from mediafarm.tasks.wire import trace

    client = redis.Redis.from_url(redis_url, connection_class=trace.counting_connection(redis.Connection))
    client.ping()  # connected: a new connection's handshake would count as round trips of its own
    yield client
    client.close()


def _trips() -> int:
    from mediafarm.tasks.wire import trace

    return trace.round_trips()


def test_progress_held_for_the_next_output_goes_in_its_round_trip(
    counted: redis.Redis, client: redis.Redis, job_id: str, clock: Clock
) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    channel = JobChannel(counted, job_id, ttl=60, send_event=lambda kind, **fields: events.append((kind, fields)))
    bells = client.pubsub()
    bells.subscribe(keys.bell(job_id))
    assert bells.get_message(timeout=1)["type"] == "subscribe"
    before = _trips()
    channel.report(Progress(0.5, "synthesise", 2.5), with_next_output=True)
    assert _trips() == before and client.get(keys.progress(job_id)) is None and events == []
    channel.publish({"chunk": 0})
    assert _trips() == before + 1
    stored = _stored_progress(client, job_id)
    assert (stored.fraction, stored.stage) == (0.5, "synthesise")
    assert json.loads(client.lindex(keys.partials(job_id), 0)) == {"chunk": 0}
    rung = {bells.get_message(timeout=1)["data"] for _ in range(2)}
    assert rung == {keys.BELL_PROGRESS.encode(), keys.BELL_PARTIAL.encode()}  # a follower of either wakes
    assert events == [("task-progress", {"fraction": 0.5, "stage": "synthesise", "media_seconds": 2.5})]
    # Written once: the next output carries no progress of its own.
    clock.advance(PROGRESS_INTERVAL)
    client.delete(keys.progress(job_id))
    channel.publish({"chunk": 1})
    assert client.get(keys.progress(job_id)) is None
    bells.close()


def test_a_held_progress_is_superseded_by_a_newer_report_and_dropped_by_a_reset(
    client: redis.Redis, job_id: str, clock: Clock
) -> None:
    channel = JobChannel(client, job_id, ttl=60)
    channel.report(Progress(0.2, "held"), with_next_output=True)
    clock.advance(PROGRESS_INTERVAL)
    channel.report(Progress(0.4, "newer"))
    channel.publish({"n": 1})
    assert _stored_progress(client, job_id).stage == "newer"  # the older, held report never overwrites it
    clock.advance(PROGRESS_INTERVAL)
    channel.report(Progress(0.9, "of a failed attempt"), with_next_output=True)
    channel.reset()
    channel.publish({"n": 1})
    assert client.get(keys.progress(job_id)) is None


def test_the_first_cancel_check_takes_the_attempt_records_answer_without_a_round_trip(
    counted: redis.Redis, client: redis.Redis, job_id: str, clock: Clock
) -> None:
    channel = JobChannel(counted, job_id, ttl=60)
    asked: list[bool] = []
    channel.attempt_began(lambda: asked.append(True) or False)
    client.set(keys.cancel(job_id), 1)  # set after the record read the flag
    before = _trips()
    assert channel.cancelled() is False and asked == [True] and _trips() == before
    assert channel.cancelled() is False and asked == [True]  # throttled from the record's read
    clock.advance(CANCEL_INTERVAL)
    assert channel.cancelled() is True and _trips() == before + 1
    # Cancelled while queued: the record saw the flag, the engine stops at its first check.
    queued = JobChannel(counted, job_id, ttl=60)
    queued.attempt_began(lambda: True)
    assert queued.cancelled() is True


def test_a_first_cancel_check_later_than_the_interval_reads_the_flag_itself(
    client: redis.Redis, job_id: str, clock: Clock
) -> None:
    channel = JobChannel(client, job_id, ttl=60)
    channel.attempt_began(lambda: pytest.fail("a stale answer must not be taken"))
    clock.advance(CANCEL_INTERVAL)  # a long model load between the record and the first check
    client.set(keys.cancel(job_id), 1)
    assert channel.cancelled() is True
