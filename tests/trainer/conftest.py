"""Fixtures of the trainer's integration tests: the whole stack, real, on loopback.

One session-wide stack (started only when an integration test asks for it): the company-db
MCP server, our inference engine serving the tiny-test model, scenario-gen with a `sql`
set generated through its HTTP API, and the judge, whose RULER judge model is our engine
(constrained JSON; seeded so its scores are reproducible).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from mcprl_common.process import UvicornThread, wait_healthy
from mcprl_testing.trainer import merge_sections, run_config_data


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Two cores shared by the team: keep torch to one intra-op thread in tests."""

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@dataclass(frozen=True)
class Stack:
    mcp_url: str
    db_path: Path
    engine_url: str  # base URL with /v1
    base_model: str  # the engine's served base name
    judge_url: str
    scenario_gen_url: str
    set_id: str

    def run_config(self, tmp_path: Path, **overrides: Any) -> dict[str, Any]:
        """A run config (as YAML data) wired to this stack; overrides merge per section."""

        data = run_config_data(tmp_path, model=self.base_model, engine_url=self.engine_url,
                               mcp_url=self.mcp_url, judge_url=self.judge_url,
                               scenario_gen_url=self.scenario_gen_url, set_id=self.set_id)
        return merge_sections(data, overrides)


def _generate_set(url: str, mcp_url: str) -> str:
    created = httpx.post(f"{url}/v1/scenario-sets", timeout=30, json={
        "mcp_url": mcp_url, "strategy": "sql", "n": 12, "val_fraction": 0.25, "seed": 0})
    created.raise_for_status()
    set_id = created.json()["id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = httpx.get(f"{url}/v1/scenario-sets/{set_id}", timeout=30).json()
        if status["status"] == "succeeded":
            return set_id
        if status["status"] in ("failed", "cancelled"):
            raise RuntimeError(f"scenario set failed: {status.get('error')}")
        time.sleep(0.2)
    raise TimeoutError("scenario set not ready after 120 s")


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_test_model: Path) -> Iterator[Stack]:
    from mcprl_inference.app import create_app as engine_app
    from mcprl_inference.settings import InferenceSettings
    from mcprl_judge.loopback import serve_judge
    from mcprl_mcp_server.loopback import serve_mcp
    from mcprl_scenario_gen.app import create_app as scenario_gen_app
    from mcprl_scenario_gen.settings import ScenarioGenSettings

    root = tmp_path_factory.mktemp("stack")
    base = str(tiny_test_model)
    with contextlib.ExitStack() as es:
        mcp_url, db_path = es.enter_context(serve_mcp(root / "mcp"))
        engine = es.enter_context(UvicornThread(engine_app(InferenceSettings(
            model=base, device="cpu", port=0, max_model_len=8192, kv_cache_memory_gb=0.5,
            max_loras=4, seed=0))))
        wait_healthy(f"{engine.url}/healthz", timeout_s=180)
        sg = es.enter_context(UvicornThread(scenario_gen_app(ScenarioGenSettings(
            data_dir=root / "sets", checkpoint_every_s=0.0))))
        set_id = _generate_set(sg.url, mcp_url)
        judge_url = es.enter_context(serve_judge(
            base_url=f"{engine.url}/v1", model=base, cache_enabled=False,
            explanation_max_chars=16, max_output_tokens=512, extra_body={"seed": 0}))
        yield Stack(mcp_url, db_path, f"{engine.url}/v1", base, judge_url, sg.url, set_id)


@pytest.fixture(autouse=True)
def _unload_adapters(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test's runs publish their adapter to the shared engine, which holds at most
    ``max_loras``: unload them after the test so the next one starts from the base alone."""

    yield
    if "stack" not in request.fixturenames:
        return
    engine_url = request.getfixturevalue("stack").engine_url
    for card in httpx.get(f"{engine_url}/models", timeout=30).json()["data"]:
        if card.get("parent"):
            httpx.post(f"{engine_url}/unload_lora_adapter", json={"lora_name": card["id"]},
                       timeout=30).raise_for_status()
