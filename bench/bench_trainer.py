"""The trainer's GRPO update: tokens/s and peak memory, ours vs a plain full-logits step,
side by side in one run (JSON).

Ours (``mcprl_trainer.grpo.GRPOUpdater``): logits only at the trained (sampled) positions of
each row, fp32 log-softmax on those alone, token-budget micro-batches. Baseline: the same
model, LoRA, micro-batches, loss and optimizer, but the usual full ``[B, T, vocab]`` logits
and a full log-softmax, as a straightforward HF training step computes them.

CPU (default): ``tiny-wide``, two small layers under Qwen's 151,936-wide vocabulary (random
weights), where the logits dominate as they do at 3B; ``tiny-learn`` (``make tiny-model``)
has a 1k vocabulary, so there both steps cost about the same. GPU, the anchors' shape
(bench/anchors.json: LoRA r=8 on all linear layers, AdamW, gradient
checkpointing, bf16 autocast; 14,703 tokens/s at 8 x 4096 there)::

    python bench/bench_trainer.py --device cuda --model-shape qwen2.5-3b --batch 8 --seq 4096

The demo's case (CPU, a 5M-class model, 4 rollouts of ~2,300 tokens whose first ~1,400 are the
shared system prompt + tools): ``--model-shape tiny-learn --batch 4 --seq 2300 --turns 5
--trained-frac 0.06 --shared-prompt 1400 --threads 2`` adds ``ours_shared_prefix``.

``--arm NAME:field=value,...`` adds ours under other ``train`` settings (e.g.
``--arm no_ckpt:gradient_checkpointing=false,micro_batch_tokens=8192`` or
``liger_kernels=true``), each on a fresh model; ``--kernel-profile`` (CUDA) adds, per arm, the
kernels of one step by class (bench/kernel_profile.py).

Rows are multi-turn agent rollouts: ``--turns`` sampled segments interleaved with prompt and
tool-result segments; ``--trained-frac`` of the tokens are sampled (trained). ``--direction``
also checks, on the same device and dtype, that rewarding a behaviour raises its probability.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for sub in ("common/src", "inference/src", "trainer/src"):
    sys.path.insert(0, str(REPO / sub))

import torch  # noqa: E402
import yaml  # noqa: E402
from anchors import anchors  # noqa: E402  (bench/, the script's own folder)
from kernel_profile import kernel_profile  # noqa: E402
from model_shapes import QWEN25_3B  # noqa: E402

from mcprl_trainer.config import LoraSettings, TrainConfig  # noqa: E402
from mcprl_trainer.grpo import GRPOUpdater, TrainSample, collate_samples  # noqa: E402
from mcprl_trainer.loss import LossInputs, LossSettings, get_loss  # noqa: E402
from mcprl_trainer.modeling import (  # noqa: E402
    prepare_policy,
    resolve_device,
    resolve_dtype,
    token_logprobs,
)

ANCHOR_TOKENS_PER_S = anchors()["lora_step_tokens_per_s"]  # plain HF+peft step, H200


def build_base(shape: str, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    if shape == "tiny-wide":  # tiny layers, Qwen's 151,936-wide vocabulary: logits dominate
        small = {**QWEN25_3B, "hidden_size": 128, "intermediate_size": 384,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
        with torch.device(device):
            return AutoModelForCausalLM.from_config(Qwen2Config(**small), dtype=dtype)
    if shape == "qwen2.5-3b":
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(Qwen2Config(**QWEN25_3B), dtype=dtype)
        return model
    path = REPO / "models" / shape
    if not (path / "config.json").exists():
        raise SystemExit(f"{path} missing: run `make tiny-model`")
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)


def make_samples(n: int, seq: int, vocab: int, turns: int, trained_frac: float,
                 seed: int = 0, shared: int = 0, group_size: int = 0) -> list[TrainSample]:
    """Rows of ~seq tokens: a prompt (its first ``shared`` tokens the same in every row, as a
    system prompt + tool schemas are), then `turns` x (sampled segment, tool segment).

    ``group_size``: rows come in GRPO groups, the rollouts of one task: every row of a group
    has its first row's whole prompt, and its own length and continuation."""

    rng = random.Random(seed)
    common = [rng.randrange(vocab) for _ in range(shared)]
    out = []
    head: list[int] = []  # the prompt of the current group
    for i in range(n):
        length = int(seq * rng.uniform(0.9, 1.0))
        sampled_total = int(length * trained_frac)
        tool_len = max(1, length // (8 * turns))  # each tool segment between turns
        tools = (turns - 1) * tool_len
        prompt = length - sampled_total - tools
        if shared > prompt:
            raise SystemExit(f"--shared-prompt {shared} is longer than the prompt ({prompt})")
        if group_size and i % group_size:  # the group's prompt, the rest its own
            prompt = min(len(head), length - tools - turns)
            sampled_total = length - prompt - tools
            ids = head[:prompt] + [rng.randrange(vocab) for _ in range(length - prompt)]
        else:
            ids = common + [rng.randrange(vocab) for _ in range(length - shared)]
            head = ids[:prompt]
        mask = [0] * length
        pos, per_turn = max(prompt, 1), sampled_total // turns
        for _ in range(turns):
            for j in range(pos, min(pos + per_turn, length)):
                mask[j] = 1
            pos += per_turn + tool_len
        out.append(TrainSample(ids, mask, [0.0] * length, 1.0 if i % 2 else -1.0))
    return out


def with_sampler_logprobs(model, samples: list[TrainSample], device) -> list[TrainSample]:
    """Sampler log-probs = the current policy's, so ratios start at 1 as after a rollout."""

    out = []
    with torch.no_grad():
        for s in samples:
            ids, attn, mask, _, _ = collate_samples([s], 0, device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                lp = token_logprobs(model, ids, attn, mask)[0].tolist()
            out.append(TrainSample(s.input_ids, s.mask, lp, s.advantage))
    return out


class FullLogitsStep:
    """The baseline: same micro-batches, loss and optimizer; full logits + log-softmax."""

    def __init__(self, model, cfg: TrainConfig) -> None:
        self.model, self.cfg = model, cfg
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr)
        self.device = next(model.parameters()).device

    def step(self, samples: list[TrainSample]) -> None:
        from mcprl_trainer.grpo import pack_micro_batches

        total = float(sum(s.num_trained for s in samples))
        settings = LossSettings(token_normalizer=total)
        self.opt.zero_grad(set_to_none=True)
        for batch in pack_micro_batches([len(s.input_ids) for s in samples],
                                        self.cfg.micro_batch_tokens):
            ids, attn, mask, old, adv = collate_samples([samples[i] for i in batch], 0, self.device)
            with torch.autocast(self.device.type, dtype=torch.bfloat16,
                                enabled=self.device.type == "cuda"):
                logits = self.model(input_ids=ids, attention_mask=attn, use_cache=False).logits
            logp = torch.log_softmax(logits.float(), -1)
            lp = torch.zeros_like(old)
            lp[:, 1:] = torch.gather(logp[:, :-1], -1, ids[:, 1:, None]).squeeze(-1)
            loss, _ = get_loss("grpo")(LossInputs(lp * mask, old, adv, mask), settings)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.opt.step()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, samples, device, steps: int) -> dict[str, Any]:
    try:
        fn(samples)  # warm-up (allocator, cuBLAS autotuning)
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(steps):
            fn(samples)
        _sync(device)
        dt = (time.perf_counter() - t0) / steps
    except torch.OutOfMemoryError:
        return {"error": "out of memory"}
    tokens = sum(len(s.input_ids) for s in samples)
    trained = sum(s.num_trained for s in samples)
    row = {"seconds_per_step": round(dt, 4), "tokens_per_s": round(tokens / dt, 1),
           "trained_tokens_per_s": round(trained / dt, 1)}
    if device.type == "cuda":
        row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return row


def direction_check(device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """Reward 'first token in S' (half the mass): P(S) must rise; flipped, fall."""

    out = {}
    for sign in (1.0, -1.0):
        base = build_base("tiny-learn", device, dtype)
        model = prepare_policy(base, LoraSettings(), TrainConfig(lr=3e-3))
        prompt = list(range(10, 40))
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt], device=device)).logits[0, -1].float()
        probs = torch.softmax(logits, -1)
        emb = model.get_output_embeddings().weight.detach().float()
        score = emb @ torch.randn(emb.shape[1], device=device,
                                  generator=torch.Generator(device).manual_seed(0))
        order = torch.argsort(score, descending=True)
        member = torch.zeros_like(probs, dtype=torch.bool)
        member[order[: int((probs[order].cumsum(0) < 0.5).sum()) + 1]] = True
        before = float(probs[member].sum())
        updater = GRPOUpdater(model, TrainConfig(lr=3e-3), 0)
        gen = torch.Generator(device).manual_seed(7)
        for _ in range(8):
            with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16,
                                                 enabled=device.type == "cuda"):
                lp = torch.log_softmax(model(input_ids=torch.tensor([prompt], device=device))
                                       .logits[0, -1].float(), -1)
            firsts = torch.multinomial(lp.exp(), 64, replacement=True, generator=gen).tolist()
            rewards = [(1.0 if bool(member[t]) else 0.0) * sign for t in firsts]
            mean = sum(rewards) / len(rewards)
            std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
            updater.step([TrainSample([*prompt, t], [0] * len(prompt) + [1],
                                      [0.0] * len(prompt) + [float(lp[t])],
                                      (r - mean) / (std + 1e-6))
                          for t, r in zip(firsts, rewards, strict=True)])
        with torch.no_grad():
            after = torch.softmax(model(input_ids=torch.tensor([prompt], device=device))
                                  .logits[0, -1].float(), -1)[member].sum()
        out["rewarded" if sign > 0 else "penalised"] = {"p_before": round(before, 4),
                                                        "p_after": round(float(after), 4)}
        del model, base
    return out


def parse_arm(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME:field=value,...`` -> (NAME, overrides of the ``train`` section; YAML values)."""

    name, _, body = text.partition(":")
    if not name or not body:
        raise argparse.ArgumentTypeError(f"--arm takes NAME:field=value[,...], got {text!r}")
    overrides = {}
    for item in body.split(","):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in TrainConfig.model_fields:
            raise argparse.ArgumentTypeError(f"--arm {text!r}: {item!r} is not field=value "
                                             "of the train section")
        overrides[key.strip()] = yaml.safe_load(value)
    return name, overrides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--model-shape", default="tiny-wide",
                        choices=["tiny-wide", "tiny-test", "tiny-learn", "qwen2.5-3b"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--trained-frac", type=float, default=0.3)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--direction", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads")
    parser.add_argument("--shared-prompt", type=int, default=0,
                        help="tokens every row starts with; > 0 adds ours with "
                             "train.shared_prefix (that start run once per micro-batch)")
    parser.add_argument("--group-size", type=int, default=0,
                        help="rows come in groups of this many with one prompt (a GRPO "
                             "group's rollouts); > 0 adds ours with train.shared_prefix")
    parser.add_argument("--arm", type=parse_arm, action="append", default=[],
                        help="NAME:field=value,...: ours under other train settings")
    parser.add_argument("--builtin", action=argparse.BooleanOptionalAction, default=True,
                        help="run the ours and full_logits arms (--no-builtin: --arm only)")
    parser.add_argument("--kernel-profile", action="store_true",
                        help="CUDA: the kernels of one step of each arm, by class")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype("auto", device)
    cfg = TrainConfig(lr=1e-5, micro_batch_tokens=args.micro_batch_tokens,
                      gradient_checkpointing=args.gradient_checkpointing)
    result: dict[str, Any] = {
        "bench": "trainer_update", "device": str(device),
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__, "model_shape": args.model_shape, "dtype": str(dtype),
        "batch": args.batch, "seq": args.seq, "turns": args.turns,
        "trained_frac": args.trained_frac, "micro_batch_tokens": args.micro_batch_tokens,
        "shared_prompt": args.shared_prompt, "group_size": args.group_size,
        "gradient_checkpointing": args.gradient_checkpointing, "lora": "r=8 alpha=16 all-linear",
    }
    arms: dict[str, dict[str, Any]] = {"ours": {}, "full_logits": {}} if args.builtin else {}
    if args.shared_prompt or args.group_size:
        arms["ours_shared_prefix"] = {"shared_prefix": True}
    arms.update(dict(args.arm))
    for name, overrides in arms.items():
        arm_cfg = TrainConfig.model_validate({**cfg.model_dump(), **overrides})
        base = build_base(args.model_shape, device, dtype)
        model = prepare_policy(base, LoraSettings(), arm_cfg)
        samples = make_samples(args.batch, args.seq, base.config.vocab_size, args.turns,
                               args.trained_frac, shared=args.shared_prompt,
                               group_size=args.group_size)
        samples = with_sampler_logprobs(model, samples, device)
        if name == "full_logits":
            step = FullLogitsStep(model, arm_cfg).step
        else:
            step = GRPOUpdater(model, arm_cfg, 0).step
        result[name] = {**({"train": overrides} if overrides else {}),
                        **timed(step, samples, device, args.steps)}
        if args.kernel_profile and device.type == "cuda" and "error" not in result[name]:
            one_step = functools.partial(step, samples)
            result[name]["kernel_profile"] = kernel_profile(one_step, reps=1)
        print(json.dumps({name: result[name]}), file=sys.stderr, flush=True)
        del model, base, samples, step
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if "tokens_per_s" in result.get("ours", {}) and "tokens_per_s" in result.get("full_logits", {}):
        result["speedup"] = round(result["ours"]["tokens_per_s"] /
                                  result["full_logits"]["tokens_per_s"], 3)
    if "tokens_per_s" in result.get("ours_shared_prefix", {}) and "ours" in result:
        result["shared_prefix_speedup"] = round(result["ours_shared_prefix"]["tokens_per_s"] /
                                                result["ours"]["tokens_per_s"], 3)
    key = f"{args.batch}x{args.seq}"
    if args.model_shape == "qwen2.5-3b" and key in ANCHOR_TOKENS_PER_S:
        result["anchor_plain_hf_tokens_per_s"] = ANCHOR_TOKENS_PER_S[key]
    if args.direction:
        result["direction"] = direction_check(device, dtype)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
