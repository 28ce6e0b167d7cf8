"""request_json against a real local server: retries on 503 with backoff, no retry on 400."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from mcprl_common.errors import BadRequestError, UpstreamUnavailableError
from mcprl_common.http import RetryPolicy, ServiceCallError, request_json
from mcprl_common.metrics import new_registry
from mcprl_common.process import UvicornThread
from mcprl_common.service_app import add_ops_routes


def _app() -> FastAPI:
    app = FastAPI()
    calls = {"flaky": 0}
    add_ops_routes(app, service="t", registry=new_registry())

    @app.get("/flaky")
    async def flaky() -> dict:
        calls["flaky"] += 1
        if calls["flaky"] < 3:
            raise UpstreamUnavailableError("warming up", retry_after_s=0)
        return {"calls": calls["flaky"]}

    @app.get("/bad")
    async def bad() -> dict:
        raise BadRequestError("field x is wrong", param="x")

    return app


@pytest.fixture(scope="module")
def server():
    with UvicornThread(_app()) as srv:
        yield srv


async def test_retries_until_success(server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        body = await request_json(client, "GET", "/flaky", retry=RetryPolicy(3, 0.001))
    assert body == {"calls": 3}


async def test_client_error_is_not_retried_and_names_problem(server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        with pytest.raises(ServiceCallError) as info:
            await request_json(client, "GET", "/bad", retry=RetryPolicy(3, 0.001))
    assert info.value.status == 400
    assert "field x is wrong" in info.value.message


async def test_unknown_route_is_json_404_and_metrics_count_it(server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        resp = await client.get("/nope")
        assert resp.status_code == 404
        assert resp.json()["error"]["code"] == 404
        metrics = (await client.get("/metrics")).text
        health = (await client.get("/healthz")).json()
    expected = 'mcprl_http_requests_total{method="GET",route="other",service="t",status="404"}'
    assert expected in metrics
    assert health["status"] == "ok"
