"""The policy and its update on every rank of the trainer group: rank 0 calls, the rest follow.

Rank 0 (the only rank in a single process) calls :meth:`UpdateGroup.load`, :meth:`step`
and :meth:`save_pretrained`; with several ranks each call is first broadcast as a command,
and :meth:`follow` runs it on the other ranks, so every rank takes part in the same
collectives in the same order. A step's samples travel once, as the plan of who runs which
micro-batches (:class:`mcprl_trainer.grpo.StepPlan`).

Checkpoints hold the LoRA and the optimizer state in torch.distributed.checkpoint format
(``dcp/``, written by every rank, each its own shards), so a run resumes with another
number of ranks (or with one); the full adapter is also written in peft's format (by rank
0, gathered), which is what the engines load. In one process a checkpoint can be written in
two parts (:mod:`mcprl_trainer.checkpoint_writer`): the adapter at once
(:meth:`UpdateGroup.save_adapter`), ``dcp/`` later from a host copy
(:meth:`UpdateGroup.snapshot_state`).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path
from typing import Any

import torch

from mcprl_trainer.checkpoint import TRAINER_STATE_FILE
from mcprl_trainer.checkpoint_writer import HostBuffers
from mcprl_trainer.config import RunConfig
from mcprl_trainer.distributed import DistContext, broadcast_object, rank_device, shard_policy
from mcprl_trainer.grpo import GRPOUpdater, TrainSample
from mcprl_trainer.modeling import attach_reference, load_policy, resolve_device

log = logging.getLogger(__name__)
DCP_DIR = "dcp"


def _state_options(**kwargs: Any):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, **kwargs)


def trainable_only(model: Any, state: dict[str, Any]) -> dict[str, Any]:
    """The LoRA's entries: ``ignore_frozen_params`` still lets a tied head through (the
    frozen embedding under its second name), which would put the vocabulary matrix in
    every checkpoint."""

    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in state.items() if k in names}


def _quiet_single_process():
    """dcp warns that it runs without a process group: one process is a case we mean."""

    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    return stack


def save_sharded(model: Any, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """The LoRA and its optimizer state with dcp (collective; each rank writes its shards)."""

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer, options=_state_options())
    with _quiet_single_process():
        dcp.save({"model": trainable_only(model, model_sd), "optim": optim_sd},
                 checkpoint_id=str(path))


class DcpSnapshot:
    """A host copy of what :func:`save_sharded` writes, written later by another thread."""

    def __init__(self, state: dict[str, Any], host: HostBuffers) -> None:
        self.state = state
        self.host = host

    def write(self, path: Path) -> None:
        import torch.distributed.checkpoint as dcp

        # catch_warnings is not thread-safe: the one-process warning is filtered for good
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        self.host.ready()
        dcp.save(self.state, checkpoint_id=str(path / DCP_DIR))


def load_sharded(model: Any, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Load what :func:`save_sharded` wrote, whatever the number of ranks that wrote it.

    dcp fails on an entry the checkpoint lacks, so every LoRA parameter is restored;
    ``strict=False`` only lets the frozen base stay as loaded."""

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer, options=_state_options())
    state = {"model": trainable_only(model, model_sd), "optim": optim_sd}
    with _quiet_single_process():
        dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"], options=_state_options(strict=False))


class UpdateGroup:
    """Model + updater of this rank, driven by rank 0 (see the module doc)."""

    def __init__(self, config: RunConfig, dist: DistContext | None = None) -> None:
        self.config = config
        self.dist = dist or DistContext()
        self.model: Any = None
        self.updater: GRPOUpdater | None = None
        self._host = HostBuffers()

    # -- rank 0's calls (broadcast first when there are followers) ------------------------
    def _call(self, name: str, *args: Any) -> Any:
        if self.dist.enabled:
            if not self.dist.is_main:
                raise RuntimeError("only rank 0 drives the trainer group")
            broadcast_object((name, args))
        return getattr(self, f"_do_{name}")(*args)

    def load(self, pad_token_id: int, adapter_path: Path | None = None,
             checkpoint_path: Path | None = None) -> None:
        """Load the base + LoRA (from ``adapter_path``: a warm start or a checkpoint), shard
        it, build the optimizer, and restore the optimizer and scheduler of
        ``checkpoint_path``."""

        self._call("load", pad_token_id, adapter_path, checkpoint_path)

    def step(self, samples: list[TrainSample]) -> dict[str, float]:
        assert self.updater is not None, "load() first"
        plan = self.updater.plan(samples)
        return self._call("step", plan)

    def save_pretrained(self, path: str) -> None:
        """What :func:`~mcprl_trainer.checkpoint.save_checkpoint` calls on the model."""

        self._call("save", path)

    def save_adapter(self, path: str) -> None:
        """The peft adapter alone (what the engines load), one process only."""

        assert not self.dist.enabled, "several ranks save with save_pretrained"
        self.model.save_pretrained(str(path), selected_adapters=["default"])

    def snapshot_state(self) -> DcpSnapshot | None:
        """A host copy of the LoRA and its optimizer state (``dcp/``), valid until the next
        call; None with several ranks, where dcp's save is collective (saved in the
        foreground)."""

        if self.dist.enabled:
            return None
        from torch.distributed.checkpoint.state_dict import get_state_dict

        assert self.updater is not None
        model_sd, optim_sd = get_state_dict(self.model, self.updater.optimizer,
                                            options=_state_options())
        state = {"model": trainable_only(self.model, model_sd), "optim": optim_sd}
        return DcpSnapshot(self._host.copy(state), self._host)

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The full LoRA (gathered from every rank's shards), on rank 0, in CPU memory."""

        return self._call("adapter_state")

    def trainer_state(self) -> dict[str, Any]:
        """The scheduler's state (the optimizer's is in ``dcp/``), saved by rank 0."""

        assert self.updater is not None
        return {"scheduler": self.updater.scheduler.state_dict(),
                "world_size": self.dist.world_size}

    def close(self) -> None:
        """Release the followers (their :meth:`follow` returns)."""

        if self.dist.enabled and self.dist.is_main:
            broadcast_object(("stop", ()))

    # -- every rank ------------------------------------------------------------------------
    def follow(self) -> None:
        """A follower's life: run rank 0's commands until it says stop."""

        while True:
            name, args = broadcast_object()
            if name == "stop":
                return
            getattr(self, f"_do_{name}")(*args)

    def _do_load(self, pad_token_id: int, adapter_path: Path | None,
                 checkpoint_path: Path | None) -> None:
        cfg = self.config
        device = rank_device(resolve_device(cfg.train.device), self.dist)
        train = cfg.train.model_copy(update={"device": str(device)})
        torch.manual_seed(cfg.seed)  # the same fresh LoRA on every rank
        model = load_policy(cfg.model, cfg.lora, train, adapter_path=adapter_path)
        if cfg.train.kl_coef > 0 and cfg.lora.init_adapter is not None:
            if self.dist.enabled:
                raise ValueError("train.kl_coef > 0 with lora.init_adapter (KL to the warm "
                                 "start) runs on one process only, not under torchrun")
            attach_reference(model, cfg.lora.init_adapter)  # also on resume: the warm start
        if self.dist.enabled:
            model = shard_policy(model)
        self.model = model
        self.updater = GRPOUpdater(model, train, pad_token_id, rank=self.dist.rank,
                                   world_size=self.dist.world_size)
        if checkpoint_path is None:
            return
        state = torch.load(Path(checkpoint_path) / TRAINER_STATE_FILE, weights_only=False)
        self.updater.load_state_dict(state)
        if (Path(checkpoint_path) / DCP_DIR).is_dir():
            load_sharded(model, self.updater.optimizer, Path(checkpoint_path) / DCP_DIR)

    def _do_step(self, plan) -> dict[str, float]:
        assert self.updater is not None
        return self.updater.run(plan)

    def _do_adapter_state(self) -> dict[str, torch.Tensor]:
        if not self.dist.enabled:
            return {n: p.detach().cpu().clone() for n, p in self.model.named_parameters()
                    if p.requires_grad}
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return trainable_only(self.model, get_model_state_dict(self.model, options=_state_options(
            full_state_dict=True, cpu_offload=True)))  # collective; empty on ranks > 0

    def _do_save(self, path: str) -> None:
        out = Path(path)
        assert self.updater is not None
        if self.dist.enabled:
            full = self._do_adapter_state()
            if self.dist.is_main:
                self.model.save_pretrained(str(out), state_dict=full)
        else:  # the trained adapter alone, not the frozen KL reference beside it
            self.model.save_pretrained(str(out), selected_adapters=["default"])
        save_sharded(self.model, self.updater.optimizer, out / DCP_DIR)
