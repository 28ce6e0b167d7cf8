"""The llm strategy end to end against our inference engine (tiny random model) on loopback.

With json_schema the engine's constrained decoding makes even a random model answer valid
JSON, so the generation succeeds. Without it the tiny model writes gibberish, so the fallback
must extract, fail validation, retry with the error in the conversation a bounded number of
times and end with a clear error, keeping the set and its counters.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from mcprl_common.process import UvicornThread, wait_healthy
from mcprl_common.settings import UpstreamSettings
from mcprl_common.wire import Scenario
from mcprl_inference.app import create_app as create_engine
from mcprl_inference.settings import InferenceSettings
from mcprl_scenario_gen.app import create_app
from mcprl_scenario_gen.mcp_client import McpConnection
from mcprl_scenario_gen.metrics import GenMetrics
from mcprl_scenario_gen.pipeline import run_generation
from mcprl_scenario_gen.settings import ScenarioGenSettings
from mcprl_scenario_gen.store import ScenarioStore
from mcprl_scenario_gen.strategies import GenerationContext, GenerationParams
from mcprl_scenario_gen.strategies.llm import LlmStrategy
from mcprl_testing.mcp_server import read_sql
from mcprl_testing.scenario_gen import wait_finished

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MODEL = "tiny-test"


def _engine(model_path: Path) -> UvicornThread:
    settings = InferenceSettings(model=str(model_path), served_model_name=MODEL, device="cpu",
                                 kv_cache_memory_gb=0.25, max_model_len=8192, max_batch_size=4)
    return UvicornThread(create_engine(settings))


@pytest.fixture(scope="module")
def engine(tiny_test_model: Path) -> Iterator[str]:
    with _engine(tiny_test_model) as srv:
        wait_healthy(f"{srv.url}/healthz", 120)
        yield f"{srv.url}/v1"


def upstream(base_url: str) -> UpstreamSettings:
    return UpstreamSettings(base_url=base_url, model=MODEL, max_retries=0, timeout_s=90,
                            max_concurrency=1)


def llm_settings(settings: ScenarioGenSettings, **kw) -> ScenarioGenSettings:
    small = {"llm_batch_size": 3, "llm_max_tokens": 320, "llm_task_max_chars": 60,
             "llm_context_max_chars": 1500, "llm_max_repairs": 1, "llm_max_failed_batches": 1}
    return settings.model_copy(update={**small, **kw})


def sample(metrics: GenMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_describe_server_shows_real_schema_and_rows(company, settings) -> None:
    url, db = company
    async with McpConnection(url) as conn:
        server = await conn.discover()
        ctx = GenerationContext(conn=conn, server=server, settings=settings,
                                params=GenerationParams(mcp_url=url, strategy="llm", n=5))
        context, vocab = await LlmStrategy().describe_server(ctx)
    assert ctx.known_tables == ["departments", "employees", "projects"]
    assert "department_id INTEGER -> departments.id" in context
    assert "status IN ('active', 'completed', 'on_hold')" in context
    first_employee = read_sql(db, "SELECT name FROM employees LIMIT 1")[0][0]
    assert first_employee in context and vocab[first_employee].startswith("employees.name=")
    for tool in ("list_tables", "describe_table", "run_query"):
        assert f"- {tool}(" in context


async def test_describe_other_server_lists_tools_and_resources(other_server, settings) -> None:
    async with McpConnection(other_server) as conn:
        server = await conn.discover()
        ctx = GenerationContext(conn=conn, server=server, settings=settings,
                                params=GenerationParams(mcp_url=other_server, strategy="llm",
                                                        n=5))
        context, vocab = await LlmStrategy().describe_server(ctx)
    assert "- stock_level(sku: string, warehouse: string)" in context
    assert "docs://catalog" in context and "SKU-1 red chair" in context
    assert vocab == {} and ctx.known_tables == []


async def test_json_schema_generation_succeeds(company, engine, settings) -> None:
    url, _ = company
    metrics = GenMetrics()
    store = ScenarioStore(settings.data_dir)
    params = GenerationParams(mcp_url=url, strategy="llm", n=3, val_fraction=0.34, seed=1,
                              json_schema="on")
    manifest = await run_generation(params, settings=llm_settings(settings), store=store,
                                    upstream=upstream(engine), metrics=metrics)
    assert manifest.status == "succeeded", manifest.error
    items = store.load_split(manifest.id, "train") + store.load_split(manifest.id, "val")
    assert len(items) == 3 and manifest.counts["val"] == 1
    assert manifest.model == MODEL and manifest.tools_hash.startswith("sha256:")
    for s in items:
        assert s.strategy == "llm" and 1 <= s.difficulty <= 5 and len(s.task) <= 60
        assert s.id == Scenario.content_id(s.task)
    assert manifest.usage["llm_calls"] >= 1 and manifest.usage["completion_tokens"] > 0
    assert sample(metrics, "mcprl_scenario_gen_llm_calls_total", outcome="ok") >= 1
    assert sample(metrics, "mcprl_scenario_gen_llm_tokens_total", type="prompt") > 500
    assert sample(metrics, "mcprl_scenario_gen_scenarios_total", strategy="llm") == 3


def test_fallback_without_json_schema_fails_cleanly_over_http(company, engine,
                                                              settings) -> None:
    """json_schema off: gibberish -> extract -> repair turn -> bounded failure, 200s after."""

    url, _ = company
    app_settings = llm_settings(settings, llm_max_tokens=48)
    with UvicornThread(create_app(app_settings, generator=upstream(engine))) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as client:
        resp = client.post("/v1/scenario-sets", json={"mcp_url": url, "strategy": "llm",
                                                      "n": 3, "json_schema": "off"})
        assert resp.status_code == 202, resp.text
        set_id = resp.json()["id"]
        status = wait_finished(client, set_id, timeout_s=90, poll_s=0.2)
        assert status["status"] == "failed"
        error = status["error"]
        assert error.startswith("llm_output: ") and "prompt-only fallback" in error
        assert "2 attempts" in error and "no parseable JSON" in error
        usage = status["manifest"]["usage"]
        assert usage["llm_calls"] == 2 and usage["llm_failed_calls"] == 2
        listing = client.get(f"/v1/scenario-sets/{set_id}/scenarios").json()
        assert listing["status"] == "failed" and listing["count"] == 0
        metrics = client.get("/metrics").text
        assert 'mcprl_scenario_gen_llm_calls_total{outcome="invalid"} 2.0' in metrics
        assert 'mcprl_scenario_gen_failures_total{kind="llm_output"} 1.0' in metrics


def _provider_without_json_schema(engine_url: str) -> FastAPI:
    """An OpenAI-compatible provider that rejects response_format (like many hosted models),
    forwarding everything else to our engine."""

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        if "response_format" in body:
            return JSONResponse({"error": {"message": "response_format json_schema is not "
                                           "supported for this model", "type": "invalid_request"
                                           "_error", "code": 400}}, status_code=400)
        async with httpx.AsyncClient(timeout=60) as client:
            resp = await client.post(f"{engine_url}/chat/completions", json=body)
        return JSONResponse(resp.json(), status_code=resp.status_code)

    return app


async def test_auto_switches_to_fallback_on_response_format_400(company, engine,
                                                               settings) -> None:
    url, _ = company
    metrics = GenMetrics()
    support: dict[str, bool] = {}
    with UvicornThread(_provider_without_json_schema(engine)) as provider:
        manifest = await run_generation(
            GenerationParams(mcp_url=url, strategy="llm", n=3, json_schema="auto"),
            settings=llm_settings(settings, llm_max_tokens=48),
            store=ScenarioStore(settings.data_dir), upstream=upstream(f"{provider.url}/v1"),
            metrics=metrics, llm_support=support)
    assert manifest.status == "failed" and "prompt-only fallback" in (manifest.error or "")
    assert sample(metrics, "mcprl_scenario_gen_llm_calls_total", outcome="unsupported") == 1
    assert sample(metrics, "mcprl_scenario_gen_llm_calls_total", outcome="invalid") == 2
    assert list(support.values()) == [False]  # remembered for the next generation


async def test_progress_is_kept_when_the_generator_goes_away(company, settings,
                                                            tiny_test_model) -> None:
    url, _ = company
    engine = _engine(tiny_test_model).start()
    wait_healthy(f"{engine.url}/healthz", 120)
    stopped: list[int] = []

    async def on_progress(p) -> None:
        if p.accepted and not stopped:
            stopped.append(p.accepted)
            await asyncio.to_thread(engine.stop)

    store = ScenarioStore(settings.data_dir)
    try:
        manifest = await run_generation(
            GenerationParams(mcp_url=url, strategy="llm", n=9, json_schema="on"),
            settings=llm_settings(settings), store=store,
            upstream=upstream(f"{engine.url}/v1"), on_progress=on_progress)
    finally:
        engine.stop()
    assert stopped, "no batch was accepted before the engine stopped"
    assert manifest.status == "failed"
    assert manifest.error.startswith("llm_unavailable: ") and "unreachable" in manifest.error
    kept = store.load_split(manifest.id, "train") + store.load_split(manifest.id, "val")
    assert len(kept) == stopped[0] == manifest.counts["total"] >= 1
    assert store.load_manifest(manifest.id).status == "failed"


def test_cancel_keeps_partial_set_and_jobs_are_bounded(company, engine, settings) -> None:
    url, _ = company
    app_settings = llm_settings(settings, max_concurrent_jobs=1, max_queued_jobs=0)
    with UvicornThread(create_app(app_settings, generator=upstream(engine))) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as client:
        body = {"mcp_url": url, "strategy": "llm", "n": 30, "json_schema": "on"}
        resp = client.post("/v1/scenario-sets", json=body)
        assert resp.status_code == 202, resp.text
        set_id = resp.json()["id"]
        busy = client.post("/v1/scenario-sets", json=body)
        assert busy.status_code == 429 and "retry later" in busy.json()["error"]["message"]
        early = client.get(f"/v1/scenario-sets/{set_id}/scenarios")
        assert early.status_code == 409 and "still" in early.json()["error"]["message"]
        deadline = time.monotonic() + 90
        while client.get(f"/v1/scenario-sets/{set_id}").json()["progress"].get(
                "accepted", 0) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        cancelled = client.post(f"/v1/scenario-sets/{set_id}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        kept = client.get(f"/v1/scenario-sets/{set_id}/scenarios").json()["count"] + \
            client.get(f"/v1/scenario-sets/{set_id}/scenarios?split=val").json()["count"]
        assert 1 <= kept < 30
        assert cancelled.json()["manifest"]["counts"]["total"] == kept
