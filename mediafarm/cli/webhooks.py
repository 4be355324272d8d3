"""``farm webhooks``: a job's webhook deliveries, a farm secret, a dispatcher of its own.

Registered on the CLI by ``cli/app.py``. The log is read from Redis (``tasks.producer.webhooks.Outbox``);
the dispatcher is the one every worker starts (``workers.webhook_dispatch``), here for a host that
runs none (a gateway-only host), or a worker started with FARM_WEBHOOK_DISPATCH=0. Only ``--serve``
imports it (and the worker side it needs): listing a job's deliveries is a producer's command.
"""

from __future__ import annotations

import base64
import secrets
import signal
import threading
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def webhooks(
    job_id: Annotated[str | None, typer.Argument(help="The job whose deliveries to list")] = None,
    serve: Annotated[bool, typer.Option("--serve", help="Run a webhook dispatcher until Ctrl-C")] = False,
    new_secret: Annotated[bool, typer.Option("--new-secret", help="Print a new FARM_WEBHOOK_SECRET value")] = False,
) -> None:
    """A job's webhook deliveries (each try: status, latency, result), or --serve, or --new-secret."""
    if new_secret:
        console.print("whsec_" + base64.b64encode(secrets.token_bytes(32)).decode(), highlight=False)
        return
    from mediafarm.config.settings import get_settings

    if not get_settings().backend_url:
        console.print("[red]error:[/] FARM_BROKER_URL is not set: point it at the farm's Redis")
        raise typer.Exit(2)
    if serve:
        from mediafarm.workers.webhook_dispatch import run

        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        console.print("webhook dispatcher: delivering until Ctrl-C")
        run(stop)
        return
    if job_id is None:
        console.print("name a job, or --serve, or --new-secret (farm webhooks --help)")
        raise typer.Exit(2)
    from mediafarm.tasks.producer.client import handle

    tries, pending = handle(job_id).webhook_deliveries()
    if not tries and not pending:
        console.print(f"{job_id}: no webhook delivery (none asked for, none due yet, or expired)")
        return
    table = Table("at (UTC)", "event", "try", "status", "latency", "result", "error")
    for t in tries:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t["at"]))
        latency = f"{t['latency_s']:.3f} s" if t.get("latency_s") is not None else "-"
        table.add_row(at, str(t.get("type")), str(t.get("try")), str(t.get("status") or "-"), latency,
                      str(t.get("result")), t.get("error") or "")  # fmt: skip
    console.print(table)
    for e in pending:
        console.print(f"pending: {e['type']} {e['id']} ({e.get('tries', 0)} tries so far)", highlight=False)
