"""Publishing through the tmpfs folder (mcprl_trainer.publish_dir): which runs use it, the
bounded folder, the checkpoint the writer thread completes from it, and our engine (real, on
loopback, the tiny model) serving the published adapter exactly as from the checkpoint,
falling back to the checkpoint when it cannot see the folder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from mcprl_common.process import UvicornThread
from mcprl_inference.app import create_app
from mcprl_inference.settings import InferenceSettings
from mcprl_trainer.checkpoint import latest_checkpoint
from mcprl_trainer.checkpoint_writer import CheckpointWriter
from mcprl_trainer.config import RunConfig
from mcprl_trainer.grpo import TrainSample
from mcprl_trainer.metrics import TrainerMetrics
from mcprl_trainer.policy import PolicyClient
from mcprl_trainer.publish import AdapterPublisher, served_adapter_path
from mcprl_trainer.publish_dir import (
    DEFAULT_ROOT,
    PREFIX,
    PublishDir,
    is_local_url,
    open_publish_dir,
    root_for,
)
from mcprl_trainer.recovery import RetryWindow
from mcprl_trainer.update_group import UpdateGroup

pytestmark = pytest.mark.timeout(120)
ADAPTER_FILE = "adapter_model.safetensors"
PROMPT = [101, 57, 230, 18, 999, 4, 312, 77]


def _config(model: Path, run: Path, **extra: Any) -> RunConfig:
    return RunConfig.model_validate({
        "model": str(model), "output_dir": str(run.parent), "name": run.name,
        "scenarios": {"dir": ".", "set_id": "none"}, "status": {"enabled": False},
        "train": {"device": "cpu", "lr": 1e-2, "micro_batch_tokens": 128}, **extra})


def _samples(seed: int) -> list[TrainSample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4):
        ids = torch.randint(1, 900, (16,), generator=g).tolist()
        mask = [0] * 6 + [1] * 10
        out.append(TrainSample(ids, mask, [-2.0 * m for m in mask], (-1.0) ** i))
    return out


@pytest.fixture
def trained(tiny_test_model: Path, tmp_path: Path) -> UpdateGroup:
    """The tiny model's LoRA after one update (B is no longer zero: it changes outputs)."""

    torch.manual_seed(0)
    group = UpdateGroup(_config(tiny_test_model, tmp_path / "train"))
    group.load(0)
    group.step(_samples(1))
    return group


# -- which runs publish through it ------------------------------------------------------------
def test_default_is_off_and_auto_is_dev_shm(tiny_test_model: Path, tmp_path: Path) -> None:
    assert _config(tiny_test_model, tmp_path / "run").publish_dir == "off"
    config = _config(tiny_test_model, tmp_path / "run", publish_dir="auto")
    assert root_for("auto") == (DEFAULT_ROOT if os.access(DEFAULT_ROOT, os.W_OK) else None)
    assert root_for("off") is None
    assert root_for(str(tmp_path)) == tmp_path
    with pytest.raises(ValueError, match="absolute path"):
        _config(tiny_test_model, tmp_path / "run", publish_dir="shm")

    publish_dir = open_publish_dir(config, distributed=False)
    try:
        assert publish_dir is not None and publish_dir.folder.parent == DEFAULT_ROOT
        assert publish_dir.folder.is_dir()
    finally:
        publish_dir.close()
    assert not publish_dir.folder.exists()
    assert open_publish_dir(_config(tiny_test_model, tmp_path / "run"),
                            distributed=False) is None


@pytest.mark.parametrize("extra, distributed", [
    ({"policy": {"engine_output_dir": "/outputs"}}, False),  # containers: other mounts
    ({"policy": {"base_url": "http://10.20.30.40:8000/v1"}}, False),  # another host
    ({"background_checkpoints": False}, False),  # the adapter is on disk before publishing
    ({}, True),  # several ranks save together
])
def test_falls_back_to_the_checkpoint_where_the_engine_cannot_share_it(
        tiny_test_model: Path, tmp_path: Path, extra: dict[str, Any], distributed: bool) -> None:
    config = _config(tiny_test_model, tmp_path / "run", publish_dir=str(tmp_path / "shm"),
                     **extra)
    assert open_publish_dir(config, distributed=distributed) is None
    assert not (tmp_path / "shm").exists()


def test_local_urls() -> None:
    for url in ("http://127.0.0.1:8000/v1", "http://localhost:8000/v1", "http://[::1]:8000",
                f"http://{socket.gethostname()}:8000/v1", "http://127.0.0.2:9/v1"):
        assert is_local_url(url), url
    for url in ("http://10.20.30.40:8000/v1", "http://inference:8000/v1",
                "http://[2001:db8::1]:8000/v1"):
        assert not is_local_url(url), url


# -- the folder ---------------------------------------------------------------------------------
def test_folder_keeps_two_versions_and_is_removed(trained: UpdateGroup, tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f"{PREFIX}crashed-run-{dead.pid}"  # a run killed before its cleanup
    orphan.mkdir()
    (orphan / "v3").mkdir()
    living = tmp_path / f"{PREFIX}other-run-{os.getppid()}"  # a run still going
    living.mkdir()

    publish_dir = PublishDir(tmp_path, "run")
    assert not orphan.exists() and living.is_dir()
    checkpoints = tmp_path / "run" / "checkpoints"
    for step in range(1, 5):
        staged = publish_dir.stage(step, trained, checkpoints / f"step-{step}")
        assert staged is not None and (staged.path / ADAPTER_FILE).is_file()
        assert (staged.path / "adapter_config.json").is_file()
    assert sorted(p.name for p in publish_dir.folder.iterdir()) == ["v3", "v4"]
    assert publish_dir.versions() == [3, 4]
    assert publish_dir.lookup(checkpoints / "step-2") is None
    assert publish_dir.lookup(checkpoints / "step-4").path == publish_dir.folder / "v4"
    publish_dir.close()
    assert not publish_dir.folder.exists() and living.is_dir()


def test_unwritable_folder_publishes_from_the_checkpoint(trained: UpdateGroup,
                                                          tmp_path: Path) -> None:
    publish_dir = PublishDir(tmp_path, "run")
    publish_dir.folder.rmdir()
    publish_dir.folder.write_text("not a folder")  # every write into it fails
    assert publish_dir.stage(1, trained, tmp_path / "step-1") is None
    assert publish_dir.versions() == []


def test_checkpoint_writer_completes_step_from_the_staged_adapter(
        trained: UpdateGroup, tmp_path: Path) -> None:
    run = tmp_path / "run"
    publish_dir = PublishDir(tmp_path / "shm", "run")
    staged = publish_dir.stage(1, trained, run / "checkpoints" / "step-1")
    writer = CheckpointWriter(run, background=True)
    ckpt = writer.save(1, trained, trained.trainer_state(), {"history": []}, staged=staged)
    assert staged.on_disk is not None
    staged.on_disk.result(timeout=60)
    writer.close()
    assert latest_checkpoint(run) == ckpt
    for name in (ADAPTER_FILE, "adapter_config.json"):
        assert (ckpt.path / name).read_bytes() == (staged.path / name).read_bytes()
    assert (ckpt.path / "dcp" / ".metadata").is_file()
    saved = load_file(ckpt.path / ADAPTER_FILE)
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in saved.items())


# -- a real engine ------------------------------------------------------------------------------
@pytest.fixture
def engine(tiny_test_model: Path) -> Iterator[str]:
    settings = InferenceSettings(model=str(tiny_test_model), device="cpu", max_model_len=256,
                                 kv_cache_memory_gb=0.1, log_json=False)
    with UvicornThread(create_app(settings)) as server:
        yield f"{server.url}/v1"


async def _greedy(client: PolicyClient, model: str) -> tuple[list[int], list[float]]:
    turn = await client.complete(model, PROMPT, max_tokens=8, temperature=0.0, seed=0)
    return turn.token_ids, turn.logprobs


def _published(trained: UpdateGroup, tmp_path: Path, publish_dir: PublishDir,
               step: int) -> Path:
    """Step ``step``'s adapter staged and its checkpoint written (in the background)."""

    checkpoint = tmp_path / "run" / "checkpoints" / f"step-{step}"
    staged = publish_dir.stage(step, trained, checkpoint)
    writer = CheckpointWriter(tmp_path / "run", background=True)
    writer.save(step, trained, trained.trainer_state(), {"history": []}, staged=staged)
    writer.close()
    return checkpoint


def _publishing(engine: str, model: Path, tmp_path: Path) -> tuple:
    """A run's config, publish folder, metrics, engine client and publisher wired to them."""

    config = _config(model, tmp_path / "run", policy={"base_url": engine})
    publish_dir = PublishDir(tmp_path / "shm", "run")
    metrics = TrainerMetrics()
    client = PolicyClient(engine, max_retries=0)
    publisher = AdapterPublisher(
        client, config, RetryWindow(window_s=5.0), publish_dir=publish_dir,
        on_loaded=lambda source: metrics.adapter_loads.labels(source).inc(),
        on_fallback=metrics.adapter_load_fallbacks.inc)
    return config, publish_dir, metrics, client, publisher


async def test_engine_serves_the_published_adapter_as_from_the_checkpoint(
        trained: UpdateGroup, tiny_test_model: Path, tmp_path: Path, engine: str) -> None:
    config, publish_dir, metrics, client, publisher = _publishing(engine, tiny_test_model,
                                                                  tmp_path)
    try:
        checkpoint = _published(trained, tmp_path, publish_dir, 1)
        name = await publisher.publish(checkpoint, version=1)
        assert await served_adapter_path(client, name) == str(publish_dir.folder / "v1")
        assert metrics.adapter_loads.labels("publish_dir")._value.get() == 1
        assert metrics.adapter_loads.labels("checkpoint")._value.get() == 0

        await client.load_adapter("from-checkpoint", str(checkpoint))
        published = await _greedy(client, name)
        assert published == await _greedy(client, "from-checkpoint")  # tokens and log-probs
        assert published[1] != (await _greedy(client, config.served_base))[1]  # not the base

        # The run ends: the engine is pointed at the checkpoint before the folder goes.
        await publisher.detach_publish_dir()
        publish_dir.close()
        assert await served_adapter_path(client, name) == str(checkpoint.resolve())
        assert await _greedy(client, name) == published
    finally:
        publish_dir.close()
        await client.aclose()


async def test_replica_that_cannot_see_the_folder_loads_the_checkpoint(
        trained: UpdateGroup, tiny_test_model: Path, tmp_path: Path, engine: str,
        caplog: pytest.LogCaptureFixture) -> None:
    _, publish_dir, metrics, client, publisher = _publishing(engine, tiny_test_model,
                                                             tmp_path)
    try:
        checkpoint = _published(trained, tmp_path, publish_dir, 1)
        # What an engine in another mount namespace sees: no such folder (it answers 404).
        staged = publish_dir.lookup(checkpoint)
        hidden = staged.path.with_name("hidden")
        staged.path.rename(hidden)
        name = await publisher.publish(checkpoint, version=1)
        assert await served_adapter_path(client, name) == str(checkpoint.resolve())
        assert metrics.adapter_load_fallbacks._value.get() == 1
        assert metrics.adapter_loads.labels("checkpoint")._value.get() == 1
        assert metrics.adapter_loads.labels("publish_dir")._value.get() == 0
        assert any("cannot see the publish dir" in r.message for r in caplog.records)

        # From then on that replica loads from the checkpoint at once (no second 404).
        trained.step(_samples(2))
        checkpoint = _published(trained, tmp_path, publish_dir, 2)
        await publisher.publish(checkpoint, version=2)
        assert await served_adapter_path(client, name) == str(checkpoint.resolve())
        assert metrics.adapter_load_fallbacks._value.get() == 1
        assert metrics.adapter_loads.labels("checkpoint")._value.get() == 2
    finally:
        publish_dir.close()
        await client.aclose()
