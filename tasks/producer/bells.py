"""Being woken when a job changes, instead of looking at it again and again.

A job's worker publishes on the job's bell (``keys.bell``) in the same round trip as each write a
follower would see, naming what changed: an attempt recorded or ended (``tasks.wire.history``), a
partial output, progress (``tasks.runtime.context.JobChannel``), the job's stored state
(``tasks.result_backend``). A follower holds a :class:`Bell` for the job it follows and waits on it
between two reads:

    with bell(job.id) as ring:
        while not done:
            ...read the job (JobHandle.snapshot, JobWatch)...
            ring.wait(timeout=1.0)           # or: await ring.changed(timeout=1.0)

It is woken by a push, and it reads the job anyway after ``timeout`` seconds, for whatever a push
cannot promise: a bell rung before its subscription was live (it rings once as the subscription
goes live, so the follower reads the job again at that moment), a connection lost and made again
(every bell rings), a worker of an earlier release that publishes no bells. One subscriber
connection and one thread per process serve every bell; the thread only reads and rings.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from redis.exceptions import RedisError

from mediafarm.tasks.wire import keys

log = logging.getLogger("mediafarm.bells")

# How long the listener waits for a message before it looks whether it has channels left.
_LISTEN_S = 1.0
# How often the listener unsubscribes the channels of bells dropped without being closed.
_SWEEP_S = 5.0
# After a lost connection: how long before it listens again (redis-py subscribes anew as it reconnects).
_RETRY_S = 0.5
# The message the result backend publishes as it stores a job's state: it rings every bell.
STATE = "state"


class Bell:
    """One follower's bell for one job: rung when the job changed since the last wait.

    ``wait`` blocks (call it from a thread); ``changed`` awaits (on an asyncio loop); either returns
    True when the bell rang, False after ``timeout`` seconds of silence. A ring that comes while no
    one waits is kept for the next wait. ``close`` (or leaving the ``with``) unsubscribes.
    ``kinds``: the changes that ring it (``keys.BELL_KINDS``); the job's stored state always does.
    """

    def __init__(self, listener: BellListener, channels: tuple[str, ...], kinds: frozenset[str]) -> None:
        self._listener, self.channels, self.kinds = listener, channels, kinds
        self._cond = threading.Condition()
        self._rung = False
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._unconfirmed: set[str] = set()  # channels whose subscription is not live yet
        self.closed = False

    def ring(self) -> None:
        """Called by the listener's thread (and anyone who knows the job changed)."""
        with self._cond:
            self._rung = True
            self._cond.notify_all()
            waiting = list(self._waiting)
        for loop, event in waiting:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed: its waiter is gone
                pass

    def _confirmed(self, channel: str) -> None:
        """A channel's subscription is live: once all of them are, the bell rings (once), for the
        read that closes the gap between the follower's first look and the subscription."""
        with self._cond:
            if channel not in self._unconfirmed:
                return
            self._unconfirmed.discard(channel)
            if self._unconfirmed:
                return
        self.ring()

    def wait(self, timeout: float) -> bool:
        with self._cond:
            rung = self._cond.wait_for(lambda: self._rung, timeout)
            self._rung = False
        return rung

    async def changed(self, timeout: float) -> bool:
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._cond:
            if self._rung:
                self._rung = False
                return True
            self._waiting.append(entry)
        try:
            await asyncio.wait_for(entry[1].wait(), timeout)
        except TimeoutError:
            pass
        finally:
            with self._cond:
                self._waiting.remove(entry)
                rung, self._rung = self._rung, False
        return rung

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._listener.forget(self)

    def __enter__(self) -> Bell:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class BellListener:
    """One process's subscriber: a pub/sub connection of ``client`` and the thread that reads it.

    Its channels are those of the bells open now; a channel's last bell closing unsubscribes it,
    and so does its last bell's being dropped unclosed (a stream whose response never started):
    bells are held weakly, and the thread sweeps channels whose bells are gone.
    The thread starts with the first bell.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._bells: dict[str, weakref.WeakSet[Bell]] = {}
        self._pubsub: Any = None
        self._thread: threading.Thread | None = None

    def bell(self, job_id: str, kinds: Iterable[str] = keys.BELL_KINDS) -> Bell:
        """A bell for ``job_id``, rung by the ``kinds`` of change and by its stored state."""
        bell = Bell(self, (keys.bell(job_id),), frozenset(kinds))
        with self._lock:
            new = [c for c in bell.channels if c not in self._bells]
            bell._unconfirmed.update(new)
            for channel in bell.channels:
                self._bells.setdefault(channel, weakref.WeakSet()).add(bell)
            if self._pubsub is None:
                self._pubsub = self.client.pubsub()
            try:
                if new:
                    self._pubsub.subscribe(*new)
            except RedisError as exc:
                # The listener's reconnect subscribes every channel it holds; until then the
                # follower's timeout reads the job.
                log.warning("job %s: bell not subscribed yet (%s: %s)", job_id, type(exc).__name__, exc)
            if self._thread is None:
                self._thread = threading.Thread(target=self._listen, name="mediafarm-bells", daemon=True)
                self._thread.start()
        if not new:
            bell.ring()  # its channels were live already: nothing to wait for before the first read
        return bell

    def forget(self, bell: Bell) -> None:
        with self._lock:
            for channel in bell.channels:
                self._bells.get(channel, weakref.WeakSet()).discard(bell)
            self._unsubscribe_unheld()

    def _unsubscribe_unheld(self) -> None:
        """Unsubscribe the channels no bell holds any more (called holding the lock)."""
        gone = [channel for channel, held in self._bells.items() if not held]
        for channel in gone:
            del self._bells[channel]
        if gone and self._pubsub is not None:
            try:
                self._pubsub.unsubscribe(*gone)
            except RedisError:
                pass  # the reconnect subscribes only the channels still held

    def _resubscribe(self) -> None:
        """Subscribe every held channel on a subscriber that never connected (redis-py subscribes
        anew by itself on a connection it made again)."""
        with self._lock:
            if self._pubsub.connection is not None or not self._bells:
                return
            try:
                self._pubsub.subscribe(*self._bells)
            except RedisError:
                pass  # still away: the next look tries again

    def _ring(self, channel: str | None, kind: str = "") -> None:
        """Ring the bells of ``channel`` that ``kind`` of change rings ('': every one), or every
        bell (``channel`` None)."""
        with self._lock:
            if channel is None:
                bells = list({id(b): b for held in self._bells.values() for b in held}.values())
            else:
                bells = list(self._bells.get(channel, ()))
        for bell in bells:
            if not kind or kind == STATE or kind in bell.kinds:
                bell.ring()

    def _confirmed(self, channel: str) -> None:
        with self._lock:
            bells = list(self._bells.get(channel, ()))
        for bell in bells:
            bell._confirmed(channel)

    def _listen(self) -> None:
        # It never ends: a process that followed one job will likely follow another, and a thread
        # that stopped and started again would race a subscribe against its last read.
        pubsub, swept = self._pubsub, time.monotonic()
        while True:
            try:
                message = pubsub.get_message(timeout=_LISTEN_S)  # no channels: waits, reads nothing
            except (RedisError, OSError, ValueError, RuntimeError) as exc:
                # RuntimeError: no connection was ever made (Redis away at the first subscribe).
                log.warning("job bells: subscriber connection lost (%s: %s); every follower reads again",
                            type(exc).__name__, exc)  # fmt: skip
                self._ring(None)
                time.sleep(_RETRY_S)
                self._resubscribe()
                continue
            if time.monotonic() - swept >= _SWEEP_S:  # channels of bells dropped unclosed go
                swept = time.monotonic()
                with self._lock:
                    self._unsubscribe_unheld()
            if not message:
                continue
            channel = message.get("channel")
            if isinstance(channel, bytes):
                channel = channel.decode()
            if not isinstance(channel, str):
                continue
            if message.get("type") == "message":
                data = message.get("data")
                self._ring(channel, data.decode(errors="replace") if isinstance(data, bytes) else str(data))
            elif message.get("type") == "subscribe":
                self._confirmed(channel)


_listeners: dict[int, BellListener] = {}
_listeners_lock = threading.Lock()


def bell(job_id: str, kinds: Iterable[str] = keys.BELL_KINDS) -> Bell:
    """A bell for ``job_id`` from this process's listener (one per process: a forked child makes
    its own), rung by the ``kinds`` of change (``keys.BELL_KINDS``) and by the job's stored state."""
    with _listeners_lock:
        listener = _listeners.get(os.getpid())
        if listener is None:
            from mediafarm.tasks.app import app

            _listeners.clear()  # a forked child's copy of its parent's: not its own
            listener = _listeners[os.getpid()] = BellListener(app.backend.client)
    return listener.bell(job_id, kinds)
