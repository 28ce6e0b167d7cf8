"""Fixtures of the judge's tests.

``provider`` is a scripted stand-in for third-party OpenAI-compatible providers (OpenRouter,
OpenAI, ...) on loopback: it reproduces what our own engine never does (429 with
Retry-After, 5xx, rejecting json_schema, miscounting scores, echoing a key in a 401) so
the judge's handling of each is tested over real HTTP. The judgement plumbing against a real
model is tested with our inference engine (test_engine.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from mcprl_common.process import UvicornThread
from mcprl_common.wire import GroundTruth, Scenario
from mcprl_judge.loopback import serve_judge
from mcprl_judge.settings import JudgeSettings
from mcprl_testing.judge import sql_trajectory

Reply = dict[str, Any]  # {"status": int, "content": str, "headers": {...}, "body": {...}}


def completion(content: str, model: str = "fake-judge", finish_reason: str = "stop",
               prompt_tokens: int = 100, completion_tokens: int = 20) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "finish_reason": finish_reason,
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def scores_json(scores: list[float], explanation: str = "ok") -> str:
    return json.dumps({"scores": {str(i + 1): {"explanation": f"{explanation} {i + 1}",
                                               "score": s} for i, s in enumerate(scores)}})


@dataclass
class FakeProvider:
    """Answers each chat request with the next scripted reply (the last one repeats)."""

    url: str = ""
    script: list[Reply | Callable[[dict[str, Any]], Reply]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    inflight: int = 0
    max_inflight: int = 0

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def reply(self, body: dict[str, Any]) -> Reply:
        index = min(len(self.requests) - 1, len(self.script) - 1)
        item = self.script[index]
        return item(body) if callable(item) else item


def _provider_app(state: FakeProvider) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        state.requests.append(body)
        state.headers.append(dict(request.headers))
        reply = state.reply(body)
        state.inflight += 1
        state.max_inflight = max(state.max_inflight, state.inflight)
        try:
            if reply.get("delay"):
                await asyncio.sleep(reply["delay"])
        finally:
            state.inflight -= 1
        status = reply.get("status", 200)
        if status != 200:
            err = reply.get("body") or {"error": {"message": reply.get("message", "error")}}
            return JSONResponse(err, status_code=status, headers=reply.get("headers"))
        return JSONResponse(completion(reply["content"], model=body.get("model", "?"),
                                       finish_reason=reply.get("finish_reason", "stop")))

    return app


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    state = FakeProvider()
    server = UvicornThread(_provider_app(state))
    with server:
        state.url = server.url
        yield state


@pytest.fixture
def judge_factory(tmp_path: Path) -> Callable[..., Any]:
    """``with judge_factory(base_url=..., **settings) as url:`` a judge with test settings."""

    def make(**overrides: Any) -> Any:
        defaults: dict[str, Any] = dict(
            model="fake-judge", api_key="EMPTY", timeout_s=10.0, max_retries=2,
            backoff_initial_s=0.05, backoff_max_s=0.2, retry_after_s=3,
            cache_path=tmp_path / "judge-cache.sqlite3", log_json=True,
        )
        defaults.update(overrides)
        return serve_judge(JudgeSettings(**defaults))

    return make


@pytest.fixture
def scenario() -> Scenario:
    return Scenario(id="sc-test", task="How many employees work in Engineering?",
                    ground_truth=GroundTruth(kind="number", value=5))


def group_body(scenario: Scenario, answers: list[str | None], **extra: Any) -> dict[str, Any]:
    """A score-group request body: one trajectory per answer."""

    trajectories = [
        sql_trajectory(scenario.task, [("SELECT COUNT(*) FROM employees e JOIN departments d "
                                        "ON e.department_id = d.id WHERE d.name='Engineering'",
                                        json.dumps({"row_count": 1, "results": [{"n": 5}]}))],
                       answer).model_dump()
        for answer in answers
    ]
    return {"scenario": scenario.model_dump(), "trajectories": trajectories, **extra}


def post_group(url: str, body: dict[str, Any], timeout: float = 60.0) -> httpx.Response:
    return httpx.post(f"{url}/v1/score-group", json=body, timeout=timeout)


def metric_value(metrics_text: str, name: str, labels: str = "") -> float:
    """The value of one sample in Prometheus text (0 when absent)."""

    prefix = f"{name}{{{labels}}}" if labels else name
    for line in metrics_text.splitlines():
        if line.startswith(prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture
def helpers() -> Any:
    """Module-free access to the helpers above (tests import nothing from conftest)."""

    class H:
        group_body = staticmethod(group_body)
        post_group = staticmethod(post_group)
        metric_value = staticmethod(metric_value)
        scores_json = staticmethod(scores_json)
        completion = staticmethod(completion)

    return H
