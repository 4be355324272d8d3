"""The gateway's own Prometheus metrics, served at ``GET /metrics``: requests by route and status
(429s are admission control's refusals as clients saw them) and the time to each response's
headers, plus the process's CPU and memory, and the pools' scaling signal.

The farm-wide figures (queues, jobs, breakers, refusals by reason) are the workers'
(docs/operating.md, "Metrics"): a gateway only adds what passed through it, and the pools'
scaling signal (``tasks.producer.scaling_metrics``), which a pool scaled to zero has no worker to serve.
Each app has its own registry, so two gateways in one process (tests) count apart.

``/metrics`` asks for a bearer token like every ``/v1`` route when FARM_API_TOKENS is set
(Prometheus sends one: ``authorization: {credentials: ...}`` in its scrape config);
FARM_GATEWAY_METRICS_OPEN=true serves it without one, for a scraper on a private network.
Without tokens the gateway serves loopback clients only, ``/metrics`` included.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from fastapi import FastAPI, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from mediafarm.gateway.security import caller
from mediafarm.tasks.producer import scaling_metrics

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class GatewayMetrics:
    """Counters of one gateway app, and the ASGI middleware that feeds them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.requests = Counter(
            "mediafarm_gateway_requests_total", "HTTP requests answered, by method, route template and status",
            ["method", "route", "status"], registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "mediafarm_gateway_response_seconds", "Seconds to a response's headers (a stream's first bytes)",
            ["method", "route"], buckets=BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.registry.register(scaling_metrics.for_this_farm())


class MetricsMiddleware:
    """Counts every HTTP request by its route's template (``/v1/jobs/{job_id}``, never the id)."""

    def __init__(self, app: Any, metrics: GatewayMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                route = _route(scope)
                self.metrics.latency.labels(scope["method"], route).observe(time.perf_counter() - start)
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.requests.labels(scope["method"], _route(scope), str(status["code"])).inc()


def _route(scope: dict[str, Any]) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"


def install(app: FastAPI, open_to_all: bool) -> None:
    """``GET /metrics`` on ``app`` and the middleware that counts its requests."""
    metrics = GatewayMetrics()
    app.state.metrics = metrics
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    async def serve(request: Request) -> Response:
        if not open_to_all:
            caller(request)  # 401 without a token the gateway accepts
        # On a thread: the scaling signal is read from Redis at scrape, which the event loop must not wait on.
        body = await anyio.to_thread.run_sync(generate_latest, metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    app.add_api_route("/metrics", serve, methods=["GET"], tags=["farm"], include_in_schema=False,
                      summary="Prometheus metrics of this gateway")  # fmt: skip
