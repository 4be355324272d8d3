"""A producer process of its own, for the routing tests: submits jobs to the farm its environment
names (FARM_BROKER_URL ...), waits for each, and prints one JSON line per job: its id and envelope,
or the error its wait raised.

tests/integration/test_routing.py runs it against two workers on a Redis database of their own, so
that the session's other workers, which also take subtitle jobs, are no part of that cluster.

    python -m tests.support.route_producer '{"family": "subtitle", "fields": {...}, "ids": [...]}'
"""

from __future__ import annotations

import json
import sys

from mediafarm.tasks.producer.client import submit


def main(order: str) -> None:
    spec = json.loads(order)
    handles = [submit(spec["family"], job_id=job_id, **spec["fields"]) for job_id in spec["ids"]]
    for handle in handles:
        try:
            line = {"id": handle.id, "envelope": handle.wait(timeout=float(spec.get("timeout", 180)))}
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails naming it
            line = {"id": handle.id, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
