"""Prometheus in the cluster: every scrape target up (its HTTP API), and each query of the
provisioned Grafana dashboard returns a series once the jobs of test_jobs.py have run. Grafana has
no image where no registry answers, so its queries are run on Prometheus, the data source it names."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.cluster.conftest import Cluster
from tests.conftest import REPO

pytestmark = pytest.mark.cluster

DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "mediafarm.json"
# Series this cluster cannot have, and why: it has no GPU, and these count events that the CPU
# jobs here do not cause (no breaker opened, nothing refused, no child over its cap).
NOT_HERE = {
    "mediafarm_gpu_memory_used_bytes": "no GPU in the CPU cluster",
    "mediafarm_gpu_memory_total_bytes": "no GPU in the CPU cluster",
    "mediafarm_gpu_allocator_fragmentation": "no GPU in the CPU cluster",
    "mediafarm_gpu_allocator_reserved_bytes": "no GPU in the CPU cluster",
    "mediafarm_breaker_state": "no rung failed often enough to open a breaker",
    "mediafarm_breaker_openings": "no rung failed often enough to open a breaker",
    "mediafarm_admission_refusals_total": "admission control refused nothing",
    "mediafarm_child_kills_total": "no child passed its RSS cap",
    'mediafarm_attempts_total{outcome=~"killed|oom|cuda_oom|timeout"}': "no attempt was killed",
}


def queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]


def query(cluster: Cluster, expr: str) -> list[dict]:
    # Grafana's own interval variables, as it would fill them in.
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "30s").replace("$__range", "1h")
    answer = httpx.get(cluster.urls["prometheus"] + "/api/v1/query", params={"query": expr}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["data"]["result"]


def test_every_scrape_target_is_up(cluster: Cluster) -> None:
    # The workers are found by DNS every 30 s (deploy/prometheus/prometheus.yml): a refresh while the
    # fault tests had the worker down leaves the job with no target until the next one.
    jobs = {"mediafarm-workers", "mediafarm-gateway", "flower"}
    deadline = time.monotonic() + 90
    while True:
        targets = httpx.get(cluster.urls["prometheus"] + "/api/v1/targets", timeout=30).json()["data"]["activeTargets"]
        health = {(t["labels"]["job"], t["scrapeUrl"]): (t["health"], t["lastError"]) for t in targets}
        found = {job for job, _ in health} == jobs and all(h == "up" for h, _ in health.values())
        if found or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert {job for job, _ in health} == jobs, health
    assert all(h == "up" for h, _ in health.values()), health


@pytest.mark.parametrize("expr", queries())
def test_each_dashboard_query_returns_a_series_after_the_jobs(cluster: Cluster, expr: str) -> None:
    absent = next((why for name, why in NOT_HERE.items() if name in expr), None)
    if absent:
        pytest.skip(f"{expr}: {absent}")
    # rate() needs two scrapes (15 s apart) after a series first appeared.
    deadline = time.monotonic() + 75
    while not (series := query(cluster, expr)) and time.monotonic() < deadline:
        time.sleep(5)
    assert series, f"no series for {expr}"
