"""Every metric the Grafana dashboard queries is exported by the running services.

The stack runs on loopback (LocalStack: the real processes, our engine with the tiny model);
the trainer's status server (the one ``mcprl-train`` serves) runs in-process. After a little
real traffic each /metrics is scraped and compared with the names in the dashboard's PromQL.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest
from fastmcp import Client
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from mcprl_common.process import free_port
from mcprl_common.wire import GroundTruth, RewardConfig, Scenario, ScoreGroupRequest, Trajectory
from mcprl_stack import LocalStack
from mcprl_stack.services import SERVICES
from mcprl_trainer.metrics import TrainerMetrics
from mcprl_trainer.status import RunStatus, start_status_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "monitoring/grafana/dashboards/mcp-rl.json"
# Names the dashboard may use although our services do not export them, and why.
ALLOWED_MISSING = {
    "up": "Prometheus' own per-target series",
    "vllm:kv_cache_usage_perc": "vLLM only: our engine has no paged KV-cache pool to report",
}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                "offset", "and", "or", "unless", "inf", "nan"}
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
            "_created"), "summary": ("", "_sum", "_count", "_created"), "gauge": ("",),
            "info": ("_info",), "unknown": ("",)}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (not functions, labels or keywords)."""

    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for m in re.finditer(r"(?<![\w.:$])[A-Za-z_:][\w:]*", e):
        if e[m.end():].lstrip().startswith("(") or m.group(0) in PROMQL_WORDS:
            continue
        names.add(m.group(0))
    return names


def test_metric_names_parser() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, tool) (rate(mcprl_x_seconds_bucket'
            '{outcome!~"ok|e"}[$__rate_interval]))) / clamp_min(sum(vllm:a_total), 1e-9) '
            'and on(job) up')
    assert metric_names(expr) == {"mcprl_x_seconds_bucket", "vllm:a_total", "up"}


def dashboard_names() -> set[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 30
    return set().union(*(metric_names(e) for e in exprs))


def exported(text: str) -> tuple[set[str], dict[str, float]]:
    """Sample names a /metrics page can produce (from its families' types), and the values
    of the samples it has now (summed over labels)."""

    names: set[str] = set()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
        for sample in family.samples:
            names.add(sample.name)
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return names, values


async def _tool_calls(stack: LocalStack) -> None:
    async with Client(stack.urls["mcp-server"] + "/mcp") as client:
        await client.call_tool("run_query", {"sql": "SELECT count(*) AS n FROM employees"})
        await client.call_tool("run_query", {"sql": "DROP TABLE employees"},
                               raise_on_error=False)
    async with Client(stack.urls["inventory-mcp"] + "/mcp") as client:
        await client.call_tool("list_warehouses", {})


def _traffic(stack: LocalStack) -> None:
    asyncio.run(_tool_calls(stack))
    engine = OpenAI(base_url=stack.urls["inference"] + "/v1", api_key="EMPTY", timeout=60)
    engine.chat.completions.create(model=stack.served_model or "", max_tokens=8,
                                   messages=[{"role": "user", "content": "hi"}])
    scenario = Scenario(id="sc-dash", task="How many warehouses are there?",
                        ground_truth=GroundTruth(kind="number", value=6))
    trajectories = [Trajectory(messages=[{"role": "user", "content": scenario.task},
                                         {"role": "assistant", "content": answer}],
                               final_answer=answer) for answer in ("6", "7")]
    body = ScoreGroupRequest(scenario=scenario, trajectories=trajectories,
                             reward=RewardConfig(mode="verifiable"))
    resp = httpx.post(stack.urls["judge"] + "/v1/score-group", json=body.model_dump(mode="json"),
                      timeout=60)
    assert resp.status_code == 200, resp.text
    assert [s["score"] for s in resp.json()["scores"]] == [1.0, 0.0]


def test_every_dashboard_metric_is_exported(pipeline: LocalStack) -> None:
    _traffic(pipeline)
    pages = {name: httpx.get(url + SERVICES[name].metrics_path, timeout=10).text
             for name, url in pipeline.urls.items()}
    metrics = TrainerMetrics()
    status = start_status_server(RunStatus("dash", 1), metrics, "127.0.0.1", free_port())
    try:
        pages["trainer"] = httpx.get(f"{status.url}/metrics", timeout=10).text
    finally:
        status.stop()

    names: set[str] = set()
    values: dict[str, dict[str, float]] = {}
    for service, text in pages.items():
        got, vals = exported(text)
        names |= got
        values[service] = vals
    wanted = dashboard_names()
    missing = sorted(wanted - names - set(ALLOWED_MISSING))
    assert not missing, f"dashboard queries metrics nobody exports: {missing}"

    # the allowance is only for what our engine really lacks
    for name in ALLOWED_MISSING:
        assert name in wanted, f"{name} is allowed-missing but the dashboard does not use it"
        assert name not in names, f"{name} is exported now: drop it from ALLOWED_MISSING"

    # and the names carry live data, not just declarations
    assert values["inference"]["vllm:generation_tokens_total"] > 0
    assert values["inference"]["vllm:e2e_request_latency_seconds_count"] >= 1
    assert values["mcp-server"]["mcprl_mcp_tool_calls_total"] >= 2
    assert values["inventory-mcp"]["mcprl_mcp_tool_calls_total"] >= 1
    assert values["judge"]["mcprl_judge_requests_total"] >= 1
    assert values["judge"]["mcprl_judge_score_count"] >= 2
    for service in ("mcp-server", "inventory-mcp", "scenario-gen", "judge"):
        assert values[service]["mcprl_http_requests_total"] >= 1, service
