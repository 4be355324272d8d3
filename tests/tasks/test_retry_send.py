"""A delivery whose retry (a downgrade, a move) cannot be sent (tasks.runtime.base ``FarmTask.send_retry``).

Found by the chaos suite's two pools: after a network cut, a moved job's retry raised
AttributeError inside kombu's Redis transport, and Celery failed the job for good.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Signature
from celery.exceptions import Reject, Retry
from kombu.exceptions import OperationalError

from mediafarm.tasks.app import app
from mediafarm.tasks.runtime.base import register_tasks
from mediafarm.tasks.wire.errors import ResourceFailure
from mediafarm.tasks.wire.records import Outcome

TASK = "farm.test.chaos"


@pytest.fixture()
def delivery() -> Iterator[Any]:
    """The chaos family's task, inside a worker's delivery of one job."""
    register_tasks(app)  # as the worker entry does: the app a producer imports has no task
    task = app.tasks[TASK]
    task.push_request(id="retry-send-test", retries=1, called_directly=False, args=(), kwargs={"ladder": "moving"},
                      delivery_info={"routing_key": "chaos@chaos", "redelivered": False})  # fmt: skip
    try:
        yield task
    finally:
        task.pop_request()


def publishing(monkeypatch: pytest.MonkeyPatch, error: Exception | None) -> list[dict[str, Any]]:
    """Every retry's publish raises ``error`` (None: it is sent); the options of each, sent or not."""
    sent: list[dict[str, Any]] = []

    def apply_async(self: Signature, *args: Any, **options: Any) -> None:
        sent.append(dict(self.options))
        if error is not None:
            raise error

    monkeypatch.setattr(Signature, "apply_async", apply_async)
    return sent


def test_a_retry_sent_raises_celerys_retry_to_the_queue_asked(delivery: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = publishing(monkeypatch, None)
    with pytest.raises(Retry):
        delivery.send_retry(exc=ResourceFailure("moved", Outcome.UNAVAILABLE), countdown=0, queue="chaos@chaos-b")
    assert [s["queue"] for s in sent] == ["chaos@chaos-b"]


def test_a_retry_this_process_could_not_send_hands_the_message_back(
    delivery: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What kombu raised: its pooled producer's channel had lost its connection in a network cut.
    error = AttributeError("'NoneType' object has no attribute 'client'")
    publishing(monkeypatch, error)
    with pytest.raises(Reject) as raised:
        delivery.send_retry(exc=ResourceFailure("moved", Outcome.UNAVAILABLE), countdown=0, queue="chaos@chaos-b")
    assert raised.value.requeue is True and raised.value.reason is error


def test_a_broker_unreachable_past_the_publish_retries_still_ends_the_job(
    delivery: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    publishing(monkeypatch, OperationalError("Error 111 connecting to 127.0.0.1:6399. Connection refused."))
    with pytest.raises(Reject) as raised:
        delivery.send_retry(exc=ResourceFailure("oom", Outcome.OOM), countdown=0, queue=None)
    assert raised.value.requeue is False


def test_an_error_at_every_publish_hands_the_message_back_a_few_times_then_ends_the_job(
    delivery: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mediafarm.tasks.runtime import base
    from mediafarm.tasks.wire import keys

    delivery.backend.client.delete(keys.unsent_retries(delivery.request.id))
    publishing(monkeypatch, TypeError("a bug, at every publish"))
    requeued = []
    for _ in range(base.UNSENT_HANDBACKS + 1):
        with pytest.raises(Reject) as raised:
            delivery.send_retry(exc=ResourceFailure("moved", Outcome.UNAVAILABLE), countdown=0, queue="chaos@chaos-b")
        requeued.append(raised.value.requeue)
    delivery.backend.client.delete(keys.unsent_retries(delivery.request.id))
    assert requeued == [True] * base.UNSENT_HANDBACKS + [False]
