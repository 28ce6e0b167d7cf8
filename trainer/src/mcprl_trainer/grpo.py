"""The GRPO update of one step: micro-batches packed by a token budget, gradient accumulation,
AdamW (or SGD) with gradient clipping, bf16 autocast on GPU, optional KL to the base model.

The inputs are exactly the rollouts' token records: ``input_ids`` are the tokens the engine
was sent and sampled, ``mask`` marks the sampled ones, ``sampler_logprobs`` are the engine's
log-probs of those tokens. Nothing is re-tokenised here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from mcprl_trainer.config import TrainConfig
from mcprl_trainer.loss import LossInputs, LossSettings, get_loss
from mcprl_trainer.modeling import reference_policy, token_logprobs


@dataclass(frozen=True)
class TrainSample:
    """One rollout as the trainer sees it (all lists have the same length)."""

    input_ids: list[int]
    mask: list[int]
    sampler_logprobs: list[float]
    advantage: float

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.mask) != n or len(self.sampler_logprobs) != n:
            raise ValueError("input_ids, mask and sampler_logprobs must have the same length")

    @property
    def num_trained(self) -> int:
        return sum(self.mask)

    @property
    def prompt_key(self) -> int:
        """A key of the tokens before the first trained one: equal for a group's rollouts."""

        start = self.mask.index(1) if 1 in self.mask else len(self.mask)
        return hash(tuple(self.input_ids[:start]))


def pack_micro_batches(lengths: Sequence[int], token_budget: int,
                       groups: Sequence[Hashable] | None = None) -> list[list[int]]:
    """Group sample indices so that ``rows * longest_row <= token_budget`` (padded tokens).

    Longest first, so similar lengths share a batch and padding stays small; a sample longer
    than the budget gets a batch of its own. With ``groups`` (a key per sample, e.g. its
    prompt), the rows of a group stay next to each other (groups by their longest row), so
    a micro-batch holds whole groups and runs each group's prompt once (``shared_prefix``).
    """

    if groups is None:
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    else:
        longest: dict[Hashable, int] = {}
        first: dict[Hashable, int] = {}
        for i, key in enumerate(groups):
            longest[key] = max(longest.get(key, 0), lengths[i])
            first.setdefault(key, i)
        order = sorted(range(len(lengths)), key=lambda i: (
            -longest[groups[i]], first[groups[i]], -lengths[i]))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        longest_if_added = max(longest, lengths[i])
        if current and (len(current) + 1) * longest_if_added > token_budget:
            batches.append(current)
            current, longest = [], 0
            longest_if_added = lengths[i]
        current.append(i)
        longest = longest_if_added
    if current:
        batches.append(current)
    return batches


def collate_samples(samples: Sequence[TrainSample], pad_id: int, device: torch.device):
    """Right-padded ids, attention mask, target mask (never the first token), sampler
    log-probs and advantages of ``samples``: the one collation of GRPO and SFT."""

    width = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.bool)
    old = torch.zeros((len(samples), width), dtype=torch.float32)
    for row, s in enumerate(samples):
        n = len(s.input_ids)
        ids[row, :n] = torch.tensor(s.input_ids)
        attn[row, :n] = 1
        mask[row, :n] = torch.tensor(s.mask, dtype=torch.bool)
        old[row, :n] = torch.tensor(s.sampler_logprobs, dtype=torch.float32)
    mask[:, 0] = False  # the first token has no prefix to predict it from
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return ids.to(device), attn.to(device), mask.to(device), old.to(device), adv.to(device)


@dataclass(frozen=True)
class StepPlan:
    """One step's update, decided once (on rank 0) and run by every rank: the samples, the
    step-wide normalisers, and which micro-batches (lists of sample indices) each rank runs.

    The micro-batches are those of a single process (``pack_micro_batches`` over all
    samples); with several ranks each gets whole micro-batches, balanced by padded tokens,
    so the summed gradients are the single process's.
    """

    samples: list[TrainSample]
    settings: LossSettings
    rank_batches: list[list[list[int]]]  # rank -> its micro-batches
    total_tokens: float

    @property
    def rounds(self) -> int:
        """Micro-batches every rank runs (the shorter shares are padded with empty ones:
        each forward and backward of a sharded model is a collective)."""

        return max((len(b) for b in self.rank_batches), default=0)

    @property
    def micro_batches(self) -> int:
        return sum(len(b) for b in self.rank_batches)


def assign_micro_batches(batches: Sequence[Sequence[int]], lengths: Sequence[int],
                         world_size: int) -> list[list[list[int]]]:
    """Whole micro-batches to ranks, largest first to the least loaded (by padded tokens)."""

    cost = [len(b) * max(lengths[i] for i in b) for b in batches]
    shares: list[list[list[int]]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for bi in sorted(range(len(batches)), key=lambda i: -cost[i]):
        rank = min(range(world_size), key=lambda r: (load[r], len(shares[r]), r))
        shares[rank].append(list(batches[bi]))
        load[rank] += cost[bi]
    return shares


def build_optimizer(params: list[torch.nn.Parameter], config: TrainConfig) -> torch.optim.Optimizer:
    """The configured optimizer over the trained (LoRA) parameters."""

    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum)
    return torch.optim.AdamW(params, lr=config.lr, betas=config.betas,
                             weight_decay=config.weight_decay)


class GRPOUpdater:
    """Owns the optimizer and scheduler of the LoRA parameters and runs one step's update.

    With ``world_size > 1`` the model is FSDP2-sharded (:mod:`mcprl_trainer.distributed`)
    and every rank runs :meth:`run` on the same :class:`StepPlan`, each its own share of the
    micro-batches; the sharded model sums the gradients across ranks.
    """

    def __init__(self, model, config: TrainConfig, pad_token_id: int, *, rank: int = 0,
                 world_size: int = 1) -> None:
        self.model = model
        self.config = config
        self.pad_token_id = pad_token_id
        self.rank = rank
        self.world_size = world_size
        # A shared-prefix pass is one more forward for some micro-batches only: ranks would
        # disagree on the number of collectives. Same loss either way, so it is off here.
        self.shared_prefix = config.shared_prefix and world_size == 1
        self.loss_fn = get_loss(config.loss)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters (is the LoRA attached?)")
        self.optimizer = build_optimizer(self.params, config)
        warmup = config.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda n: min(1.0, (n + 1) / warmup) if warmup else 1.0
        )
        self.device = next(model.parameters()).device

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def plan(self, samples: Sequence[TrainSample]) -> StepPlan:
        """Filter, normalise and split ``samples`` (pure: rank 0 plans, every rank runs)."""

        cfg = self.config
        samples = [s for s in samples if s.num_trained > 0]
        total_tokens = float(sum(max(0, s.num_trained - s.mask[0]) for s in samples))
        settings = LossSettings(
            clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high, kl_coef=cfg.kl_coef,
            aggregation=cfg.loss_aggregation, token_normalizer=max(total_tokens, 1.0),
            seq_normalizer=float(max(len(samples), 1)),
        )
        lengths = [len(s.input_ids) for s in samples]
        # with a shared prefix, a group's rollouts (the same prompt) share micro-batches
        groups = [s.prompt_key for s in samples] if self.shared_prefix else None
        batches = pack_micro_batches(lengths, cfg.micro_batch_tokens, groups) if samples else []
        shares = assign_micro_batches(batches, lengths, self.world_size)
        return StepPlan(samples, settings, shares, total_tokens)

    def step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """One GRPO update (``epochs_per_step`` optimizer steps) on ``samples``."""

        return self.run(self.plan(samples))

    def _filler(self) -> list[TrainSample]:
        """A 2-token micro-batch with one target, for a rank whose share ran out: its
        forward and backward take part in the collectives; its loss is multiplied by 0."""

        return [TrainSample([self.pad_token_id] * 2, [0, 1], [0.0, 0.0], 0.0)]

    def accumulate(self, plan: StepPlan) -> tuple[float, dict[str, float], float]:
        """Forward and backward over this rank's micro-batches (gradients accumulate).

        Returns this rank's summed loss, its token-weighted metric sums and their weight.
        """

        cfg = self.config
        mine = plan.rank_batches[self.rank] if plan.rank_batches else []
        sums: dict[str, float] = {}
        loss_total, weight = 0.0, 0.0
        sharded = self.world_size > 1
        for j in range(plan.rounds):
            real = j < len(mine)
            rows = [plan.samples[i] for i in mine[j]] if real else self._filler()
            if sharded:  # reduce the gradients once, with the last backward
                self.model.set_requires_gradient_sync(j == plan.rounds - 1)
            ids, attn, mask, old, adv = collate_samples(rows, self.pad_token_id, self.device)
            ref = None
            if cfg.kl_coef > 0:
                with torch.no_grad(), self._autocast(), reference_policy(self.model):
                    ref = token_logprobs(self.model, ids, attn, mask,
                                         shared_prefix=self.shared_prefix)
            with self._autocast():
                logprobs = token_logprobs(self.model, ids, attn, mask,
                                          shared_prefix=self.shared_prefix)
            loss, mb_metrics = self.loss_fn(
                LossInputs(logprobs, old, adv, mask, ref), plan.settings
            )
            # FSDP averages gradients over the ranks; each loss is a share of the step's sum
            (loss * (self.world_size if real else 0.0)).backward()
            if not real:
                continue
            loss_total += float(loss.detach())
            n_tok = float(mask.sum())
            weight += n_tok
            for key, value in mb_metrics.items():
                if key == "ratio_max":
                    sums[key] = max(sums.get(key, 0.0), value)
                else:
                    sums[key] = sums.get(key, 0.0) + value * n_tok
        return loss_total, sums, weight

    def clip_and_step(self) -> float:
        """Clip the global gradient norm (across shards), step optimizer and scheduler."""

        grads = [p.grad for p in self.params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        if hasattr(norm, "full_tensor"):  # a DTensor: the norm over every rank's shard
            norm = norm.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(self.params, self.config.max_grad_norm, norm)
        self.optimizer.step()
        self.scheduler.step()
        return float(norm)

    def _reduce(self, parts: tuple[float, dict[str, float], float]):
        if self.world_size == 1:
            return parts
        import torch.distributed as dist

        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, parts)
        loss = sum(g[0] for g in gathered)
        sums: dict[str, float] = {}
        for _, part, _ in gathered:
            for key, value in part.items():
                sums[key] = max(sums.get(key, 0.0), value) if key == "ratio_max" \
                    else sums.get(key, 0.0) + value
        return loss, sums, sum(g[2] for g in gathered)

    def run(self, plan: StepPlan) -> dict[str, float]:
        """Run ``plan``: every rank calls this with the same plan."""

        cfg = self.config
        metrics: dict[str, float] = {"train_samples": float(len(plan.samples)),
                                     "train_tokens": 0.0}
        if not plan.samples:
            return metrics
        started = time.perf_counter()
        sums: dict[str, float] = {}
        weight = 0.0
        self.model.train()
        for _ in range(cfg.epochs_per_step):
            self.optimizer.zero_grad(set_to_none=True)
            loss_total, mb_sums, mb_weight = self._reduce(self.accumulate(plan))
            weight += mb_weight
            for key, value in mb_sums.items():
                sums[key] = max(sums.get(key, 0.0), value) if key == "ratio_max" \
                    else sums.get(key, 0.0) + value
            grad_norm = self.clip_and_step()
            sums["loss"] = sums.get("loss", 0.0) + loss_total
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + grad_norm
        self.optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - started
        epochs = float(cfg.epochs_per_step)
        for key, value in sums.items():
            if key in ("loss", "grad_norm"):
                metrics[key] = value / epochs
            elif key == "ratio_max":
                metrics[key] = value
            else:
                metrics[key] = value / max(weight, 1.0)
        metrics["train_tokens"] = plan.total_tokens
        metrics["micro_batches"] = float(plan.micro_batches)
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        metrics["train_seconds"] = elapsed
        metrics["train_ranks"] = float(self.world_size)
        processed = sum(len(s.input_ids) for s in plan.samples) * epochs
        metrics["train_tokens_per_s"] = processed / elapsed if elapsed > 0 else 0.0
        return metrics

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if "optimizer" in state:  # a checkpoint from before dcp (the optimizer is in dcp/)
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
