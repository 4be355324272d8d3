"""Disarming the soft time limit: the SIGUSR1 billiard sends is ignored until the next job arms it."""

from __future__ import annotations

import os
import signal
import time

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from mediafarm.tasks.runtime import soft_time_limit


def billiard_like_handler(signum, frame):
    raise SoftTimeLimitExceeded()


def deliver() -> None:
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.05)  # the handler runs at the next bytecode boundary


def test_disarmed_the_signal_is_ignored_and_arming_brings_the_limit_back() -> None:
    before = signal.signal(signal.SIGUSR1, billiard_like_handler)
    try:
        with pytest.raises(SoftTimeLimitExceeded):
            deliver()
        soft_time_limit.disarm()
        deliver()  # ignored: no exception
        soft_time_limit.disarm()  # twice is harmless
        soft_time_limit.arm()
        assert signal.getsignal(signal.SIGUSR1) is billiard_like_handler
        with pytest.raises(SoftTimeLimitExceeded):
            deliver()
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_outside_a_billiard_child_nothing_changes() -> None:
    before = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        soft_time_limit.disarm()
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR1, before)
