"""Rollouts over two engine processes (our engine serving the tiny model, on free loopback
ports) plus a replica that is down: every group lands on a live one, both live engines
sample, both serve the adapter the step published, and the dead one is left out."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mcprl_common.process import ServiceProcess, free_port, wait_healthy
from mcprl_trainer.config import RunConfig
from mcprl_trainer.metrics import TrainerMetrics
from mcprl_trainer.trainer import Trainer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def two_engines(tiny_test_model: Path, tmp_path: Path) -> Iterator[list[str]]:
    procs = []
    for name in ("a", "b"):
        port = free_port()
        procs.append(ServiceProcess(f"inference-{name}", [sys.executable, "-m",
                                                          "mcprl_inference"], env={
            "INFERENCE_MODEL": str(tiny_test_model), "INFERENCE_PORT": str(port),
            "INFERENCE_DEVICE": "cpu", "INFERENCE_MAX_MODEL_LEN": "4096",
            "INFERENCE_KV_CACHE_MEMORY_GB": "0.25", "INFERENCE_SEED": "0",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
            health_url=f"http://127.0.0.1:{port}/healthz", log_path=tmp_path / f"{name}.log"))
    try:
        for proc in procs:  # both load at once; then wait for both
            proc.health_url, url = None, proc.health_url
            proc.start()
            proc.health_url = url
        for proc in procs:
            wait_healthy(proc.health_url, timeout_s=90, proc=proc.proc)
        yield [p.health_url.removesuffix("/healthz") + "/v1" for p in procs]
    finally:
        for proc in procs:
            proc.stop()


def _served(url: str) -> dict[str, str | None]:
    models = httpx.get(f"{url}/models", timeout=10).json()["data"]
    return {m["id"]: m.get("root") for m in models}


def _generated_tokens(url: str) -> float:
    text = httpx.get(f"{url.removesuffix('/v1')}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r"^vllm:generation_tokens_total\S* (\S+)$", text,
                                            re.M))


async def test_groups_spread_over_two_engines_and_both_serve_the_new_adapter(
        stack, two_engines: list[str], tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    config = RunConfig.model_validate(stack.run_config(
        tmp_path, name="replicas", steps=1, groups_per_step=4, model=stack.base_model,
        policy={"base_urls": [two_engines[0], dead, two_engines[1]],
                "replica_backoff_s": 30.0, "max_retries": 0},
        train={"lr": 1e-3, "device": "cpu", "skip_zero_variance": False}))
    metrics = TrainerMetrics()
    outcome = await Trainer(config, metrics=metrics).run()
    assert outcome.steps_done == 1
    step = config.run_dir / "checkpoints" / "step-1"
    assert (step / "dcp" / ".metadata").is_file()

    for url in two_engines:  # rollouts landed on both
        assert _generated_tokens(url) > 0, url
        served = _served(url)
        assert served.get("replicas") == str(step.resolve()), (url, served)

    scraped = {(s.labels["replica"], s.name): s.value for fam in metrics.registry.collect()
               if fam.name.startswith("mcprl_trainer_engine") for s in fam.samples}
    assert scraped[(dead, "mcprl_trainer_engine_replica_up")] == 0.0
    for url in two_engines:
        assert scraped[(url, "mcprl_trainer_engine_replica_up")] == 1.0
        assert scraped[(url, "mcprl_trainer_engine_requests_total")] > 0
        assert scraped[(url, "mcprl_trainer_engine_open_requests")] == 0.0
