"""What a worker counts as reserved and running (``workers.load.held``), from a state shaped as
Celery's own (``celery.worker.state``): its sets of requests, by the rules Celery keeps them."""

from __future__ import annotations

from types import SimpleNamespace

from mediafarm.workers.load import held


class FakeRequest:
    def __init__(self, job_id: str) -> None:
        self.id = job_id


def state(*, reserved=(), active=(), scheduled=(), successful=()) -> SimpleNamespace:
    return SimpleNamespace(reserved_requests=set(reserved), active_requests=set(active),
                           scheduled_requests=set(scheduled), successful_requests=set(successful))  # fmt: skip


def test_a_started_job_is_running_and_one_not_started_is_reserved() -> None:
    a, b, c, d = (FakeRequest(x) for x in "abcd")
    # Celery keeps a request among the reserved from delivery to end, among the active once started.
    assert held(state(reserved=[a, b], active=[a])) == (1, 1)
    # A retry waiting out its countdown is held too, not started.
    assert held(state(reserved=[a], active=[a], scheduled=[c])) == (1, 1)
    # A job that ended well, its ack on the way, is neither.
    assert held(state(reserved=[a, d], active=[a, d], successful=["d"])) == (0, 1)
    assert held(state()) == (0, 0)


def test_a_set_changing_under_the_copy_is_read_again() -> None:
    class Flaky(set):
        tries = 0

        def __iter__(self):
            Flaky.tries += 1
            if Flaky.tries == 1:
                raise RuntimeError("Set changed size during iteration")
            return super().__iter__()

    a = FakeRequest("a")
    flaky = state(reserved=[a], active=[a])
    flaky.active_requests = Flaky([a])
    assert held(flaky) == (0, 1) and Flaky.tries >= 2
