"""SmolLM2 (``make base-model``) as the stack's one local model, as ``make stack`` wires it with
``INFERENCE_MODEL=models/smollm2-135m-instruct``: scenario-gen's ``llm`` strategy writes tasks
with it (json_schema) and the judge scores a group with it (RULER), through our engine."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from mcprl_common.wire import Scenario, ScoreGroupRequest, Trajectory
from mcprl_stack import LocalStack, StackSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]
SERVICES = ["mcp-server", "inference", "scenario-gen", "judge"]


@pytest.fixture(scope="module")
def smol_stack(smollm2_model: Path, tmp_path_factory: pytest.TempPathFactory):
    config = StackSettings(services=SERVICES, ports=dict.fromkeys(SERVICES, 0),
                         model=str(smollm2_model), runs_dir=tmp_path_factory.mktemp("smol"),
                         inherit_env=False, health_timeout_s=180,
                         env={"SCENARIO_GEN_LLM_MAX_TOKENS": "800",
                              "SCENARIO_GEN_LLM_BATCH_SIZE": "2", "OMP_NUM_THREADS": "1"})
    with LocalStack(config) as stack:
        yield stack


def test_scenario_gen_writes_tasks_with_smollm2(smol_stack: LocalStack) -> None:
    url = smol_stack.urls["scenario-gen"]
    created = httpx.post(f"{url}/v1/scenario-sets", timeout=30, json={
        "mcp_url": smol_stack.mcp_url, "strategy": "llm", "n": 2, "val_fraction": 0.5,
        "seed": 0, "json_schema": "on"})
    assert created.status_code == 202, created.text
    deadline = time.monotonic() + 300
    while True:
        status = httpx.get(f"{url}/v1/scenario-sets/{created.json()['id']}", timeout=10).json()
        if status["status"] not in ("pending", "running") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status["status"] == "succeeded", status.get("error")
    assert status["manifest"]["model"] == smol_stack.served_model
    assert status["progress"]["llm_failed_calls"] == 0
    assert status["manifest"]["counts"]["train"] + status["manifest"]["counts"]["val"] == 2


def test_judge_scores_a_group_with_smollm2(smol_stack: LocalStack) -> None:
    task = "How many departments are there?"
    head = [{"role": "system", "content": "Answer with the database tools."},
            {"role": "user", "content": task}]
    answered = [*head, {"role": "assistant", "content": None, "tool_calls": [{
        "id": "c1", "type": "function", "function": {
            "name": "run_query", "arguments": '{"sql": "SELECT COUNT(*) FROM departments"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"results": [{"n": 8}]}'},
        {"role": "assistant", "content": "There are 8 departments."}]
    silent = [*head, {"role": "assistant", "content": "I do not know."}]
    body = ScoreGroupRequest(
        scenario=Scenario(id=Scenario.content_id(task), task=task),
        trajectories=[Trajectory(messages=answered, final_answer="8", num_turns=2,
                                 tool_calls=1),
                      Trajectory(messages=silent, num_turns=1, finish_reason="no_tool_call")])
    resp = httpx.post(smol_stack.urls["judge"] + "/v1/score-group", timeout=300,
                      json={**body.model_dump(mode="json"), "reward": {"mode": "ruler"}})
    assert resp.status_code == 200, resp.text
    scored = resp.json()
    assert scored["judge_model"] == smol_stack.served_model
    assert len(scored["scores"]) == 2
    assert all(0.0 <= s["score"] <= 1.0 and "ruler" in s["components"]
               for s in scored["scores"])
