"""The pipeline, unchanged, against the inventory example server instead of the company DB:
scenario-gen's ``llm`` strategy with our engine (json_schema), RULER through the judge with our
engine as judge model, and one training step of ``mcprl-train``.

Every service is a real process on loopback (LocalStack); only the MCP URL differs from a
company-db run. The tiny model is random, so tasks and judgements are gibberish: what is
checked is that every hop really happened and produced well-formed results.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastmcp import Client

from mcprl_common.process import free_port
from mcprl_common.wire import Scenario, ScoreGroupRequest, Trajectory
from mcprl_stack import LocalStack
from mcprl_trainer.mcp_tools import COMPLETE_TASK_SCHEMA, mcp_tool_to_openai

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
INVENTORY_PROMPT = (
    "You are an agent that answers questions about a warehouse inventory by calling tools. "
    "Find codes and SKUs with list_warehouses and search_items, then look up stock and "
    "movements. When you know the answer, call complete_task with the final answer only."
)


def _metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(
        rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


def _scrape(stack: LocalStack, service: str) -> str:
    return httpx.get(stack.urls[service] + "/metrics", timeout=10).text


def _wait_set(url: str, set_id: str, timeout_s: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = httpx.get(f"{url}/v1/scenario-sets/{set_id}", timeout=10).json()
        if status["status"] not in ("pending", "running"):
            return status
        time.sleep(0.3)
    raise TimeoutError(f"scenario set {set_id} still running after {timeout_s}s")


@pytest.fixture(scope="module")
def inventory_set(pipeline: LocalStack) -> dict[str, Any]:
    """An ``llm`` scenario set written by our engine from the inventory server's tools."""

    before = {s: _scrape(pipeline, s) for s in ("inference", "inventory-mcp")}
    url = pipeline.urls["scenario-gen"]
    created = httpx.post(f"{url}/v1/scenario-sets", timeout=30, json={
        "mcp_url": pipeline.urls["inventory-mcp"] + "/mcp", "strategy": "llm", "n": 4,
        "val_fraction": 0.25, "seed": 1, "json_schema": "on"})
    assert created.status_code == 202, created.text
    status = _wait_set(url, created.json()["id"])
    after = {s: _scrape(pipeline, s) for s in ("inference", "inventory-mcp")}
    return {"status": status, "before": before, "after": after, "url": url}


def test_llm_strategy_writes_a_set_from_the_inventory_tools(
        pipeline: LocalStack, inventory_set: dict[str, Any]) -> None:
    status = inventory_set["status"]
    assert status["status"] == "succeeded", status.get("error")
    manifest = status["manifest"]
    assert manifest["strategy"] == "llm"
    assert manifest["server_url"] == pipeline.urls["inventory-mcp"] + "/mcp"
    assert manifest["model"] == pipeline.served_model
    assert manifest["counts"]["train"] + manifest["counts"]["val"] == 4
    assert status["progress"]["llm_calls"] >= 1
    assert status["progress"]["llm_failed_calls"] == 0  # json_schema output always parsed

    splits = {}
    for split in ("train", "val"):
        resp = httpx.get(f"{inventory_set['url']}/v1/scenario-sets/{status['id']}/scenarios",
                         params={"split": split}, timeout=10).json()
        splits[split] = [Scenario.model_validate(s) for s in resp["data"]]
    assert len(splits["train"]) == 3 and len(splits["val"]) == 1
    for scenario in splits["train"] + splits["val"]:
        assert scenario.strategy == "llm" and 1 <= scenario.difficulty <= 5
        assert scenario.id == Scenario.content_id(scenario.task)
        assert 10 <= len(scenario.task) <= 80  # SCENARIO_GEN_LLM_TASK_MAX_CHARS held
    assert not {s.id for s in splits["train"]} & {s.id for s in splits["val"]}

    # The hops really happened: scenario-gen talked MCP to the inventory server, and the
    # engine generated the tasks.
    before, after = inventory_set["before"], inventory_set["after"]
    mcp_requests = "mcprl_http_requests_total"
    assert _metric(after["inventory-mcp"], mcp_requests) > _metric(before["inventory-mcp"],
                                                                   mcp_requests)
    tokens = "vllm:generation_tokens_total"
    assert _metric(after["inference"], tokens) > _metric(before["inference"], tokens)


async def _inventory_trajectories(url: str) -> tuple[list[dict], list[Trajectory]]:
    """Three agents' transcripts with real tool results from the inventory server."""

    async with Client(url) as client:
        tools = [mcp_tool_to_openai(t) for t in await client.list_tools()]
        found = await client.call_tool("search_items", {"query": "drill", "limit": 1})
        sku = found.structured_content["items"][0]["sku"]
        level = await client.call_tool("stock_level", {"sku": sku})
        wrong = await client.call_tool("get_item", {"sku": "DRILL"}, raise_on_error=False)
    tools.append(COMPLETE_TASK_SCHEMA)
    task = f"How many units of {sku} are in stock over all warehouses?"
    units = str(level.structured_content["quantity"])

    def call(i: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"id": f"c{i}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}

    def result(i: int, text: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": f"c{i}", "content": text}

    head = [{"role": "system", "content": INVENTORY_PROMPT}, {"role": "user", "content": task}]
    good = [
        *head,
        {"role": "assistant", "content": None, "tool_calls": [call(1, "stock_level",
                                                                   {"sku": sku})]},
        result(1, json.dumps(level.structured_content)),
        {"role": "assistant", "content": None, "tool_calls": [call(2, "complete_task",
                                                                   {"answer": units})]},
        result(2, "Task completed."),
    ]
    erring = [
        *head,
        {"role": "assistant", "content": None, "tool_calls": [call(1, "get_item",
                                                                   {"sku": "DRILL"})]},
        result(1, wrong.content[0].text),
        {"role": "assistant", "content": None, "tool_calls": [call(2, "complete_task",
                                                                   {"answer": "0"})]},
        result(2, "Task completed."),
    ]
    silent = [*head, {"role": "assistant", "content": "I cannot check the stock."}]
    trajectories = [
        Trajectory(messages=good, tools=tools, final_answer=units, num_turns=2, tool_calls=2),
        Trajectory(messages=erring, tools=tools, final_answer="0", num_turns=2, tool_calls=2,
                   tool_errors=1),
        Trajectory(messages=silent, tools=tools, finish_reason="no_tool_call", num_turns=1),
    ]
    return head, trajectories


def test_ruler_scores_a_group_of_inventory_trajectories(pipeline: LocalStack) -> None:
    head, trajectories = asyncio.run(
        _inventory_trajectories(pipeline.urls["inventory-mcp"] + "/mcp"))
    scenario = Scenario(id=Scenario.content_id(head[1]["content"]), task=head[1]["content"])
    body = ScoreGroupRequest(scenario=scenario, trajectories=trajectories)
    tokens_before = _metric(_scrape(pipeline, "inference"), "vllm:generation_tokens_total")

    resp = httpx.post(pipeline.urls["judge"] + "/v1/score-group", timeout=120,
                      json=body.model_dump(mode="json"))
    assert resp.status_code == 200, resp.text
    scored = resp.json()
    assert len(scored["scores"]) == 3
    for s in scored["scores"]:
        assert 0.0 <= s["score"] <= 1.0
        assert "ruler" in s["components"]
    assert scored["judge_model"] == pipeline.served_model
    assert scored["usage"]["upstream_calls"] >= 1 and not scored["cached"]
    assert _metric(_scrape(pipeline, "inference"), "vllm:generation_tokens_total") > \
        tokens_before  # our engine was the judge model

    again = httpx.post(pipeline.urls["judge"] + "/v1/score-group", timeout=120,
                       json=body.model_dump(mode="json")).json()
    assert again["cached"] and again["usage"]["upstream_calls"] == 0
    assert [s["score"] for s in again["scores"]] == [s["score"] for s in scored["scores"]]


def test_one_training_step_against_the_inventory_server(
        pipeline: LocalStack, inventory_set: dict[str, Any], tmp_path: Path) -> None:
    """``mcprl-train`` as a user runs it after ``make stack``: the stack's client env, with
    MCP_URL pointing at the inventory server, and a small run config."""

    assert inventory_set["status"]["status"] == "succeeded"
    status_port = free_port()
    config = {
        "name": "inventory", "seed": 0, "output_dir": str(tmp_path / "runs"),
        "model": pipeline.config.model, "steps": 1, "group_size": 2, "groups_per_step": 2,
        "scenarios": {"set_id": inventory_set["status"]["id"], "max_train": 3},
        "reward": {"mode": "ruler"},
        "rollout": {"max_turns": 2, "max_tokens_per_turn": 24, "max_context": 4096,
                    "min_tokens_per_turn": 8, "concurrency": 4,
                    "system_prompt": INVENTORY_PROMPT},
        "train": {"lr": 1e-3, "device": "cpu"},
        "eval": {"every": 0},
        "status": {"enabled": True, "port": status_port},
    }
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, **pipeline.client_env(),
           "MCP_URL": pipeline.urls["inventory-mcp"] + "/mcp",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    script = Path(sys.executable).parent / "mcprl-train"
    res = subprocess.run([str(script), "--config", str(path), "--no-progress"], env=env,
                         capture_output=True, text=True, timeout=150)
    assert res.returncode == 0, res.stderr[-3000:]

    run = tmp_path / "runs" / "inventory"
    history = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [1]
    rows = [json.loads(x) for x in (run / "rollouts" / "step-1.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        names = {t["function"]["name"] for t in row["trajectory"]["tools"]}
        assert {"search_items", "stock_level", "list_warehouses", "complete_task"} <= names
        assert row["reward"] is not None and "ruler" in row["components"]
    assert (run / "checkpoints" / "step-1" / "adapter_model.safetensors").exists()
    # the adapter of step 1 is published to the engine under the run's name
    served = httpx.get(pipeline.urls["inference"] + "/v1/models", timeout=10).json()
    assert "inventory" in {m["id"] for m in served["data"]}
    print(f"inventory step 1: rollout {history[0]['rollout_seconds']:.1f}s judge "
          f"{history[0]['judge_seconds']:.1f}s train {history[0]['train_seconds']:.1f}s, "
          f"groups trained {history[0]['groups_trained']}")
