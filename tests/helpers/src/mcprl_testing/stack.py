"""A whole pipeline stack for tests, started once per pytest session and shared.

The dashboard test (tests/integration) and the example-server tests (tests/examples) need the
same services; starting them once saves a minute on two cores. The first fixture that asks
starts the stack; pytest's config cleanup stops it at the end of the session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcprl_stack.config import StackSettings
from mcprl_stack.local_stack import LocalStack

PIPELINE_SERVICES = ("mcp-server", "inventory-mcp", "inference", "scenario-gen", "judge")
# Small, bounded LLM outputs so a random tiny model answers in a second or two.
PIPELINE_ENV = {
    "INFERENCE_MAX_BATCH_SIZE": "16",
    "INFERENCE_KV_CACHE_MEMORY_GB": "0.25",
    "SCENARIO_GEN_LLM_BATCH_SIZE": "4",
    "SCENARIO_GEN_LLM_MAX_TOKENS": "600",
    "SCENARIO_GEN_LLM_TASK_MAX_CHARS": "80",
    "SCENARIO_GEN_LLM_MAX_REPAIRS": "1",
    "SCENARIO_GEN_LLM_MAX_FAILED_BATCHES": "3",
    "SCENARIO_GEN_CHECKPOINT_EVERY_S": "0",
    "GENERATOR_TIMEOUT_S": "60",
    "JUDGE_EXPLANATION_MAX_CHARS": "40",
    "JUDGE_MAX_OUTPUT_TOKENS": "400",
    "JUDGE_TIMEOUT_S": "60",
    "JUDGE_TEMPERATURE": "0.7",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_STACKS: dict[str, LocalStack] = {}


def shared_stack(pytest_config: Any, runs_dir: Path, model: Path,
                 services: tuple[str, ...] = PIPELINE_SERVICES,
                 env: dict[str, str] | None = None) -> LocalStack:
    """The session's stack for ``services`` (started on first use, on free ports)."""

    key = ",".join(services)
    stack = _STACKS.get(key)
    if stack is not None:
        return stack
    config = StackSettings(
        services=list(services),
        ports=dict.fromkeys(services, 0),
        model=str(model),
        runs_dir=runs_dir,
        inherit_env=False,
        health_timeout_s=120,
        env={**PIPELINE_ENV, **(env or {})},
    )
    stack = LocalStack(config).start()
    _STACKS[key] = stack

    def _stop() -> None:
        _STACKS.pop(key, None)
        stack.stop()

    pytest_config.add_cleanup(_stop)
    return stack
