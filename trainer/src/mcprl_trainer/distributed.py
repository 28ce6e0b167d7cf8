"""The trainer on several processes (``torchrun --nproc-per-node N mcprl-train ...``).

torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous address; one
process per GPU (nccl), or per CPU process group (gloo) on machines without one. The policy
is sharded with FSDP2 (``fully_shard`` per decoder layer, then the whole model): the frozen
base and the LoRA are both split across ranks, only the LoRA has gradients. Rank 0 runs the
rollouts, the judge calls, the checkpoints' bookkeeping and the publishing; the other ranks
only follow its commands (:class:`mcprl_trainer.update_group.UpdateGroup`).
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in the trainer group (a single process: rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def context_from_env(env: Mapping[str, str] | None = None) -> DistContext:
    """The rank and world size torchrun gave this process (none: a single process)."""

    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return DistContext()
    return DistContext(int(env.get("RANK", "0")), world, int(env.get("LOCAL_RANK", "0")))


def init_distributed(device: torch.device, *, timeout_s: float = 1800.0,
                     env: Mapping[str, str] | None = None) -> DistContext:
    """Join torchrun's process group (nccl on GPUs, gloo on CPUs); a no-op alone.

    ``timeout_s`` bounds every collective: a follower waits for rank 0's next command while
    rank 0 samples a whole step of rollouts, so it is long.
    """

    import torch.distributed as dist

    ctx = context_from_env(env)
    if not ctx.enabled or dist.is_initialized():
        return ctx
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(ctx.local_rank)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    log.info("trainer group joined", extra={"rank": ctx.rank, "world_size": ctx.world_size,
                                            "backend": backend})
    return ctx


def rank_device(device: torch.device, ctx: DistContext) -> torch.device:
    """Each rank's own GPU (cuda:LOCAL_RANK); CPUs are shared."""

    if device.type == "cuda" and ctx.enabled:
        return torch.device("cuda", ctx.local_rank)
    return device


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The transformer blocks of a peft-wrapped causal LM (Qwen2, Llama, SmolLM2: .layers)."""

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = getattr(base, "model", base)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"cannot find the decoder layers of {type(base).__name__} to shard")
    return list(layers)


def shard_policy(model: Any) -> Any:
    """FSDP2: each decoder layer its own unit (all-gathered only while it runs), the rest
    (embeddings, norm, head) the root's. FSDP averages the gradients over the ranks; the
    updater scales its loss by the world size, so they are summed (the loss is already
    normalised by the whole step's token count). A divide factor of 1 would say the same,
    but gloo has no PREMUL_SUM to run it with."""

    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    return model


def broadcast_object(obj: Any = None, *, src: int = 0) -> Any:
    """``obj`` from ``src`` to every rank (pickled; small commands and step plans)."""

    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def destroy() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
