"""Prometheus metrics of the farm (exposed by the worker's metrics port and by Flower's /metrics)."""

from __future__ import annotations

from prometheus_client import Counter

CHILD_KILLS = Counter(
    "mediafarm_child_kills_total", "Pool children SIGKILLed by the farm", ["pool", "reason"]
)
