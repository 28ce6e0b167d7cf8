"""Checkpoints written in the background (mcprl_trainer.checkpoint_writer), on the tiny model
and real files: the same content as a synchronous save, the state of save time whatever the
update does next, a failed write raised at the next wait with the previous checkpoint intact,
and a run that ends only once its last checkpoint is complete."""

from __future__ import annotations

import json
import random
import resource
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from mcprl_trainer.checkpoint import (
    STATE_FILE,
    Checkpoint,
    CheckpointWriteError,
    latest_checkpoint,
    list_checkpoints,
    load_trainer_state,
    restore_rng,
    save_checkpoint,
)
from mcprl_trainer.checkpoint_writer import CheckpointWriter
from mcprl_trainer.config import RunConfig
from mcprl_trainer.grpo import TrainSample
from mcprl_trainer.metrics import TrainerMetrics
from mcprl_trainer.update_group import DCP_DIR, UpdateGroup, load_sharded

pytestmark = pytest.mark.timeout(120)
ADAPTER_FILE = "adapter_model.safetensors"


def _config(model: Path, run: Path) -> RunConfig:
    return RunConfig.model_validate({
        "model": str(model), "output_dir": str(run.parent), "name": run.name,
        "scenarios": {"dir": ".", "set_id": "none"}, "status": {"enabled": False},
        "train": {"device": "cpu", "lr": 1e-2, "micro_batch_tokens": 128}})


def _group(model: Path, run: Path, checkpoint: Path | None = None) -> UpdateGroup:
    torch.manual_seed(0)
    group = UpdateGroup(_config(model, run))
    group.load(0, checkpoint, checkpoint)
    return group


def _samples(seed: int) -> list[TrainSample]:
    rng = random.Random(seed)
    out = []
    for i in range(4):
        ids = [rng.randrange(1, 900) for _ in range(rng.randint(12, 24))]
        mask = [0] * 6 + [1] * (len(ids) - 6)
        out.append(TrainSample(ids, mask, [-2.0 * m for m in mask], (-1.0) ** i))
    return out


def _saved(ckpt: Checkpoint, model: Path) -> dict[str, Any]:
    """Everything a checkpoint restores: adapter, LoRA + optimizer (dcp), scheduler, RNG,
    state.json (less its time stamp)."""

    group = _group(model, ckpt.path.parents[2] / "load", ckpt.path)
    optim = group.updater.optimizer.state_dict()
    trainer_state = load_trainer_state(ckpt)
    state = ckpt.state()
    state.pop("saved_at")
    return {"adapter": load_file(ckpt.path / ADAPTER_FILE), "params": group.adapter_state(),
            "optim": optim["state"], "scheduler": trainer_state["scheduler"],
            "rng": trainer_state["rng"], "state": state}


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}/{i}")
    else:
        assert a == b, where


@pytest.fixture
def trained(tiny_test_model: Path, tmp_path: Path) -> Iterator[UpdateGroup]:
    group = _group(tiny_test_model, tmp_path / "train")
    group.step(_samples(1))
    yield group


def test_background_checkpoint_is_the_synchronous_one(trained, tiny_test_model,
                                                     tmp_path) -> None:
    state = {"history": [{"step": 1, "loss": 0.5}], "evals": []}
    sync = save_checkpoint(tmp_path / "sync", 1, trained, trained.trainer_state(), state)
    writer = CheckpointWriter(tmp_path / "bg", background=True)
    ckpt = writer.save(1, trained, trained.trainer_state(), state)
    assert (ckpt.path / ADAPTER_FILE).is_file()  # publishable on return
    writer.close()
    assert latest_checkpoint(tmp_path / "bg") == ckpt and (ckpt.path / DCP_DIR).is_dir()
    assert sorted(p.name for p in ckpt.path.iterdir()) == sorted(
        p.name for p in sync.path.iterdir())
    a, b = _saved(sync, tiny_test_model), _saved(ckpt, tiny_test_model)
    assert a["optim"] and all(float(s["step"]) == 1 for s in a["optim"].values())
    _assert_same(a, b)

    # Resuming from either gives the same next step.
    after = []
    for saved in (sync, ckpt):
        group = _group(tiny_test_model, tmp_path / "resume", saved.path)
        restore_rng(load_trainer_state(saved)["rng"])
        metrics = group.step(_samples(2))
        after.append((metrics["loss"], group.adapter_state(),
                      group.updater.optimizer.state_dict()["state"], torch.rand(3)))
    _assert_same(after[0], after[1])


def _state_now(group: UpdateGroup) -> dict[str, Any]:
    optim = group.updater.optimizer.state_dict()["state"]
    return {"params": group.adapter_state(),
            "optim": {k: {n: t.clone() for n, t in v.items()} for k, v in optim.items()}}


def _assert_dcp_holds(path: Path, want: dict[str, Any], model: Path, tmp_path: Path) -> None:
    group = _group(model, tmp_path / "load")
    load_sharded(group.model, group.updater.optimizer, path / DCP_DIR)
    _assert_same(group.adapter_state(), want["params"], str(path))
    _assert_same(group.updater.optimizer.state_dict()["state"], want["optim"], str(path))


def test_the_snapshot_is_taken_at_save_time(trained, tiny_test_model, tmp_path) -> None:
    # The host copy, written only after the next update changed every tensor it copied.
    before = _state_now(trained)
    snapshot = trained.snapshot_state()
    trained.step(_samples(3))
    assert any(not torch.equal(t, before["params"][k])
               for k, t in trained.adapter_state().items())
    late = tmp_path / "late"
    late.mkdir()
    snapshot.write(late)
    _assert_dcp_holds(late, before, tiny_test_model, tmp_path)

    # Through the writer: an update and a longer history right after save() returns.
    before = _state_now(trained)
    history = [{"step": 2}]
    writer = CheckpointWriter(tmp_path / "bg", background=True)
    ckpt = writer.save(2, trained, trained.trainer_state(), {"history": history})
    trained.step(_samples(4))
    history.append({"step": 3})
    writer.close()
    _assert_dcp_holds(ckpt.path, before, tiny_test_model, tmp_path)
    assert ckpt.state()["history"] == [{"step": 2}]
    assert load_trainer_state(ckpt)["scheduler"]["last_epoch"] == 2


@pytest.fixture
def file_size_limit() -> Iterator[Any]:
    """Cap the size of any file this process writes (EFBIG past it): a volume with room for
    the small adapter but not for the optimizer state, without root."""

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead

    def limit(size: int) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))

    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_failed_background_write_is_raised_at_the_next_wait(trained, tiny_test_model,
                                                              tmp_path, file_size_limit) -> None:
    run = tmp_path / "bg"
    writer = CheckpointWriter(run, background=True)
    first = writer.save(1, trained, trained.trainer_state(), {"history": [{"step": 1}]})
    writer.wait()
    adapter = (first.path / ADAPTER_FILE).stat().st_size
    shards = max(p.stat().st_size for p in (first.path / DCP_DIR).iterdir())
    assert shards > adapter + 4096
    trained.step(_samples(4))

    file_size_limit(adapter + 4096)
    second = writer.save(2, trained, trained.trainer_state(), {"history": []})
    assert (second.path / ADAPTER_FILE).is_file()  # the adapter fit: published at once
    with pytest.raises(CheckpointWriteError) as info:
        writer.wait()
    file_size_limit(resource.RLIM_INFINITY)
    message = info.value.strerror
    assert "cannot write checkpoint step-2" in message and "File too large" in message
    assert "latest complete checkpoint is step-1" in message
    writer.wait()  # raised once

    assert list_checkpoints(run) == [first] and not (second.path / STATE_FILE).exists()
    assert sorted(p.name for p in second.path.iterdir()) == sorted(
        p.name for p in first.path.iterdir() if p.name in {ADAPTER_FILE, "adapter_config.json",
                                                           "README.md"})
    assert _saved(first, tiny_test_model)["state"]["history"] == [{"step": 1}]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]

    # Once there is room the same step is saved again, over its incomplete folder.
    writer.save(2, trained, trained.trainer_state(), {"history": []})
    writer.close()
    assert [c.step for c in list_checkpoints(run)] == [1, 2]


class _SlowWriteMetrics(TrainerMetrics):
    """Reports the last step's background write late: a run that did not wait for it would
    return before it is counted."""

    def __init__(self, last: int) -> None:
        super().__init__()
        self.last = last

    def observe_checkpoint_write(self, step: int, seconds: float) -> None:
        if step == self.last:
            import time

            time.sleep(2.0)
        super().observe_checkpoint_write(step, seconds)


@pytest.mark.integration
async def test_the_run_ends_once_its_last_checkpoint_is_complete(stack, tmp_path) -> None:
    from mcprl_trainer.trainer import Trainer

    config = RunConfig.model_validate(stack.run_config(tmp_path, name="bg-ckpt", steps=2))
    assert config.background_checkpoints
    metrics = _SlowWriteMetrics(last=2)
    trainer = Trainer(config, metrics=metrics)
    outcome = await trainer.run()
    assert outcome.steps_done == 2
    written = metrics.registry.get_sample_value(
        "mcprl_trainer_checkpoint_write_duration_seconds_count")
    assert written == 2  # the last write too, before run() returned
    assert [c.step for c in list_checkpoints(config.run_dir)] == [1, 2]
    last = latest_checkpoint(config.run_dir)
    assert last is not None and (last.path / DCP_DIR / ".metadata").is_file()
    assert [h["step"] for h in last.state()["history"]] == [1, 2]
    history = [json.loads(line) for line in
               (config.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(h["checkpoint_seconds"] >= 0 and h["publish_seconds"] >= 0 for h in history)
