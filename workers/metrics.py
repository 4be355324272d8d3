"""Prometheus metrics of a worker's main process, served on ``FARM_METRICS_PORT`` (0: off).

Task states and runtimes come from Flower's ``/metrics``; these are what only the farm knows:
which children it killed and why, and how close the children run to their cap.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, start_http_server

CHILD_KILLS = Counter(
    "mediafarm_child_kills_total", "Pool children SIGKILLed by the farm's watchdog", ["pool", "reason"]
)
CHILD_RSS_MAX = Gauge(
    "mediafarm_child_rss_max_bytes", "Largest RSS among the pool's children at the last watchdog poll", ["pool"]
)
CHILD_RSS_CAP = Gauge("mediafarm_child_rss_cap_bytes", "The pool's per-child RSS cap", ["pool"])


def serve(port: int) -> None:
    """Expose the metrics over HTTP on loopback-or-all as the operator binds the container."""
    if port:
        start_http_server(port)
