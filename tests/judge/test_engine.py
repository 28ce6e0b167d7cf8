"""The judge against our inference engine on loopback: a real (tiny, random) model over real
HTTP with json_schema constrained decoding. The judgement itself is meaningless; the
plumbing is real: one score in [0, 1] per trajectory, explanations, usage, the cache
(counted on the engine's /metrics), 503 while the engine is down and recovery after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from mcprl_common.process import UvicornThread, free_port
from mcprl_inference.app import create_app as create_engine_app
from mcprl_inference.settings import InferenceSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
torch.set_num_threads(1)  # two cores shared by the whole team

MODEL_NAME = "tiny-judge"


def engine_settings(model: Path, port: int) -> InferenceSettings:
    return InferenceSettings(model=str(model), served_model_name=MODEL_NAME, port=port,
                             max_model_len=4096, max_batch_size=4, kv_cache_memory_gb=0.25,
                             log_json=False, seed=0)


@contextlib.contextmanager
def serve_engine(model: Path, port: int | None = None) -> Iterator[str]:
    port = port or free_port()
    with UvicornThread(create_engine_app(engine_settings(model, port)), port=port) as server:
        yield server.url


def engine_metric(url: str, name: str) -> float:
    """Sum of one metric's samples on the engine (all label sets)."""

    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def judge_settings(engine_url: str, **overrides: Any) -> dict[str, Any]:
    settings: dict[str, Any] = dict(
        base_url=f"{engine_url}/v1", model=MODEL_NAME, structured_output="json_schema",
        explanation_max_chars=40, max_output_tokens=400, timeout_s=60.0, max_retries=1,
        max_parse_retries=1)
    return {**settings, **overrides}


@pytest.fixture(scope="module")
def engine(tiny_test_model: Path) -> Iterator[str]:
    with serve_engine(tiny_test_model) as url:
        yield url


def test_real_model_scores_each_trajectory(engine, judge_factory, scenario, helpers) -> None:
    body = helpers.group_body(scenario, ["There are 5.", "No idea", "There are 5."])
    before = engine_metric(engine, "vllm:request_success_total")
    with judge_factory(**judge_settings(engine)) as url:
        resp = helpers.post_group(url, body, timeout=180)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert len(data["scores"]) == 3 and data["judge_model"] == MODEL_NAME
    for score in data["scores"]:
        assert 0.0 <= score["score"] <= 1.0
        assert 0.0 <= score["components"]["ruler"] <= 1.0
        assert isinstance(score["explanation"], str)
        assert set(score["components"]) >= {"ruler", "verifiable", "verifiable_partial",
                                             "penalty_malformed_tool_calls"}
    assert data["scores"][0]["components"]["ruler"] == data["scores"][2]["components"]["ruler"]
    assert data["scores"][0]["components"]["verifiable"] == 1.0  # "5" is right
    assert data["scores"][1]["components"]["verifiable"] == 0.0
    usage = data["usage"]
    assert usage["prompt_tokens"] > 100 and usage["completion_tokens"] > 0
    assert usage["upstream_calls"] == engine_metric(engine, "vllm:request_success_total") - before


def test_cache_spares_the_engine(engine, judge_factory, scenario, helpers) -> None:
    body = helpers.group_body(scenario, ["5", "4"])
    with judge_factory(**judge_settings(engine)) as url:
        first = helpers.post_group(url, body, timeout=180)
        assert first.status_code == 200, first.text
        prompt_tokens = engine_metric(engine, "vllm:prompt_tokens_total")
        requests = engine_metric(engine, "vllm:request_success_total")
        second = helpers.post_group(url, body, timeout=180)
    assert second.status_code == 200 and second.json()["cached"] is True
    assert second.json()["scores"] == first.json()["scores"]
    assert engine_metric(engine, "vllm:prompt_tokens_total") == prompt_tokens > 0
    assert engine_metric(engine, "vllm:request_success_total") == requests


def test_text_fallback_works_or_fails_clearly(engine, judge_factory, scenario,
                                              helpers) -> None:
    """Structured output off: a random model rarely writes JSON, so this mostly proves the
    bounded retries and the clear 502; when it does write JSON the scores must be valid."""

    before = engine_metric(engine, "vllm:request_success_total")
    settings = judge_settings(engine, structured_output="none", max_output_tokens=64,
                              max_parse_retries=1)
    with judge_factory(**settings) as url:
        resp = helpers.post_group(url, helpers.group_body(scenario, ["5", "6"]), timeout=180)
        metrics = httpx.get(f"{url}/metrics").text
    calls = engine_metric(engine, "vllm:request_success_total") - before
    if resp.status_code == 200:
        assert all(0 <= s["score"] <= 1 for s in resp.json()["scores"])
        assert 1 <= calls <= 2
    else:
        assert resp.status_code == 502, resp.text
        assert "no usable answer in 2 attempts" in resp.json()["error"]["message"]
        assert calls == 2
        assert helpers.metric_value(metrics, "mcprl_judge_failures_total",
                                    'kind="invalid_output"') == 2


def test_engine_down_gives_503_then_recovers(tiny_test_model, judge_factory, scenario,
                                             helpers) -> None:
    port = free_port()
    body = helpers.group_body(scenario, ["5", "7"])
    with judge_factory(**judge_settings(f"http://127.0.0.1:{port}", cache_enabled=False,
                                        retry_after_s=2)) as url:
        with serve_engine(tiny_test_model, port):
            up = helpers.post_group(url, body, timeout=180)
            assert up.status_code == 200, up.text
        down = helpers.post_group(url, body, timeout=60)  # the engine is stopped now
        assert down.status_code == 503, down.text
        assert down.headers["retry-after"] == "2"
        assert "unavailable" in down.json()["error"]["message"]
        with serve_engine(tiny_test_model, port):  # back on the same port
            again = helpers.post_group(url, body, timeout=180)
        metrics = httpx.get(f"{url}/metrics").text
    assert again.status_code == 200, again.text
    assert len(again.json()["scores"]) == 2
    assert helpers.metric_value(metrics, "mcprl_judge_requests_total",
                                'outcome="upstream_unavailable"') == 1
    assert helpers.metric_value(metrics, "mcprl_judge_requests_total", 'outcome="ok"') == 2
