"""One update on N local ranks (gloo on CPUs, nccl on GPUs), measured and compared.

What the sharded-update test and ``bench/bench_sharded_update.py`` share: rank 0 plans a
step and broadcasts it, every rank runs its micro-batches, and rank 0 writes what came out
(the loss, the full LoRA gradients, the parameters after the optimizer step, the timing) to
a file. ``world_size=1`` runs the same code in the calling process, without a process group:
the single-process reference.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mcprl_trainer.checkpoint import TRAINER_STATE_FILE
from mcprl_trainer.config import RunConfig
from mcprl_trainer.distributed import DistContext, broadcast_object
from mcprl_trainer.grpo import TrainSample
from mcprl_trainer.update_group import UpdateGroup


@dataclass
class ProbeSpec:
    """What to run: the model, its starting adapter, the samples, the train settings."""

    model: str
    samples: list[TrainSample]
    train: dict[str, Any] = field(default_factory=dict)
    init_adapter: str | None = None
    pad_token_id: int = 0
    threads: int = 1
    repeats: int = 1  # timed steps after the probe step (the bench)
    save_to: str | None = None  # a checkpoint directory written after the first step


def run_config(spec: ProbeSpec) -> RunConfig:
    lora: dict[str, Any] = {"init_adapter": spec.init_adapter} if spec.init_adapter else {}
    return RunConfig.model_validate({
        "model": spec.model, "scenarios": {"dir": ".", "set_id": "probe"},
        "lora": lora, "train": spec.train, "status": {"enabled": False}})


def _full(tensor: torch.Tensor) -> torch.Tensor:
    if hasattr(tensor, "full_tensor"):  # a DTensor shard: gather it (collective)
        tensor = tensor.full_tensor()
    return tensor.detach().to("cpu", torch.float32).clone()


def probe(spec: ProbeSpec, ctx: DistContext) -> dict[str, Any] | None:
    """Run the probe on this rank; rank 0 returns the results."""

    torch.set_num_threads(spec.threads)
    group = UpdateGroup(run_config(spec), ctx)
    group._do_load(spec.pad_token_id, spec.init_adapter, None)  # same arguments on every rank
    updater = group.updater
    assert updater is not None
    plan = updater.plan(spec.samples) if ctx.is_main else None
    if ctx.enabled:
        plan = broadcast_object(plan)
    updater.model.train()
    updater.optimizer.zero_grad(set_to_none=True)
    loss, _, _ = updater._reduce(updater.accumulate(plan))
    grads = {n: _full(p.grad) for n, p in updater.model.named_parameters()
             if p.requires_grad and p.grad is not None}
    updater.optimizer.zero_grad(set_to_none=True)
    if not ctx.is_main:  # the rest is rank 0's commands
        group.follow()
        return None
    out: dict[str, Any] = {"loss": loss, "grads": grads, "world_size": ctx.world_size,
                           "rank_batches": [len(b) for b in plan.rank_batches]}
    out["params_before"] = {k: v.float().clone() for k, v in group.adapter_state().items()}
    out["metrics"] = group.step(spec.samples)
    out["params"] = {k: v.float().clone() for k, v in group.adapter_state().items()}
    if spec.save_to:
        Path(spec.save_to).mkdir(parents=True, exist_ok=True)
        group.save_pretrained(spec.save_to)
        torch.save(group.trainer_state(), Path(spec.save_to) / TRAINER_STATE_FILE)
    seconds = []
    for _ in range(spec.repeats):
        t0 = time.perf_counter()
        group.step(spec.samples)
        seconds.append(time.perf_counter() - t0)
    out["step_seconds"] = seconds
    group.close()
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, spec: ProbeSpec, out: str) -> None:
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    cuda = str(spec.train.get("device", "auto")).startswith("cuda")
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        result = probe(spec, DistContext(rank, world, rank))
        if result is not None:
            torch.save(result, out)
        # No rank tears its process group down while a peer's last collective is in flight:
        # a CI run saw rank 1 abort in gloo's teardown ("terminate called without an active
        # exception") once, on a loaded 2-core machine.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_probe(spec: ProbeSpec, world_size: int, out_dir: Path) -> dict[str, Any]:
    """``world_size`` ranks on this machine (spawned; nccl with ``train.device`` cuda, one GPU
    each, else gloo), or this process alone for 1."""

    if world_size == 1:
        result = probe(spec, DistContext())
        assert result is not None
        return result
    import torch.multiprocessing as mp

    out = out_dir / f"probe-{world_size}.pt"
    mp.spawn(_worker, args=(world_size, free_port(), spec, str(out)), nprocs=world_size,
             join=True)
    return torch.load(out, weights_only=False)
