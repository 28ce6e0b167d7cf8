"""Policy losses as pure tensor functions returning ``(loss, metrics)``, behind a registry.

All tensors are aligned on *target* positions: ``logprobs[b, t]`` is the trainer's log-prob
of the token at target position t, ``old_logprobs`` the sampler's (the engine's raw,
untempered log-prob of the same token), ``mask`` 1 exactly where the model generated the
token. Positions with mask 0 (prompt, tool results, template glue, padding) never contribute.

Normalisers make gradient accumulation exact: with ``token_mean`` the loss is divided by the
number of trained tokens of the *whole step* (``token_normalizer``), with ``seq_mean`` each
sequence's own token mean is divided by the number of sequences of the step
(``seq_normalizer``). Left unset, the micro-batch's own counts are used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

Aggregation = Literal["token_mean", "seq_mean"]


@dataclass(frozen=True)
class LossInputs:
    logprobs: torch.Tensor  # [B, T] trainer log-probs (requires grad)
    old_logprobs: torch.Tensor  # [B, T] sampler log-probs
    advantages: torch.Tensor  # [B]
    mask: torch.Tensor  # [B, T] 1 where the model generated the token
    ref_logprobs: torch.Tensor | None = None  # [B, T] base-model log-probs (KL)


@dataclass(frozen=True)
class LossSettings:
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    kl_coef: float = 0.0
    aggregation: Aggregation = "token_mean"
    token_normalizer: float | None = None
    seq_normalizer: float | None = None


class LossFn(Protocol):
    def __call__(
        self, inputs: LossInputs, settings: LossSettings
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


LOSSES: dict[str, LossFn] = {}


def register_loss(name: str) -> Callable[[LossFn], LossFn]:
    def deco(fn: LossFn) -> LossFn:
        LOSSES[name] = fn
        return fn

    return deco


def get_loss(name: str) -> LossFn:
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; known: {sorted(LOSSES)}") from None


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, settings: LossSettings) -> torch.Tensor:
    """Sum of masked per-token terms, normalised as the aggregation says (see module doc)."""

    mask = mask.to(per_token.dtype)
    if settings.aggregation == "token_mean":
        denom = settings.token_normalizer or mask.sum().clamp(min=1.0)
        return (per_token * mask).sum() / denom
    if settings.aggregation == "seq_mean":
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        denom = settings.seq_normalizer or float(per_token.shape[0])
        return per_seq.sum() / denom
    raise ValueError(f"unknown aggregation {settings.aggregation!r}")


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || ref): exp(r - p) - (r - p) - 1 >= 0."""

    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    n = mask.sum()
    return float((values * mask).sum() / n) if n > 0 else 0.0


def _with_kl(per_token: torch.Tensor, inputs: LossInputs, settings: LossSettings,
             mask: torch.Tensor, metrics: dict[str, float]) -> torch.Tensor:
    """``per_token`` plus the k3 KL penalty when it is on (and a reference is given); the
    penalty's mean goes into ``metrics["kl"]``."""

    if settings.kl_coef > 0 and inputs.ref_logprobs is not None:
        kl = k3_kl(inputs.logprobs, inputs.ref_logprobs)
        metrics["kl"] = _masked_mean(kl.detach(), mask)
        return per_token + settings.kl_coef * kl
    return per_token


@register_loss("grpo")
def grpo_loss(inputs: LossInputs, settings: LossSettings) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO with PPO's token-level clipped importance ratio against the sampler's log-probs.

    ``ratio = exp(logp - logp_sampler)`` corrects for the engine/trainer mismatch and for
    repeated updates on one batch; the clip keeps each update inside a trust region.
    """

    mask = inputs.mask.to(inputs.logprobs.dtype)
    adv = inputs.advantages.to(inputs.logprobs.dtype).unsqueeze(-1)
    log_ratio = (inputs.logprobs - inputs.old_logprobs) * mask  # 0 on masked positions
    ratio = torch.exp(log_ratio)
    high = settings.clip_eps_high if settings.clip_eps_high is not None else settings.clip_eps
    clipped = torch.clamp(ratio, 1.0 - settings.clip_eps, 1.0 + high)
    unclipped_obj = ratio * adv
    clipped_obj = clipped * adv
    per_token = -torch.minimum(unclipped_obj, clipped_obj)
    metrics: dict[str, float] = {}
    per_token = _with_kl(per_token, inputs, settings, mask, metrics)
    loss = aggregate(per_token, mask, settings)
    with torch.no_grad():
        is_clipped = (clipped_obj < unclipped_obj).to(mask.dtype)
        metrics["clip_fraction"] = _masked_mean(is_clipped, mask)
        metrics["ratio_mean"] = _masked_mean(ratio, mask)
        metrics["ratio_max"] = float(torch.where(mask > 0, ratio, 0).max()) if mask.any() else 0.0
        metrics["logprob_diff_abs"] = _masked_mean(log_ratio.abs(), mask)
    return loss, metrics


@register_loss("reinforce")
def reinforce_loss(
    inputs: LossInputs, settings: LossSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """Plain policy gradient ``-A * logp`` (on-policy; no ratio, no clip). A baseline to compare
    GRPO's clipping against; the sampler log-probs are only reported."""

    mask = inputs.mask.to(inputs.logprobs.dtype)
    adv = inputs.advantages.to(inputs.logprobs.dtype).unsqueeze(-1)
    per_token = -adv * inputs.logprobs
    metrics: dict[str, float] = {}
    per_token = _with_kl(per_token, inputs, settings, mask, metrics)
    loss = aggregate(per_token, mask, settings)
    with torch.no_grad():
        diff = ((inputs.logprobs - inputs.old_logprobs) * mask).abs()
        metrics["logprob_diff_abs"] = _masked_mean(diff, mask)
        metrics["clip_fraction"] = 0.0
    return loss, metrics
