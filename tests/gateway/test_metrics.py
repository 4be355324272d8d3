"""GET /metrics on a real gateway: the exposition format, requests counted by route template, and
the token rule (asked for like /v1 by default; FARM_GATEWAY_METRICS_OPEN serves it without)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mediafarm.config.settings import get_settings
from tests.gateway.conftest import TOKEN, gateway_config, running_gateway


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_metrics_need_the_token_and_count_requests_by_route(gateway_url: str) -> None:
    # Counted as deltas between two scrapes: the gateway is the session's, other tests' requests
    # are in its counters too.
    auth = {"Authorization": f"Bearer {TOKEN}"}
    unknown = frozenset({("method", "GET"), ("route", "/v1/jobs/{job_id}"), ("status", "404")})
    refused = frozenset({("method", "GET"), ("route", "/metrics"), ("status", "401")})
    with httpx.Client(base_url=gateway_url, headers=auth) as http:
        before = samples(http.get("/metrics").text)
        assert httpx.get(f"{gateway_url}/metrics").status_code == 401
        for _ in range(2):
            assert http.get("/v1/jobs/no-such-job-id").status_code == 404
        answer = http.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    seen = samples(answer.text)

    def moved(name: str, labels: frozenset[tuple[str, str]]) -> float:
        return seen.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    assert moved("mediafarm_gateway_requests_total", unknown) == 2  # the template, never the id
    assert not any("no-such-job-id" in dict(labels).get("route", "") for _, labels in seen)
    assert moved("mediafarm_gateway_requests_total", refused) == 1
    timed = frozenset({("method", "GET"), ("route", "/v1/jobs/{job_id}")})
    histogram = [(n, labels) for n, labels in seen if n == "mediafarm_gateway_response_seconds_count"]
    assert histogram, sorted({n for n, _ in seen})
    # Both 404s were timed, under the route's template (whatever other labels the histogram keeps).
    assert sum(moved(n, labels) for n, labels in histogram if timed <= labels) == 2, histogram


def test_metrics_open_to_a_scraper_without_a_token_when_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_GATEWAY_METRICS_OPEN", "true")
    get_settings.cache_clear()
    try:
        with running_gateway(gateway_config()) as url:
            assert httpx.get(f"{url}/metrics").status_code == 200
            assert httpx.get(f"{url}/v1/jobs/x").status_code == 401  # the rest still asks
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
