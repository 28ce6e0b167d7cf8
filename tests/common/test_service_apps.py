"""Every service's app, built with ``create_app`` on small temp settings and served on
loopback, answers the ops routes the same way: ``GET /healthz`` 200 with its name, and
``GET /metrics`` in Prometheus text format with ``mcprl_`` metrics on the app's own registry
(so the request just made is counted)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from mcprl_common.process import UvicornThread, free_port
from mcprl_common.settings import UpstreamSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _mcp_server(tmp: Path, models: Path) -> Any:
    from mcprl_mcp_server.app import create_app
    from mcprl_mcp_server.settings import McpServerSettings

    return create_app(McpServerSettings(db_path=tmp / "company.db", log_json=False))


def _inventory(tmp: Path, models: Path) -> Any:
    from mcprl_example_inventory.app import create_app
    from mcprl_example_inventory.settings import InventorySettings

    return create_app(InventorySettings(db_path=tmp / "inventory.db", items=20, movements=50))


def _inference(tmp: Path, models: Path) -> Any:
    from mcprl_inference.app import create_app
    from mcprl_inference.settings import InferenceSettings

    return create_app(InferenceSettings(model=str(models / "tiny-test"), max_model_len=256,
                                        max_batch_size=2, log_json=False))


def _scenario_gen(tmp: Path, models: Path) -> Any:
    from mcprl_scenario_gen.app import create_app
    from mcprl_scenario_gen.settings import ScenarioGenSettings

    generator = UpstreamSettings(base_url=f"http://127.0.0.1:{free_port()}/v1", model="none",
                                 max_retries=0, timeout_s=5)
    return create_app(ScenarioGenSettings(data_dir=tmp / "scenarios"), generator=generator)


def _judge(tmp: Path, models: Path) -> Any:
    from mcprl_judge.app import create_app
    from mcprl_judge.settings import JudgeSettings

    return create_app(JudgeSettings(base_url=f"http://127.0.0.1:{free_port()}/v1",
                                    model="none", cache_path=tmp / "judge-cache.sqlite3"))


def _trainer(tmp: Path, models: Path) -> Any:
    from mcprl_trainer.metrics import TrainerMetrics
    from mcprl_trainer.status import RunStatus, create_app

    return create_app(RunStatus("conventions", total_steps=1), TrainerMetrics())


# service -> (app factory, prefix of the metrics of its own work)
APPS: dict[str, tuple[Callable[[Path, Path], Any], str]] = {
    "mcp-server": (_mcp_server, "mcprl_mcp_"),
    "inventory-mcp": (_inventory, "mcprl_mcp_"),
    "inference": (_inference, "mcprl_inference_"),
    "scenario-gen": (_scenario_gen, "mcprl_scenario_gen_"),
    "judge": (_judge, "mcprl_judge_"),
    "trainer": (_trainer, "mcprl_trainer_"),
}


@pytest.mark.parametrize("service", list(APPS))
def test_healthz_and_prometheus_metrics(service: str, tmp_path: Path,
                                        tiny_test_model: Path) -> None:
    factory, own_prefix = APPS[service]
    app = factory(tmp_path, tiny_test_model.parent)
    with UvicornThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as client:
        health = client.get("/healthz")
        assert health.status_code == 200, health.text
        body = health.json()
        assert body["status"] == "ok" and body["service"] == service, body

        metrics = client.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"] == CONTENT_TYPE_LATEST  # Prometheus text
        families = {f.name: f for f in text_string_to_metric_families(metrics.text)}

    assert [n for n in families if n.startswith(own_prefix)], sorted(families)
    start = families["mcprl_service_start_time_seconds"].samples
    assert [s.labels["service"] for s in start] == [service]
    # The /healthz call above went through this app's request counter.
    counted = [s for s in families["mcprl_http_requests"].samples
               if s.name == "mcprl_http_requests_total" and s.labels["route"] == "/healthz"]
    assert [(s.labels["service"], s.labels["status"], s.value) for s in counted] == [
        (service, "200", 1.0)]
