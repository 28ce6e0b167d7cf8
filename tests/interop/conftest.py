"""Fixtures of the ART bridge's tests: one session-wide stack on loopback, the company-db
MCP server (the tutorial's 5/15/8 rows), our engine serving the tiny-test model, and our
judge whose judge model is that engine. Modules that need the extra skip without it
(``pytest.importorskip("mcprl_art")`` first: ``mcprl_art`` imports ``art`` and undoes what
that import does to transformers); the isolation checks run everywhere."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mcprl_common.process import UvicornThread, wait_healthy

ENGINE_MODEL = "tiny-test"


@dataclass(frozen=True)
class ArtStack:
    mcp_url: str
    db_path: Path
    engine_url: str  # with /v1
    engine_root: str
    model: str  # the engine's served name
    model_path: Path
    judge_url: str


@pytest.fixture(scope="session")
def art_stack(tmp_path_factory: pytest.TempPathFactory, tiny_test_model: Path
              ) -> Iterator[ArtStack]:
    from mcprl_inference.app import create_app as engine_app
    from mcprl_inference.settings import InferenceSettings
    from mcprl_judge.loopback import serve_judge
    from mcprl_mcp_server.loopback import serve_mcp

    root = tmp_path_factory.mktemp("art-stack")
    with contextlib.ExitStack() as es:
        mcp_url, db_path = es.enter_context(serve_mcp(root / "mcp", preset="tutorial"))
        engine = es.enter_context(UvicornThread(engine_app(InferenceSettings(
            model=str(tiny_test_model), served_model_name=ENGINE_MODEL, device="cpu", port=0,
            max_model_len=8192, kv_cache_memory_gb=0.25, max_batch_size=8, seed=0,
            log_json=False))))
        wait_healthy(f"{engine.url}/healthz", timeout_s=180)
        judge_url = es.enter_context(serve_judge(
            base_url=f"{engine.url}/v1", model=ENGINE_MODEL, cache_enabled=False,
            explanation_max_chars=16, max_output_tokens=256, max_parse_retries=1,
            extra_body={"seed": 0}, log_json=False))
        yield ArtStack(mcp_url, db_path, f"{engine.url}/v1", engine.url, ENGINE_MODEL,
                       tiny_test_model, judge_url)


@pytest.fixture(scope="session")
def renderer(tiny_test_model: Path):
    from mcprl_trainer.modeling import load_tokenizer
    from mcprl_trainer.rendering import ChatRenderer

    return ChatRenderer(load_tokenizer(str(tiny_test_model)))
