"""The GRPO update of one step: micro-batches packed by a token budget, gradient accumulation,
AdamW with gradient clipping, bf16 autocast on GPU, optional KL to the base model.

The inputs are exactly the rollouts' token records: ``input_ids`` are the tokens the engine
was sent and sampled, ``mask`` marks the sampled ones, ``sampler_logprobs`` are the engine's
log-probs of those tokens. Nothing is re-tokenised here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mcprl_trainer.config import TrainConfig
from mcprl_trainer.loss import LossInputs, LossSettings, get_loss
from mcprl_trainer.modeling import token_logprobs


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


def pack_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Group sample indices so that ``rows * longest_row <= token_budget`` (padded tokens).

    Longest first, so similar lengths share a batch and padding stays small; a sample longer
    than the budget gets a batch of its own.
    """

    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
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


def _collate(samples: Sequence[TrainSample], pad_id: int, device: torch.device):
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


class GRPOUpdater:
    """Owns the optimizer and scheduler of the LoRA parameters and runs one step's update."""

    def __init__(self, model, config: TrainConfig, pad_token_id: int) -> None:
        self.model = model
        self.config = config
        self.pad_token_id = pad_token_id
        self.loss_fn = get_loss(config.loss)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters (is the LoRA attached?)")
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )
        warmup = config.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda n: min(1.0, (n + 1) / warmup) if warmup else 1.0
        )
        self.device = next(model.parameters()).device

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """One GRPO update (``epochs_per_step`` optimizer steps) on ``samples``."""

        cfg = self.config
        samples = [s for s in samples if s.num_trained > 0]
        metrics: dict[str, float] = {"train_samples": float(len(samples)), "train_tokens": 0.0}
        if not samples:
            return metrics
        total_tokens = float(sum(max(0, s.num_trained - s.mask[0]) for s in samples))
        settings = LossSettings(
            clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high, kl_coef=cfg.kl_coef,
            aggregation=cfg.loss_aggregation, token_normalizer=max(total_tokens, 1.0),
            seq_normalizer=float(len(samples)),
        )
        batches = pack_micro_batches([len(s.input_ids) for s in samples], cfg.micro_batch_tokens)
        started = time.perf_counter()
        sums: dict[str, float] = {}
        weight = 0.0
        self.model.train()
        for _ in range(cfg.epochs_per_step):
            self.optimizer.zero_grad(set_to_none=True)
            loss_total = 0.0
            for batch in batches:
                ids, attn, mask, old, adv = _collate(
                    [samples[i] for i in batch], self.pad_token_id, self.device
                )
                ref = None
                if cfg.kl_coef > 0:
                    with torch.no_grad(), self._autocast(), self.model.disable_adapter():
                        ref = token_logprobs(self.model, ids, attn, mask,
                                             shared_prefix=cfg.shared_prefix)
                with self._autocast():
                    logprobs = token_logprobs(self.model, ids, attn, mask,
                                              shared_prefix=cfg.shared_prefix)
                loss, mb_metrics = self.loss_fn(
                    LossInputs(logprobs, old, adv, mask, ref), settings
                )
                loss.backward()
                loss_total += float(loss.detach())
                n_tok = float(mask.sum())
                weight += n_tok
                for key, value in mb_metrics.items():
                    if key == "ratio_max":
                        sums[key] = max(sums.get(key, 0.0), value)
                    else:
                        sums[key] = sums.get(key, 0.0) + value * n_tok
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            sums["loss"] = sums.get("loss", 0.0) + loss_total
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(grad_norm)
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
        metrics["train_tokens"] = total_tokens
        metrics["micro_batches"] = float(len(batches))
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        metrics["train_seconds"] = elapsed
        processed = sum(len(s.input_ids) for s in samples) * epochs
        metrics["train_tokens_per_s"] = processed / elapsed if elapsed > 0 else 0.0
        return metrics

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
