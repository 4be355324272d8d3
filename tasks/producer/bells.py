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
connection and one thread per process serve every bell; that thread alone talks to Redis.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import threading
import time
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from mediafarm.tasks.wire import keys

log = logging.getLogger("mediafarm.bells")

# The longest the listener waits between two turns with nothing to read and no bell opened or closed.
_LISTEN_S = 1.0
# How often the listener forgets the channels of bells dropped without being closed, when no bell
# opened or closed meanwhile made it look sooner.
_SWEEP_S = 5.0
# After a lost connection: how long before it listens again (redis-py subscribes anew as it reconnects).
_RETRY_S = 0.5


class Bell:
    """One follower's bell for one job: rung when the job changed since the last wait.

    ``wait`` blocks (call it from a thread); ``changed`` awaits (on an asyncio loop); either returns
    True when the bell rang, False after ``timeout`` seconds of silence. A ring that comes while no
    one waits is kept for the next wait. ``close`` (or leaving the ``with``) unsubscribes.
    ``kinds``: the changes that ring it (``keys.BELL_KINDS``); the job's stored state always does.
    """

    def __init__(self, listener: BellListener, channel: str, kinds: frozenset[str]) -> None:
        self._listener, self.channel, self.kinds = listener, channel, kinds
        self._cond = threading.Condition()
        self._rung = False
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._unconfirmed = False  # its channel's subscription is not live yet
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

    def _confirmed(self) -> None:
        """Its channel's subscription is live: the bell rings (once), for the read that closes the
        gap between the follower's first look and the subscription."""
        with self._cond:
            if not self._unconfirmed:
                return
            self._unconfirmed = False
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

    The thread is the connection's only user (redis-py's ``PubSub`` is not safe across threads):
    opening and closing a bell touch only this object's own sets and wake the thread through a
    pipe, so a follower on an event loop never waits on Redis here. Each turn the thread
    subscribes the channels bells hold that the connection lacks (a channel whose SUBSCRIBE failed
    is tried again the next turn), unsubscribes those no bell holds, and reads what came.

    Its channels are those of the bells open now; a channel's last bell closing unsubscribes it,
    and so does its last bell's being dropped unclosed (a stream whose response never started):
    bells are held weakly, and the thread forgets the channels whose bells are gone.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._bells: dict[str, weakref.WeakSet[Bell]] = {}
        self._live: set[str] = set()  # channels whose subscription Redis confirmed on this connection
        self._changed = False  # a bell opened or closed since the thread last followed them
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread: threading.Thread | None = None
        self._pubsub: Any = None

    def bell(self, job_id: str, kinds: Iterable[str] = keys.BELL_KINDS) -> Bell:
        """A bell for ``job_id``, rung by the ``kinds`` of change and by its stored state."""
        bell = Bell(self, keys.bell(job_id), frozenset(kinds))
        with self._lock:
            self._bells.setdefault(bell.channel, weakref.WeakSet()).add(bell)
            self._changed = True
            live = bell.channel in self._live
            bell._unconfirmed = not live
            if self._thread is None:
                self._thread = threading.Thread(target=self._listen, name="mediafarm-bells", daemon=True)
                self._thread.start()
        if live:
            bell.ring()  # its channel is live already: nothing to wait for before the first read
        else:
            self._wake()
        return bell

    def forget(self, bell: Bell) -> None:
        with self._lock:
            self._bells.get(bell.channel, weakref.WeakSet()).discard(bell)
            self._changed = True
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"w")
        except BlockingIOError:
            pass  # the pipe is full: the thread has wake-ups enough waiting

    def _ring(self, channel: str | None, kind: str = "") -> None:
        """Ring the bells of ``channel`` that ``kind`` of change rings ('': every one), or every
        bell (``channel`` None)."""
        with self._lock:
            if channel is None:
                bells = [b for held in self._bells.values() for b in held]  # a bell has one channel
            else:
                bells = list(self._bells.get(channel, ()))
        for bell in bells:
            if not kind or kind == keys.BELL_STATE or kind in bell.kinds:
                bell.ring()

    def _confirmed(self, channel: str) -> None:
        """Redis confirmed a subscription: the bells waiting for it ring. A channel confirmed again
        was subscribed anew by redis-py on a connection it made again: what was published in
        between is lost, so each of its bells rings."""
        with self._lock:
            again = channel in self._live
            self._live.add(channel)
            bells = list(self._bells.get(channel, ()))
        for bell in bells:
            if again:
                bell.ring()
            else:
                bell._confirmed()

    def _listen(self) -> None:
        # It never ends: a process that followed one job will likely follow another.
        pubsub = self._pubsub = self.client.pubsub()  # an attribute to look at, used by this thread alone
        failing, swept = False, time.monotonic()
        while True:
            try:
                # Only when bells opened or closed (a turn per message must not scan them all), or
                # now and then for bells dropped unclosed.
                if self._changed or time.monotonic() - swept >= _SWEEP_S:
                    swept = time.monotonic()
                    self._follow_held(pubsub)
                self._read(pubsub)
                if failing:
                    failing = False
                    log.info("job bells: subscriber connection back")
                self._wait(pubsub)
            except Exception as exc:  # noqa: BLE001 - this thread must outlive any one failure
                # Redis away, a connection cut, or a reply it could not parse: whatever came in
                # meanwhile was missed, so every follower reads again; redis-py subscribes its
                # channels anew as it reconnects, and the next turn adds any it lacks.
                with self._lock:
                    self._live.clear()
                    self._changed = True  # a SUBSCRIBE that failed is sent again next turn
                # Once an outage, not every half second of it.
                log.log(logging.DEBUG if failing else logging.WARNING,
                        "job bells: subscriber connection lost (%s: %s); every follower reads again",
                        type(exc).__name__, exc)  # fmt: skip
                failing = True
                self._ring(None)
                if pubsub.connection is not None:
                    pubsub.connection.disconnect()  # the next read connects again, and subscribes anew
                time.sleep(_RETRY_S)

    def _follow_held(self, pubsub: Any) -> None:
        """Subscribe what the bells hold and the connection lacks; unsubscribe what none holds (all
        its bells closed, or dropped unclosed), and forget it."""
        with self._lock:
            self._changed = False
            held = {c for c, bells in self._bells.items() if bells}
            for channel in [c for c, bells in self._bells.items() if not bells]:
                del self._bells[channel]
        subscribed = {c.decode() if isinstance(c, bytes) else c for c in pubsub.channels}
        pending = {c.decode() if isinstance(c, bytes) else c for c in pubsub.pending_unsubscribe_channels}
        if missing := sorted(held - subscribed):
            pubsub.subscribe(*missing)
        if held & pending:  # reopened while its UNSUBSCRIBE is answered: subscribe it once that is in
            with self._lock:
                self._changed = True
        if gone := sorted(subscribed - held - pending):
            with self._lock:
                self._live.difference_update(gone)
            pubsub.unsubscribe(*gone)

    def _read(self, pubsub: Any) -> None:
        """Handle every message already here (on the socket or in redis-py's buffer), without waiting."""
        for _ in range(10_000):  # a bound, so that a stream of messages cannot hold off the next turn
            if pubsub.connection is None or not pubsub.connection.can_read(timeout=0):
                return
            message = pubsub.get_message(timeout=0)
            if message:
                self._handle(message)
            elif not pubsub.subscribed:
                return  # redis-py reads nothing on a connection with no channel

    def _wait(self, pubsub: Any) -> None:
        """Until the connection has something to read, a bell opened or closed, or ``_LISTEN_S``."""
        sock = getattr(pubsub.connection, "_sock", None) if pubsub.connection is not None else None
        ready, _, _ = select.select([self._wake_r] + ([sock] if sock is not None else []), [], [], _LISTEN_S)
        if self._wake_r in ready:
            while True:
                try:
                    if not os.read(self._wake_r, 4096):
                        break
                except BlockingIOError:
                    break

    def _handle(self, message: dict[str, Any]) -> None:
        channel = message.get("channel")
        if isinstance(channel, bytes):
            channel = channel.decode()
        if not isinstance(channel, str):
            return
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
