"""Schemathesis against the OpenAPI document of the judge, scenario-gen, the engine and the
trainer's status server, each served on 127.0.0.1: schema-valid and schema-invalid requests
(wrong types, missing fields, odd strings) generated per operation, bounded in examples and
time. The bar: no 5xx, no hang (each request has a timeout), every response valid against
the document (status, headers, body schema), and every error a JSON body in the one shape.

Not checked: ``positive_data_acceptance`` (schemathesis expects every schema-valid request
to succeed; ours answer 400 for rules a JSON schema cannot state, such as a group size
against the deployment's limit, and say why). Left out of the run: the engine's ``/sleep``
and ``/wake_up`` (they stop the engine for every other request; tests/inference/test_sleep.py
covers them).

Cost: ~60-90 s on two cores (the engine decodes the valid completions, at most 256 tokens
each: its context is kept that short so that no valid request can take long).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mcprl_common.process import UvicornThread, wait_healthy

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(420)]
EXAMPLES = 20  # per operation and generation mode
REQUEST_TIMEOUT_S = 20.0  # a request slower than this counts as a hang


def _error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx/5xx answer is ``{"error": {"message": ..., "type": ..., "code": ...}}``."""

    if response.status_code < 400:
        return None
    try:
        body = response.json()
    except ValueError as exc:
        raise AssertionError(f"{response.status_code} without a JSON body: "
                             f"{response.text[:200]!r}") from exc
    error = body.get("error") if isinstance(body, dict) else None
    assert isinstance(error, dict) and error.get("message") and error.get("type") and \
        error.get("code") == response.status_code, f"not the error shape: {body!r}"
    return True


def fuzz(base_url: str, *, examples: int = EXAMPLES, exclude: tuple[str, ...] = (),
         rewrite: Callable[[Any], None] | None = None) -> dict[str, dict[int, int]]:
    """Fuzz every operation of ``base_url``'s OpenAPI; returns status counts per operation,
    raises AssertionError listing every failure found."""

    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    excluded = [positive_data_acceptance]
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    seen: dict[str, dict[int, int]] = {}
    failures: list[str] = []
    first_errors: list[str] = []  # as first seen (hypothesis may not reproduce a flaky one)
    def runner(op: Any, mode: Any, codes: dict[int, int]) -> Callable[[], None]:
        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck),
                  phases=[Phase.explicit, Phase.generate])
        def run(case: Any) -> None:
            if rewrite is not None:
                rewrite(case)
            try:
                response = case.call(timeout=REQUEST_TIMEOUT_S)
            except Exception as exc:  # a hang (timeout) or a dropped connection
                first_errors.append(f"{op.label}: {type(exc).__name__}: {exc}\n"
                                    f"{case.as_curl_command()}")
                raise
            codes[response.status_code] = codes.get(response.status_code, 0) + 1
            try:
                case.validate_response(response, excluded_checks=excluded,
                                       additional_checks=[_error_shape])
            except Exception as exc:
                first_errors.append(f"{op.label}: {exc}")
                raise

        return run

    for result in schema.get_all_operations():
        op = result.ok()
        if op.path in exclude:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            label = f"{op.label} [{mode.value}]"
            try:
                runner(op, mode, seen.setdefault(label, {}))()
            except Unsatisfiable:  # nothing to make invalid: the operation takes no input
                seen.pop(label)
            except Exception as exc:  # schemathesis' report: the failure and a curl repro
                failures.append(f"{label}: {exc}")
    assert not failures, "\n\n".join(failures + first_errors[:5])
    return seen


@contextlib.contextmanager
def _served(app: Any, health: str = "/healthz") -> Iterator[str]:
    with UvicornThread(app) as server:
        wait_healthy(server.url + health, timeout_s=120)
        yield server.url


@pytest.fixture(scope="module")
def engine_url(tiny_test_model: Path) -> Iterator[str]:
    from mcprl_inference.app import create_app
    from mcprl_inference.settings import InferenceSettings

    settings = InferenceSettings(model=str(tiny_test_model), device="cpu", max_model_len=160,
                                 max_batch_size=8, kv_cache_memory_gb=0.25, max_loras=2,
                                 seed=0, log_json=False, enable_sleep_mode=True)
    with _served(create_app(settings)) as url:
        yield url


def _report(name: str, seen: dict[str, dict[int, int]], started: float) -> None:
    total = sum(sum(c.values()) for c in seen.values())
    print(f"\n{name}: {total} requests in {time.perf_counter() - started:.1f}s")
    for label, codes in seen.items():
        print(f"  {label}: {dict(sorted(codes.items()))}")


def test_fuzz_judge(tmp_path: Path) -> None:
    from mcprl_judge.app import create_app
    from mcprl_judge.settings import JudgeSettings
    from mcprl_testing.judge import instant_provider

    # A stand-in for a hosted judge model answering at once (RULER on our engine works too,
    # tests/judge/test_engine.py, but at ~10-25 s a group on two CPU cores it would turn
    # the fuzz into a load test).
    started = time.perf_counter()
    with instant_provider() as provider_url:
        settings = JudgeSettings(base_url=provider_url, model="judge",
                                 cache_path=tmp_path / "cache.sqlite3", timeout_s=10,
                                 structured_output="json_schema")
        with _served(create_app(settings)) as url:
            seen = fuzz(url)
    _report("judge", seen, started)
    assert any(200 in c for label, c in seen.items() if "score-group" in label)


def test_fuzz_scenario_gen(tmp_path: Path) -> None:
    from mcprl_mcp_server.loopback import serve_mcp
    from mcprl_scenario_gen.app import create_app
    from mcprl_scenario_gen.settings import ScenarioGenSettings

    with serve_mcp(tmp_path / "mcp") as (mcp_url, _db):
        def loopback_only(case: Any) -> None:
            """Generations may only reach our MCP server: the fuzzer's URLs go nowhere."""

            if isinstance(case.body, dict) and isinstance(case.body.get("mcp_url"), str):
                case.body["mcp_url"] = mcp_url

        settings = ScenarioGenSettings(data_dir=tmp_path / "sets", max_scenarios=20,
                                       max_queued_jobs=4, checkpoint_every_s=0.0,
                                       mcp_connect_timeout_s=5, mcp_timeout_s=5)
        started = time.perf_counter()
        with _served(create_app(settings)) as url:
            seen = fuzz(url, rewrite=loopback_only)
    _report("scenario-gen", seen, started)
    assert any(202 in c for label, c in seen.items() if label.startswith("POST"))


def test_fuzz_engine(engine_url: str) -> None:
    started = time.perf_counter()
    seen = fuzz(engine_url, exclude=("/sleep", "/wake_up"))
    _report("inference", seen, started)
    assert any(200 in c for label, c in seen.items() if "/v1/completions" in label)


def test_fuzz_trainer_status() -> None:
    from mcprl_trainer.metrics import TrainerMetrics
    from mcprl_trainer.status import RunStatus, create_app

    started = time.perf_counter()
    with _served(create_app(RunStatus("fuzz", 3), TrainerMetrics())) as url:
        seen = fuzz(url)
    _report("trainer status", seen, started)
