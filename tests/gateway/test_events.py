"""Server-Sent Events of a job: what a stream holds, and a dropped stream resumed with Last-Event-ID
holding exactly what an uninterrupted one does (real gateway, Redis and worker), plus the cursor
rules on made-up snapshots."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from mediafarm.tasks.producer.handles import Snapshot
from mediafarm.tasks.producer.job_feed import Cursor, Follower, advance
from tests.support.sse import SseEvent, SseStream, read_events


def attempt(outcome: str | None, rung: int = 0) -> dict[str, Any]:
    return {"rung": f"r{rung}", "rung_index": rung, "variant": f"r{rung}", "outcome": outcome}


def test_a_cursor_round_trips_and_refuses_what_the_gateway_never_sent() -> None:
    cursor = Cursor(ended=2, opened=True, owner=2, partials=17)
    assert Cursor.parse(cursor.encode()) == cursor and cursor.encode() == "2.1.2.17"
    for bad in ("", "end", "1.2.3", "1.2.3.4", "a.0.0.0", "1.0.0.0.0", "9999999.0.0.0"):
        with pytest.raises(ValueError, match="not an event id of this gateway"):
            Cursor.parse(bad)


def test_events_are_cut_anywhere_and_resumed_without_loss_or_repeat() -> None:
    # A job's life as a polling gateway may see it: running with partials, killed, next rung, done.
    life = [
        Snapshot("PENDING", (), ()),
        Snapshot("STARTED", (attempt(None),), ()),
        Snapshot("STARTED", (attempt(None),), ("a", "b")),
        Snapshot("STARTED", (attempt(None),), ("a", "b", "c")),
        Snapshot("RETRY", (attempt("oom"),), ("a", "b", "c", "d")),
        Snapshot("STARTED", (attempt("oom"), attempt(None, 1)), ()),
        Snapshot("STARTED", (attempt("oom"), attempt(None, 1)), ("A",)),
        Snapshot("SUCCESS", (attempt("oom"), attempt("ok", 1)), ("A", "B"), envelope={"output": 1}),
    ]

    def run(snapshots: list[Snapshot], cursor: Cursor) -> list[Any]:
        follower = Follower(cursor, clock=lambda: 0.0)
        return [e for s in snapshots for e in follower.feed(s)]

    def story(events: list[Any]) -> list[tuple[str, Any]]:
        return [(e.kind, e.data) for e in events if e.id is not None]

    whole = story(run(life, Cursor()))
    assert [k for k, _ in whole] == ["attempt", "partial", "partial", "partial", "partial", "attempt", "attempt",
                                     "partial", "partial", "attempt", "end"]  # fmt: skip
    assert [d["output"] for k, d in whole if k == "partial"] == ["a", "b", "c", "d", "A", "B"]
    assert [(d["index"], d["outcome"]) for k, d in whole if k == "attempt"] == [(0, None), (0, "oom"), (1, None),
                                                                                 (1, "ok")]  # fmt: skip
    for cut in range(1, len(life)):
        first = run(life[:cut], Cursor())
        ids = [e.id for e in first if e.id is not None]
        resumed = run(life[cut:], Cursor.parse(ids[-1]) if ids else Cursor())
        assert story(first) + story(resumed) == whole, cut
        # The resumed stream starts with the latest state: coalesced, no id.
        assert resumed[0].kind == "state" and resumed[0].id is None


def test_an_ended_job_whose_attempt_is_still_open_waits_for_it_then_ends_anyway() -> None:
    now = [0.0]
    follower = Follower(Cursor(), clock=lambda: now[0], settle_for=5.0)
    revoked_early = Snapshot("REVOKED", (attempt(None),), (), failure={"kind": "cancelled", "reason": "x"})
    assert "end" not in [e.kind for e in follower.feed(revoked_early)]
    now[0] = 1.0
    settled = Snapshot("REVOKED", (attempt("cancelled"),), (), failure={"kind": "cancelled", "reason": "x"})
    events = follower.feed(settled)
    assert [e.kind for e in events] == ["attempt", "end"] and follower.done
    never = Follower(Cursor(), clock=lambda: now[0], settle_for=5.0)
    never.feed(revoked_early)
    now[0] = 7.0
    assert [e.kind for e in never.feed(revoked_early)][-1] == "end"


def test_partials_of_an_older_attempt_than_the_clients_are_not_sent_again() -> None:
    events, cursor = advance(Cursor(ended=1, owner=1, partials=0), Snapshot("STARTED", (attempt("oom"),), ("x",)))
    assert events == [] and cursor == Cursor(ended=1, owner=1, partials=0)


# --- over HTTP -----------------------------------------------------------------------------------


def stream(client: httpx.Client, job_id: str, last_id: str | None = None, stop: Any = None) -> SseStream:
    headers = {"Last-Event-ID": last_id} if last_id else {}
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        return read_events(response.iter_lines(), stop or (lambda e: False))


def numbered(events: list[SseEvent]) -> list[tuple[str, str, str]]:
    return [(e.id, e.event, e.data) for e in events if e.id is not None]


@pytest.mark.integration
def test_a_dropped_stream_resumed_with_last_event_id_loses_and_repeats_nothing(cpu_worker, client) -> None:
    words = [f"w{i}" for i in range(14)]
    job_id = client.post("/v1/jobs/toy", json={"text": " ".join(words), "word_pause": 0.15}).json()["id"]
    whole: list[SseStream] = []
    reader = threading.Thread(target=lambda: whole.append(stream(client, job_id)))
    reader.start()
    # Another client reads until it has three partial outputs, and its connection drops.
    first = stream(client, job_id, stop=lambda e: e.event == "partial" and e.json()["index"] == 2)
    time.sleep(0.5)  # the job goes on while it is away
    second = stream(client, job_id, last_id=first.last_id)
    reader.join(60)
    [uninterrupted] = whole
    assert numbered(first.events) + numbered(second.events) == numbered(uninterrupted.events)
    ids = [i for i, _, _ in numbered(first.events) + numbered(second.events)]
    assert len(ids) == len(set(ids))
    partials = [e.json() for e in uninterrupted.events if e.event == "partial"]
    assert [(p["attempt"], p["index"], p["output"]["word"]) for p in partials] == [
        (0, i, w.upper()) for i, w in enumerate(words)
    ]
    # The resumed stream picked up where the first stopped, with the latest state and progress first.
    assert second.events[0].event == "state" and second.events[0].id is None
    assert [e.json()["index"] for e in second.events if e.event == "partial"][0] == 3
    end = uninterrupted.events[-1]
    assert end.event == "end" and end.id == "end" and end.json()["result"]["output"]["engine"] == "stream"
    assert any(e.event == "progress" for e in uninterrupted.events)
    # A quiet stream has heartbeats (every 0.3 s in these tests): comments a proxy sees traffic in.
    assert uninterrupted.comments, "no heartbeat in a stream of ~2 s"
    # After the end, a reconnecting EventSource is told there is nothing more (204), and an id the
    # gateway never sent is refused.
    assert client.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "end"}).status_code == 204
    bad = client.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "7"})
    assert bad.status_code == 400 and "not an event id" in bad.json()["detail"]


@pytest.mark.integration
def test_a_downgrade_is_told_as_an_attempt_ending_and_the_next_one_starting(cpu_worker, client) -> None:
    job_id = client.post("/v1/jobs/toy", json={"text": "a b c d e", "fail_after": 3, "word_pause": 0.1}).json()["id"]
    events = stream(client, job_id).events
    attempts = [(e.json()["index"], e.json()["variant"], e.json()["outcome"]) for e in events if e.event == "attempt"]
    assert attempts[-3:] == [(0, "streaming", "oom"), (1, "plain", None), (1, "plain", "ok")] or attempts[-2:] == [
        (0, "streaming", "oom"), (1, "plain", "ok")]  # fmt: skip
    # Partial outputs of the first attempt come before its end; none is told twice.
    kinds = [(e.event, e.json().get("attempt")) for e in events if e.event in ("partial", "attempt")]
    oom_at = next(i for i, e in enumerate(events) if e.event == "attempt" and e.json()["outcome"] == "oom")
    assert all(e.json()["attempt"] == 0 for e in events[:oom_at] if e.event == "partial") and kinds
    assert not [e for e in events[oom_at:] if e.event == "partial"]  # the plain rung streams nothing
    ids = [e.id for e in events if e.id]
    assert len(ids) == len(set(ids)) and events[-1].event == "end"
    assert events[-1].json()["result"]["variant"] == "plain"


@pytest.mark.integration
def test_a_rejected_job_ends_with_its_failure(cpu_worker, client) -> None:
    job_id = client.post("/v1/jobs/toy", json={"text": "this is forbidden"}).json()["id"]
    end = stream(client, job_id).events[-1]
    assert end.event == "end" and end.json()["state"] == "FAILURE"
    assert end.json()["failure"]["kind"] == "rejected"
    assert "ToyRejected: the word 'forbidden' is not allowed" in end.json()["failure"]["reason"]
