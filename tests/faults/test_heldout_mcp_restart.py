"""The held-out evaluation rides out an MCP server that is killed and restarted mid-run: the
rollouts whose session dropped are run again, and every val scenario gets its verdict (a
learning run lost all its held-out curves to one dropped session on an H100, 2026-12-05)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from transformers import AutoTokenizer

from mcprl_demo.heldout import evaluate_heldout
from mcprl_trainer.config import RolloutConfig, ScenarioSourceConfig
from mcprl_trainer.recovery import RetryWindow
from mcprl_trainer.rendering import ChatRenderer
from mcprl_trainer.rollout import RolloutSettings
from mcprl_trainer.scenarios import load_scenarios

from .conftest import MCP_TOKEN

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(240)]


def test_heldout_eval_survives_an_mcp_restart(fault_stack, caplog) -> None:
    splits = asyncio.run(load_scenarios(ScenarioSourceConfig(
        url=fault_stack.urls["scenario-gen"], set_id=fault_stack.set_id)))
    scenarios = (splits.val * 12)[:24]
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(fault_stack.base_model))
    done: list[bool] = []

    async def run() -> object:
        first = asyncio.Event()

        def on_done(ok: bool) -> None:
            done.append(ok)
            first.set()

        task = asyncio.create_task(evaluate_heldout(
            scenarios, base_url=fault_stack.engine_url, model=fault_stack.base_model,
            mcp_url=fault_stack.mcp_url, mcp_auth_token=MCP_TOKEN, renderer=renderer,
            settings=RolloutSettings.from_config(RolloutConfig(max_turns=3,
                                                               max_tokens_per_turn=32)),
            concurrency=4, on_done=on_done,
            retry=RetryWindow(window_s=60, backoff_initial_s=0.2, backoff_max_s=1.0)))
        await first.wait()  # rollouts are in flight: take the server away under them
        await asyncio.to_thread(fault_stack.stack.kill, "mcp-server")
        await asyncio.sleep(1.0)
        await asyncio.to_thread(fault_stack.stack.restart, "mcp-server")
        return await task

    with caplog.at_level(logging.WARNING):
        result = asyncio.run(run())
    assert result.n == len(scenarios) == len(done)
    retried = [r for r in caplog.records if "held-out rollout" in r.getMessage()]
    assert retried, "no rollout felt the restart: the kill came too late to test anything"
