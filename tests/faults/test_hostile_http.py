"""Hostile bodies against every JSON endpoint of the judge, scenario-gen, the engine and the
trainer's status server: wrong types, a huge body (announced or chunked), deeply nested JSON,
invalid UTF-8, not JSON at all. Each gets a 4xx with the JSON error body, and the service
answers its health check right after.

Cost: ~5 s (one tiny engine, the others need no model).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mcprl_common.process import UvicornThread, wait_healthy
from mcprl_common.request_limits import DEFAULT_MAX_BODY_BYTES

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(180)]
DEEP = 100_000  # levels of nesting: far past Python's recursion limit


@contextlib.contextmanager
def _served(app) -> Iterator[str]:
    with UvicornThread(app) as server:
        wait_healthy(server.url + "/healthz", timeout_s=120)
        yield server.url


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory, tiny_test_model: Path
             ) -> Iterator[dict[str, tuple[str, list[str]]]]:
    """name -> (base URL, the POST routes taking JSON)."""

    from mcprl_inference.app import create_app as engine_app
    from mcprl_inference.settings import InferenceSettings
    from mcprl_judge.app import create_app as judge_app
    from mcprl_judge.settings import JudgeSettings
    from mcprl_scenario_gen.app import create_app as sg_app
    from mcprl_scenario_gen.settings import ScenarioGenSettings as SgSettings
    from mcprl_trainer.metrics import TrainerMetrics
    from mcprl_trainer.status import RunStatus
    from mcprl_trainer.status import create_app as status_app

    root = tmp_path_factory.mktemp("hostile")
    with contextlib.ExitStack() as es:
        engine = es.enter_context(_served(engine_app(InferenceSettings(
            model=str(tiny_test_model), device="cpu", max_model_len=128,
            kv_cache_memory_gb=0.1, log_json=False))))
        judge = es.enter_context(_served(judge_app(JudgeSettings(
            base_url="http://127.0.0.1:9/v1", cache_path=root / "cache.sqlite3"))))
        sg = es.enter_context(_served(sg_app(SgSettings(data_dir=root / "sets"))))
        status = es.enter_context(_served(status_app(RunStatus("h", 1), TrainerMetrics())))
        yield {
            "engine": (engine, ["/v1/completions", "/v1/chat/completions",
                                "/v1/load_lora_adapter", "/v1/unload_lora_adapter"]),
            "judge": (judge, ["/v1/score-group"]),
            "scenario-gen": (sg, ["/v1/scenario-sets"]),
            "trainer": (status, ["/v1/status"]),  # GET only: a body to it is a 405
        }


def _deep_json(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


BODIES: dict[str, tuple[bytes, dict[str, str]]] = {
    "wrong types": (b'{"model": 5, "prompt": {"x": []}, "scenario": [], "trajectories": "no", '
                    b'"n": "many", "lora_name": 3, "mcp_url": 1}', {}),
    "array": (b"[1, 2, 3]", {}),
    "string": (b'"hello"', {}),
    "null": (b"null", {}),
    "not json": (b"this is { not json", {}),
    "invalid utf-8": (b'{"model": "\xff\xfe\xfa", "prompt": "\xc3\x28"}', {}),
    "deep json": (_deep_json(DEEP), {}),
    "deep array": (b"[" * DEEP + b"]" * DEEP, {}),
    "wrong content type": (b"<xml/>", {"content-type": "application/xml"}),
    "empty": (b"", {}),
}


def _assert_error(resp: httpx.Response, what: str) -> None:
    assert 400 <= resp.status_code < 500, (what, resp.status_code, resp.text[:300])
    body = resp.json()
    assert body["error"]["message"] and body["error"]["code"] == resp.status_code, (what, body)


@pytest.mark.parametrize("kind", list(BODIES))
def test_hostile_bodies_get_a_json_4xx(services, kind: str) -> None:
    data, headers = BODIES[kind]
    headers = {"content-type": "application/json", **headers}
    with httpx.Client(timeout=30) as client:
        for name, (url, routes) in services.items():
            for route in routes:
                resp = client.post(url + route, content=data, headers=headers)
                _assert_error(resp, f"{name} {route} {kind}")
            assert client.get(url + "/healthz").status_code == 200, name


def test_huge_bodies_get_413_announced_or_chunked(services) -> None:
    size = DEFAULT_MAX_BODY_BYTES + 1
    huge = b'{"x": "' + b"a" * size + b'"}'

    def chunks() -> Iterator[bytes]:  # no Content-Length: the server has to count
        for i in range(0, len(huge), 1 << 20):
            yield huge[i:i + (1 << 20)]

    with httpx.Client(timeout=60) as client:
        for name, (url, routes) in services.items():
            for route in routes[:1]:
                resp = client.post(url + route, content=huge,
                                   headers={"content-type": "application/json"})
                assert resp.status_code == 413, (name, resp.status_code)
                _assert_error(resp, f"{name} {route} huge")
                resp = client.post(url + route, content=chunks(),
                                   headers={"content-type": "application/json"})
                assert resp.status_code == 413, (name, "chunked", resp.status_code)
            assert client.get(url + "/healthz").status_code == 200, name
