"""Admission control's RabbitMQ depth read when the broker drops the connection (a restart):
the error is one admission takes as "the broker is away", so the job is taken, not a crash
(the gateway's 500, ``farm submit``'s traceback)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from amqp.exceptions import ChannelError, ConnectionForced
from amqp.exceptions import ConnectionError as AmqpConnectionError

from mediafarm.tasks.producer import admission


class ForcedClosed:
    """A pooled RabbitMQ connection the broker closed (``CONNECTION_FORCED``: a restart, an operator)."""

    connection_errors = (AmqpConnectionError, OSError)
    channel_errors = (ChannelError,)

    def channel(self) -> Any:
        raise ConnectionForced("CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'")


class App:
    class pool:  # noqa: N801 - the shape of app.pool
        @staticmethod
        @contextlib.contextmanager
        def acquire(block: bool = True) -> Iterator[ForcedClosed]:
            yield ForcedClosed()


def test_a_connection_the_broker_closed_reads_as_the_broker_away() -> None:
    with pytest.raises(admission.away_errors()):
        admission._depths._amqp(("tts",), App())
