"""The webhook dispatcher: posts the events jobs put in the outbox (``tasks.producer.webhooks``), signed.

Where it runs: a process of its own, which every worker's main process starts beside itself as
it becomes ready (``install``) and which ends when that worker ends (its stdin is a pipe from
the worker: EOF, even after a SIGKILL of the worker, stops it). Not a thread of the worker's
main process: a post may wait 10 s on a receiver, and a thread there would hold the fork gate
(``workers.fork_gate``) that long, or post outside it and risk a child forked mid-import. Not the
job's child: the watchdog kills children. What is pending lives in Redis, never here, so a
dispatcher killed mid-try loses nothing: its lease on the job lapses and another worker's
dispatcher tries the same event again, with the same ``webhook-id``. ``farm webhooks serve``
runs one on a host with no worker.

Each try: the URL's host is resolved and every address checked against the private-address rule
(``tasks.wire.outbound.refused_address``), the connection made to the checked address (no second
lookup a DNS rebinding could answer otherwise), the body posted with the Standard Webhooks
headers; a 2xx within ``TIMEOUT_S`` is delivered, a 410 drops the job's pending events, anything
else is tried again after the next delay of ``FARM_WEBHOOK_RETRY_SCHEDULE``. Redirects are not
followed.
"""

from __future__ import annotations

import http.client
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

from standardwebhooks import Webhook

from mediafarm.config.settings import FarmSettings, get_settings
from mediafarm.tasks.producer.webhooks import Outbox
from mediafarm.tasks.wire.outbound import Refused, pinned_connection, request_target

log = logging.getLogger("mediafarm.webhooks")

TIMEOUT_S = 10.0  # a 2xx within this is success
# A job leased by a dispatcher is left to it this long: a try's lookup, connect and 10 s answer fit.
LEASE_S = 60.0
IDLE_POLL_S = 0.5
NONFINAL_RETRIES = 2
USER_AGENT = "mediafarm-webhooks/1"


def signature(secrets: Sequence[str], msg_id: str, timestamp: int, body: str) -> str:
    """The ``webhook-signature`` header: one ``v1,<base64>`` per secret, space-separated (the
    Standard Webhooks rule for several signatures, which a rotation needs)."""
    when = datetime.fromtimestamp(timestamp, tz=timezone.utc)
    return " ".join(Webhook(secret).sign(msg_id, when, body) for secret in secrets)


def post(url: str, body: bytes, headers: dict[str, str], allow: Sequence[str], timeout: float = TIMEOUT_S) -> int:
    """POST ``body`` to ``url``; the HTTP status. Raises Refused, OSError, http.client errors."""
    parts = urlsplit(url)
    connection = pinned_connection(parts, allow, timeout)
    try:
        connection.request("POST", request_target(parts), body=body, headers=headers)
        response = connection.getresponse()
        response.read(64 * 1024)
        return response.status
    finally:
        connection.close()


class Dispatcher:
    """Takes due events from the outbox and tries them, one job at a time per sender."""

    def __init__(self, client: Any, settings: FarmSettings) -> None:
        self.outbox = Outbox(client)
        self.settings = settings
        self._warned_unsigned = False

    def once(self) -> bool:
        """Try the most overdue event, if any; True if there was one."""
        claimed = self.outbox.claim(LEASE_S)
        if claimed is None:
            return False
        job_id, event = claimed
        self.deliver(job_id, event)
        return True

    def deliver(self, job_id: str, event: dict[str, Any]) -> None:
        secrets = self.settings.webhook_secret
        tries = int(event.get("tries", 0)) + 1
        entry: dict[str, Any] = {"event": event["id"], "type": event.get("type"), "try": tries, "at": time.time(),
                                 "url": event["url"], "status": None, "latency_s": None, "error": ""}  # fmt: skip
        if not secrets:
            if not self._warned_unsigned:
                log.error("FARM_WEBHOOK_SECRET is not set: webhook events wait, none is sent unsigned")
                self._warned_unsigned = True
            entry.update(result="retry", error="FARM_WEBHOOK_SECRET is not set on the dispatcher")
            self.outbox.settle(job_id, event, "retry", entry, retry_in=60.0)  # not a try: the farm's fault
            return
        now = int(time.time())
        body = event["body"]
        headers = {"webhook-id": event["id"], "webhook-timestamp": str(now),
                   "webhook-signature": signature(secrets, event["id"], now, body),
                   "content-type": "application/json", "user-agent": USER_AGENT}  # fmt: skip
        started = time.monotonic()
        status: int | None = None
        try:
            status = post(event["url"], body.encode(), headers, self.settings.webhook_allow)
        except Refused as exc:
            entry["error"] = f"refused: {exc}"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
        entry["latency_s"] = round(time.monotonic() - started, 3)
        entry["status"] = status
        if status is not None and 200 <= status < 300:
            result, delay = "delivered", 0.0
        elif status == 410:
            result, delay = "gone", 0.0
        elif entry["error"].startswith("refused"):
            result, delay = "gave-up", 0.0
        else:
            delay = self.delay_after(tries, bool(event.get("final")))
            result = "gave-up" if delay < 0 else "retry"
            if status is not None:
                entry["error"] = f"HTTP {status}"
        entry["result"] = result
        if result == "retry":
            entry["next_in_s"] = delay
        if result != "delivered":
            log.warning("webhook %s of job %s to %s: try %d: %s (%s)", event["id"], job_id, event["url"], tries,
                        entry["error"] or status, result)  # fmt: skip
        self.outbox.settle(job_id, {**event, "tries": tries}, result, entry, retry_in=max(delay, 0.0))

    def delay_after(self, tries: int, final: bool) -> float:
        """Seconds before the next try after ``tries`` failed ones; -1: no more tries."""
        schedule = self.settings.webhook_retry_schedule
        allowed = len(schedule) if final else min(NONFINAL_RETRIES, len(schedule))
        return float(schedule[tries - 1]) if tries <= allowed else -1.0

    def serve(self, stop: threading.Event) -> None:
        """Deliver until ``stop`` is set, with ``FARM_WEBHOOK_SENDERS`` senders."""
        senders = [threading.Thread(target=self._sender, args=(stop,), name=f"webhook-sender-{i}", daemon=True)
                   for i in range(self.settings.webhook_senders)]  # fmt: skip
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()

    def _sender(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                busy = self.once()
            except Exception:  # noqa: BLE001 - a Redis outage: wait and try again, never die
                log.warning("webhook dispatcher: could not reach the outbox", exc_info=True)
                busy = False
                stop.wait(2.0)
            if not busy:
                stop.wait(IDLE_POLL_S)


def run(stop: threading.Event, settings: FarmSettings | None = None) -> None:
    """Serve the farm's outbox until ``stop`` is set (``farm webhooks serve``, the worker's dispatcher)."""
    import redis

    settings = settings or get_settings()
    client = redis.Redis.from_url(settings.backend_url, socket_timeout=5, socket_connect_timeout=5)
    if not settings.webhook_secret:
        log.warning("FARM_WEBHOOK_SECRET is not set: webhook events will wait until it is")
    Dispatcher(client, settings).serve(stop)


def main() -> None:
    """``python -m mediafarm.workers.webhook_dispatch``, as a worker starts it: until stdin closes."""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s: %(levelname)s/webhooks] %(message)s")
    stop = threading.Event()

    def watch_parent() -> None:
        sys.stdin.buffer.read()  # EOF: the worker ended (or was killed)
        stop.set()

    threading.Thread(target=watch_parent, name="webhook-parent", daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    run(stop)


_PROCESS: dict[str, Any] = {}


def dispatcher_pids() -> set[int]:
    """The pid of the dispatcher this worker started (none if none): not a pool child, which the
    watchdog must leave alone."""
    process = _PROCESS.get("process")
    return {process.pid} if process is not None else set()


def install(app: Any) -> None:
    """Start a dispatcher beside the worker as it becomes ready, stop it as the worker stops."""
    from celery.signals import worker_ready, worker_shutdown

    @worker_ready.connect(weak=False)
    def _start(**_: Any) -> None:
        settings = get_settings()
        if not settings.webhook_dispatch or _PROCESS.get("process") is not None:
            return
        if not settings.webhook_secret:
            # Nothing could be signed: a dispatcher would only poll Redis (a process of ~50 MB a
            # worker). Events wait in their outboxes for a worker started with a secret.
            log.warning("no webhook dispatcher: FARM_WEBHOOK_SECRET is not set (webhook events wait until a worker "
                     "or `farm webhooks --serve` has it)")  # fmt: skip
            return
        import subprocess

        _PROCESS["process"] = subprocess.Popen(
            [sys.executable, "-m", "mediafarm.workers.webhook_dispatch"], stdin=subprocess.PIPE, close_fds=True
        )

    @worker_shutdown.connect(weak=False)
    def _stop(**_: Any) -> None:
        process = _PROCESS.get("process")
        if process is None:
            return
        try:
            process.stdin.close()
            process.wait(timeout=3)
        except Exception:  # noqa: BLE001 - stopping: whatever is left goes with a kill
            process.kill()


if __name__ == "__main__":
    main()
