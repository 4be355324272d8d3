"""Job bells (``tasks.producer.bells``) on a real Redis: each write a follower sees rings the job's
bell in its own round trip, a subscription going live rings once, a lost subscriber connection
rings every bell, and a bell's channels go with its last bell, closed or dropped."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from mediafarm.tasks.app import app
from mediafarm.tasks.producer import bells
from mediafarm.tasks.producer.bells import BellListener, bell
from mediafarm.tasks.runtime.context import JobChannel
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.records import Attempt, Outcome, Progress


@pytest.fixture()
def job_id(redis_url: str) -> str:  # the session's Redis, which the app's backend uses
    return f"bell-{uuid.uuid4().hex[:8]}"


def live(ring: Any) -> None:
    """Wait for the ring of the subscription going live, and nothing after it."""
    assert ring.wait(5), "a new bell rings once its subscription is live"
    assert not ring.wait(0.2), "once, when its channel is live"


def subscribers(channel: str) -> int:
    return dict(app.backend.client.pubsub_numsub(channel)).get(channel.encode(), 0)


def test_a_partial_output_and_progress_ring_the_bell_in_their_own_round_trip(job_id: str) -> None:
    channel = JobChannel(app.backend.client, job_id, ttl=60)
    with bell(job_id) as ring:
        live(ring)
        assert not ring.wait(0.2)  # silence: no ring
        channel.publish({"chunk": 0})
        assert ring.wait(5)
        channel.report(Progress(fraction=0.5, stage="speaking"))
        assert ring.wait(5)
        assert not ring.wait(0.2)


def test_an_attempt_recorded_and_ended_ring_the_bell(job_id: str) -> None:
    log = AttemptLog(app.backend.client, job_id, ttl=60)
    with bell(job_id) as ring:
        live(ring)
        attempt = Attempt(0, "a", retries=0, worker="w@h")
        index = log.append(attempt)
        assert ring.wait(5)
        attempt.outcome = Outcome.OK
        assert log.finish(index, attempt, app.backend.get_key_for_task(job_id).decode())
        assert ring.wait(5)
        pending = log.append_behind(Attempt(0, "a", retries=1, worker="w@h"))
        assert ring.wait(5)
        assert pending.index() == 1


@pytest.mark.parametrize("state", ["SUCCESS", "RETRY", "FAILURE", "REVOKED"])
def test_each_stored_state_rings_the_bell(job_id: str, state: str) -> None:
    with bell(job_id, kinds=()) as ring:
        live(ring)
        if state == "SUCCESS":  # a farm job's envelope: the backend's own script for it
            app.backend.store_result(job_id, {"job_id": job_id, "attempts": [{"rung": 0}]}, state)
        elif state == "REVOKED":
            app.backend.mark_as_revoked(job_id, "cancelled in a test")
        else:
            app.backend.store_result(job_id, RuntimeError("a test"), state)
        assert ring.wait(5)


def test_an_awaited_bell_wakes_its_loop(job_id: str) -> None:
    async def follow() -> tuple[bool, bool, float]:
        with bell(job_id) as ring:
            assert await ring.changed(5)  # live
            while await ring.changed(0.2):
                pass
            quiet = await ring.changed(0.2)
            loop = asyncio.get_running_loop()
            loop.call_later(0.1, lambda: JobChannel(app.backend.client, job_id, ttl=60).publish({"x": 1}))
            started = time.monotonic()
            woken = await ring.changed(5)
            return quiet, woken, time.monotonic() - started

    quiet, woken, waited = asyncio.run(follow())
    assert not quiet and woken and waited < 2


def test_a_ring_with_no_one_waiting_is_kept_for_the_next_wait(job_id: str) -> None:
    with bell(job_id) as ring:
        live(ring)
        JobChannel(app.backend.client, job_id, ttl=60).publish({"x": 1})
        time.sleep(0.3)  # rung meanwhile
        assert ring.wait(0)


def test_two_bells_of_one_job_both_ring_and_the_channel_goes_with_the_last(job_id: str) -> None:
    first = bell(job_id)
    live(first)
    second = bell(job_id)
    assert second.wait(1)  # its channel was live already: it rings at once for its first read
    JobChannel(app.backend.client, job_id, ttl=60).publish({"x": 1})
    assert first.wait(5) and second.wait(5)
    first.close()
    assert subscribers(keys.bell(job_id)) == 1
    second.close()
    deadline = time.monotonic() + 5
    while subscribers(keys.bell(job_id)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert subscribers(keys.bell(job_id)) == 0


def test_a_bell_dropped_unclosed_has_its_channels_swept(job_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bells, "_SWEEP_S", 0.2)
    monkeypatch.setattr(bells, "_LISTEN_S", 0.1)
    listener = BellListener(app.backend.client)
    ring = listener.bell(job_id)
    live(ring)
    assert subscribers(keys.bell(job_id)) == 1
    del ring  # a stream whose response never started: nobody closes its bell
    deadline = time.monotonic() + 5
    while subscribers(keys.bell(job_id)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert subscribers(keys.bell(job_id)) == 0


def test_a_lost_subscriber_connection_rings_every_bell_and_subscribes_again(job_id: str) -> None:
    listener = BellListener(app.backend.client)
    with listener.bell(job_id) as ring:
        live(ring)
        host, port = listener._pubsub.connection._sock.getsockname()[:2]
        app.backend.client.client_kill_filter(addr=f"{host}:{port}")
        assert ring.wait(5), "a lost connection rings: a push may have been missed"
        deadline = time.monotonic() + 10
        while subscribers(keys.bell(job_id)) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        while ring.wait(0.2):  # the new subscription's own rings
            pass
        JobChannel(app.backend.client, job_id, ttl=60).publish({"after": "reconnect"})
        assert ring.wait(5), "subscribed again on the new connection"


def test_a_bell_rings_only_for_the_changes_its_follower_reads_and_always_for_the_end(job_id: str) -> None:
    channel = JobChannel(app.backend.client, job_id, ttl=60)
    with bell(job_id, kinds=("partial",)) as ring:
        live(ring)
        channel.report(Progress(fraction=0.5, stage="speaking"))
        AttemptLog(app.backend.client, job_id, ttl=60).append(Attempt(0, "a", retries=0, worker="w@h"))
        assert not ring.wait(0.3), "progress and attempts are not this follower's"
        channel.publish({"chunk": 0})
        assert ring.wait(5)
        app.backend.store_result(job_id, {"job_id": job_id, "attempts": []}, "SUCCESS")  # a farm envelope
        assert ring.wait(5), "the stored state rings every bell"


def test_opening_a_bell_never_waits_on_redis_even_when_it_is_away() -> None:
    import socket

    import redis

    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listener = BellListener(redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=5))
    started = time.monotonic()
    ring = listener.bell("away")
    opened = time.monotonic() - started
    assert opened < 0.1, f"opening took {opened:.2f} s: it talked to Redis"
    # Its listener's thread meets the refused connection (and may ring every bell: read again);
    # the follower is not held up, and closing does not wait either.
    ring.wait(0.2)
    started = time.monotonic()
    ring.close()
    assert time.monotonic() - started < 0.1
