"""Who may call the gateway: bearer tokens, loopback only without them, CORS only when configured."""

from __future__ import annotations

import asyncio

import httpx

from mediafarm.gateway.app import create_app
from mediafarm.gateway.settings import bind_problem
from tests.gateway.conftest import OTHER_TOKEN, TOKEN, gateway_config


def test_without_a_token_or_with_a_wrong_one_every_job_route_is_401(gateway_url: str) -> None:
    routes = [("GET", "/v1/jobs/some-id"), ("POST", "/v1/jobs/toy"), ("DELETE", "/v1/jobs/some-id"),
              ("GET", "/v1/jobs/some-id/events"), ("GET", "/v1/jobs/some-id/artifacts/a.wav"),
              ("POST", "/v1/uploads"), ("GET", "/v1/uploads/" + "0" * 32)]  # fmt: skip
    for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": f"Basic {TOKEN}"}):
        with httpx.Client(base_url=gateway_url, headers=headers) as anonymous:
            for method, path in routes:
                answer = anonymous.request(method, path, json={"text": "x"})
                assert answer.status_code == 401, (method, path, headers, answer.text)
                assert answer.headers["www-authenticate"].startswith("Bearer")
    with httpx.Client(base_url=gateway_url, headers={"Authorization": f"Bearer {OTHER_TOKEN}"}) as other:
        assert other.get("/v1/jobs/some-id").status_code == 404  # in, and the job is unknown
    with httpx.Client(base_url=gateway_url) as anonymous:
        # What tells nothing about jobs stays open: the schema and the health check.
        assert anonymous.get("/openapi.json").status_code == 200 and anonymous.get("/healthz").json()["status"] == "ok"


def _call(app: object, client: tuple[str, int], method: str, path: str, **kwargs: object) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=client)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            return await http.request(method, path, **kwargs)  # type: ignore[arg-type]

    return asyncio.run(go())


def test_without_tokens_only_loopback_clients_are_served() -> None:
    app = create_app(gateway_config(tokens=()))
    for path in ("/v1/jobs/some-id", "/docs", "/healthz"):
        refused = _call(app, ("203.0.113.9", 40000), "GET", path)
        assert refused.status_code == 403 and "loopback clients only" in refused.json()["detail"], path
    assert _call(app, ("127.0.0.1", 40000), "GET", "/v1/jobs/some-id").status_code == 404
    assert _call(app, ("::1", 40000), "GET", "/v1/jobs/some-id").status_code == 404
    # With tokens, any address holding one is served.
    tokened = create_app(gateway_config())
    remote = _call(tokened, ("203.0.113.9", 40000), "GET", "/v1/jobs/x", headers={"Authorization": f"Bearer {TOKEN}"})
    assert remote.status_code == 404


def test_cors_headers_are_sent_only_for_the_configured_origins() -> None:
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}  # fmt: skip
    closed = _call(create_app(gateway_config()), ("127.0.0.1", 1), "OPTIONS", "/v1/jobs/toy", headers=preflight)
    assert "access-control-allow-origin" not in closed.headers
    app = create_app(gateway_config(cors_origins=("https://app.example",)))
    opened = _call(app, ("127.0.0.1", 1), "OPTIONS", "/v1/jobs/toy", headers=preflight)
    assert opened.status_code == 200 and opened.headers["access-control-allow-origin"] == "https://app.example"
    elsewhere = {**preflight, "Origin": "https://evil.example"}
    other = _call(app, ("127.0.0.1", 1), "OPTIONS", "/v1/jobs/toy", headers=elsewhere)
    assert "access-control-allow-origin" not in other.headers


def test_listening_beyond_loopback_needs_tokens() -> None:
    assert bind_problem("127.0.0.1", gateway_config(tokens=())) is None
    assert bind_problem("::1", gateway_config(tokens=())) is None
    assert "FARM_API_TOKENS" in (bind_problem("0.0.0.0", gateway_config(tokens=())) or "")
    assert bind_problem("0.0.0.0", gateway_config()) is None
