"""Supervised fine-tuning on expert token records, loss on assistant tokens only: every
parameter (a from-scratch model) or a LoRA adapter on a pretrained one (``lora_r > 0``,
saved alone: a few MB to ship, loaded on top of the base by the engine and the trainer).

Inputs are JSONL rows ``{"input_ids": [...], "mask": [...]}`` written by
:mod:`mcprl_demo.sft_data` with the trainer's own renderer, so the model learns exactly the
token sequences the trainer's agent loop samples and parses. Only torch, transformers and
the trainer's modeling helpers are imported here: this stage runs on a bare GPU box as well
as on a laptop CPU (device ``auto``: CUDA with bf16 autocast when present, fp32 on CPU).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mcprl_common.files import make_readable
from mcprl_trainer.grpo import TrainSample, collate_samples, pack_micro_batches
from mcprl_trainer.modeling import token_logprobs

log = logging.getLogger(__name__)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "generation_config.json")


@dataclass(frozen=True)
class SftExample:
    input_ids: list[int]
    mask: list[int]  # 1 where the token is the assistant's (trained), 0 elsewhere

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.mask):
            raise ValueError("input_ids and mask differ in length")

    @property
    def trained_tokens(self) -> int:
        return sum(self.mask)


@dataclass
class SftSettings:
    """Hyper-parameters of one SFT run (``sft:`` in configs/warmstart*.yaml)."""

    steps: int = 400  # optimizer steps
    batch_size: int = 16  # sequences per optimizer step
    micro_batch_tokens: int = 16384  # padded tokens per forward pass (gradient accumulation)
    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # cosine decay to lr * min_lr_ratio
    warmup_steps: int = 20
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    max_grad_norm: float = 1.0
    max_len: int = 4096  # longer examples are dropped (never truncated mid-turn)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | float32 | bfloat16
    threads: int = 0  # torch CPU threads; 0 = leave torch's default
    log_every: int = 10
    seed: int = 0
    init: str = "random"  # random: seeded fresh init of the base's config | weights: its weights
    save_dtype: str = "float32"  # float32 | bfloat16 (half the size, e.g. to ship or carry)
    save_at: list = field(default_factory=list)  # extra checkpoints <out>-step<N> at these steps
    # Run the prefix every example shares (system prompt + tool schemas: ~60% of the tokens)
    # once per micro-batch and the rest of each example through its KV cache, repeated per
    # row. Exact (the gradients of all rows flow back into the one prefix pass) and ~2-3x
    # less work on a CPU.
    shared_prefix: bool = False
    # Wall-clock budget (0: off). The schedule then runs on the larger of step / steps and
    # elapsed / max_seconds, and training stops at whichever ends first: a GPU run that must
    # fit its slot still gets a complete warm-up + cosine decay. Not bit-reproducible (the
    # step count depends on the machine); the result records the steps actually done.
    max_seconds: float = 0.0
    # LoRA instead of every parameter (0: full fine-tune). Needs init: weights; the adapter
    # (all linear layers, the trainer's LoraSettings) is what gets saved, in save_dtype.
    lora_r: int = 0
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    extra: dict = field(default_factory=dict)  # forward-compatible knobs, recorded only


def load_examples(path: Path) -> list[SftExample]:
    rows = []
    with path.open() as fh:
        for line in fh:
            if line.strip():
                data = json.loads(line)
                rows.append(SftExample(data["input_ids"], data["mask"]))
    return rows


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def lr_at(step: int, s: SftSettings, elapsed_s: float = 0.0) -> float:
    """Linear warm-up, then cosine decay to ``lr * min_lr_ratio`` at the last step (or at
    ``max_seconds``, when a time budget is set and ends first)."""

    if step < s.warmup_steps:
        return s.lr * (step + 1) / max(1, s.warmup_steps)
    span = max(1, s.steps - s.warmup_steps)
    progress = min(1.0, (step - s.warmup_steps) / span)
    if s.max_seconds > 0:
        progress = max(progress, min(1.0, elapsed_s / s.max_seconds))
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * cosine)


def batches(n: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """Endless epochs of shuffled indices, cut into batches (seeded: reproducible order)."""

    rng = random.Random(seed)
    order: list[int] = []
    while True:
        if len(order) < batch_size:
            fresh = list(range(n))
            rng.shuffle(fresh)
            order += fresh
        yield order[:batch_size]
        order = order[batch_size:]


def micro_batches(examples: Sequence[SftExample], idx: list[int], budget: int) -> list[list[int]]:
    """Split a batch so each forward pass holds at most ``budget`` padded tokens: the GRPO
    update's packing (longest first), over this batch's rows."""

    packed = pack_micro_batches([len(examples[i].input_ids) for i in idx], budget)
    return [[idx[j] for j in mb] for mb in packed]


def nll_sum(model, examples: Sequence[SftExample], pad_id: int, device: torch.device, *,
            shared_prefix: bool = False) -> tuple[torch.Tensor, int]:
    """Summed next-token NLL over the trained tokens of ``examples``, and how many there
    were: the GRPO update's collation and token log-probs (logits only where a token is
    trained; with ``shared_prefix`` the rows' common start runs once)."""

    rows = [TrainSample(e.input_ids, e.mask, [0.0] * len(e.input_ids), 0.0) for e in examples]
    ids, att, mask, _, _ = collate_samples(rows, pad_id, device)
    logprobs = token_logprobs(model, ids, att, mask, shared_prefix=shared_prefix)
    return -logprobs.sum(), int(mask.sum())


@dataclass
class SftResult:
    steps: int
    seconds: float
    tokens_seen: int  # padded tokens through forward+backward
    trained_tokens: int  # assistant tokens the loss was computed on
    final_loss: float
    losses: list[tuple[int, float]]
    device: str
    parameters: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_seen / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict:
        return {"steps": self.steps, "seconds": round(self.seconds, 2),
                "tokens_seen": self.tokens_seen, "trained_tokens": self.trained_tokens,
                "tokens_per_s": round(self.tokens_per_s, 1), "final_loss": self.final_loss,
                "device": self.device, "parameters": self.parameters,
                "losses": [[s, round(v, 5)] for s, v in self.losses]}


def load_model(base: Path, seed: int, device: torch.device, init: str = "random"):
    """The model SFT starts from: a seeded random init of the base's config (the tiny models
    are random anyway, and a config-only base dir keeps a GPU carry small), or its weights.
    The init runs on the CPU, so the same seed gives the same start on any device."""

    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    if init == "weights":
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    elif init == "random":
        config = AutoConfig.from_pretrained(base)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        raise ValueError(f"sft.init must be 'random' or 'weights', got {init!r}")
    return model.to(device)


def train(
    examples: Sequence[SftExample],
    base: Path,
    out_dir: Path,
    settings: SftSettings,
    *,
    progress: Callable[[int, float, float], None] | None = None,
) -> SftResult:
    """Fine-tune every parameter of ``base`` on ``examples``; save an HF model dir."""

    if not examples:
        raise ValueError("no SFT examples")
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    random.seed(settings.seed)
    device = resolve_device(settings.device)
    use_bf16 = settings.dtype == "bfloat16" or (settings.dtype == "auto" and device.type == "cuda")
    save_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[settings.save_dtype]
    model = load_model(base, settings.seed, device, settings.init)
    if settings.lora_r:
        model = _with_lora(model, settings)
    model.train()
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if p.ndim >= 2 and "norm" not in n]
    no_decay = [p for n, p in named if p.ndim < 2 or "norm" in n]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr, betas=settings.betas, fused=device.type == "cuda")
    batch_iter = batches(len(examples), min(settings.batch_size, len(examples)), settings.seed)
    losses: list[tuple[int, float]] = []
    tokens_seen = trained = 0
    running = None
    started = time.perf_counter()
    done = 0
    for step in range(settings.steps):
        elapsed = time.perf_counter() - started
        if settings.max_seconds > 0 and elapsed >= settings.max_seconds:
            log.info("sft: time budget of %.0fs reached after %d steps", settings.max_seconds,
                     step)
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, settings, elapsed)
        idx = next(batch_iter)
        n_trained = sum(examples[i].trained_tokens for i in idx)
        step_loss = 0.0
        for mb in micro_batches(examples, idx, settings.micro_batch_tokens):
            ctx = (torch.autocast("cuda", dtype=torch.bfloat16) if use_bf16
                   else torch.autocast("cpu", enabled=False))
            with ctx:
                loss_sum, _ = nll_sum(model, [examples[i] for i in mb], pad_id, device,
                                      shared_prefix=settings.shared_prefix)
            (loss_sum / max(1, n_trained)).backward()
            step_loss += float(loss_sum.detach())
            tokens_seen += len(mb) * max(len(examples[i].input_ids) for i in mb)
        trained += n_trained
        torch.nn.utils.clip_grad_norm_([p for _, p in named], settings.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean = step_loss / max(1, n_trained)
        running = mean if running is None else 0.9 * running + 0.1 * mean
        if step + 1 in settings.save_at and step + 1 < settings.steps:
            save(model, base, out_dir.with_name(f"{out_dir.name}-step{step + 1}"), save_dtype)
        done = step + 1
        if step % settings.log_every == 0 or step == settings.steps - 1:
            losses.append((step, mean))
            if progress is not None:
                progress(step, mean, time.perf_counter() - started)
            else:
                log.info("sft step %d loss %.4f lr %.2e", step, mean, group["lr"])
    seconds = time.perf_counter() - started
    save(model, base, out_dir, save_dtype)
    return SftResult(done, seconds, tokens_seen, trained, float(running or 0.0),
                     losses, str(device), sum(p.numel() for _, p in named))


def _with_lora(model, settings: SftSettings):
    """The trainer's own LoRA (all linear layers), so RL continues exactly this adapter."""

    from mcprl_trainer.config import LoraSettings
    from mcprl_trainer.modeling import attach_lora

    if settings.init != "weights":
        raise ValueError("sft.lora_r > 0 adapts a pretrained model: set sft.init to 'weights'")
    lora = LoraSettings(r=settings.lora_r, alpha=settings.lora_alpha,
                        dropout=settings.lora_dropout)
    return attach_lora(model, lora)


def save(model, base: Path, out_dir: Path, dtype: torch.dtype = torch.float32) -> None:
    """Write atomically a copy of the model (``dtype``) with the base's tokenizer files, or
    its LoRA adapter alone (the base, tokenizer included, is loaded from its own folder)."""

    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if hasattr(model, "peft_config"):
        save_adapter(model, tmp, dtype)
    else:
        model = copy.deepcopy(model).to("cpu", dtype=dtype)  # the trained one stays as it is
        model.config.use_cache = True
        model.config.dtype = str(dtype).removeprefix("torch.")
        model.save_pretrained(tmp, safe_serialization=True)
        for name in TOKENIZER_FILES:
            src = base / name
            if src.exists() and not (tmp / name).exists():
                shutil.copy2(src, tmp / name)
    make_readable(tmp)  # served by an engine that may run as another user
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)


def save_adapter(model, out_dir: Path, dtype: torch.dtype) -> None:
    """peft's adapter files (config + weights in ``dtype``), without copying the base."""

    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    state = {k: v.detach().to("cpu", dtype=dtype).contiguous()
             for k, v in get_peft_model_state_dict(model).items()}
    save_file(state, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    model.peft_config["default"].save_pretrained(str(out_dir))
