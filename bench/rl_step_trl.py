"""TRL's side of bench_rl_step.py: ``trl.GRPOTrainer`` (1.16, no vLLM) on the same workload.

The same model folder, prompts (as the word tokenizer's text, which encodes back to the same
ids), LoRA (peft, r/alpha, all linear layers) and reward. One optimizer step per RL step:
a generation batch of ``prompts x rollouts`` completions, trained in micro-batches of one
group (``per_device_train_batch_size = rollouts``, ``gradient_accumulation_steps = prompts``).
Completions are exactly ``turn_tokens`` long: ``min_new_tokens`` keeps generate from
stopping at eos. The multi-turn variant goes through TRL's ``rollout_func``: per turn, TRL's
own generation (``_generate_single_turn``, what its tool loop calls), then the scripted tool
result, masked out of the loss with ``env_mask``.

A step's seconds run from one optimizer step's end to the next (generation included); its
phases come from timing the trainer's own methods: ``generate`` (``_generate``), ``score``
(the rest of ``_generate_and_score_completions``: rewards, advantages) and ``train`` (the
rest: forward, backward, optimizer).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rl_step_common import (
    GpuMonitor,
    Workload,
    reward,
    step_prompts,
    summarise,
    sync,
    to_text,
    tool_result,
    torch_peak_gib,
)


def trl_available() -> bool:
    try:
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


def _reward_func(completion_ids: list[list[int]], **_: Any) -> list[float]:
    return [reward(ids) for ids in completion_ids]


def _multiturn_rollout(work: Workload, vocab: int):
    """TRL's rollout_func for the multi-turn variant (prompts arrive repeated per rollout)."""

    def rollout(prompts: list[str], trainer: Any) -> dict[str, Any]:
        prompt_ids = trainer.processing_class(text=prompts)["input_ids"]
        completions: list[list[int]] = [[] for _ in prompt_ids]
        masks: list[list[int]] = [[] for _ in prompt_ids]
        for turn in range(work.turns):
            contexts = [p + c for p, c in zip(prompt_ids, completions, strict=True)]
            sampled, _ = trainer._generate_single_turn(contexts, None, {}, 1)
            for i, ids in enumerate(sampled):
                completions[i] += list(ids)
                masks[i] += [1] * len(ids)
                if turn < work.turns - 1:
                    tool = tool_result(work, prompt_ids[i], turn, vocab)
                    completions[i] += tool
                    masks[i] += [0] * len(tool)
        return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": None,
                "env_mask": masks}

    return rollout


class _StepClock:
    """A TrainerCallback (built lazily: transformers is imported inside) that records the
    wall time of each optimizer step and the phases the wrapped methods added to it."""

    def __init__(self, device: str, monitor: GpuMonitor, warmup: int) -> None:
        self.device, self.monitor, self.warmup = device, monitor, warmup
        self.phases: dict[str, float] = {}
        self.steps: list[dict[str, Any]] = []
        self.last = time.perf_counter()
        self.completion_tokens = 0

    def wrap(self, trainer: Any) -> None:
        """Time ``_generate`` and ``_generate_and_score_completions`` on this trainer."""

        def timed(name: str, fn: Any, minus: str | None = None) -> Any:
            @functools.wraps(fn)
            def inner(*args: Any, **kwargs: Any) -> Any:
                sync(self.device)
                before = self.phases.get(minus, 0.0) if minus else 0.0
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                sync(self.device)
                spent = time.perf_counter() - t0
                if minus:  # exclusive time: what the inner timed call took is not counted
                    spent -= self.phases.get(minus, 0.0) - before
                self.phases[name] = self.phases.get(name, 0.0) + spent
                return out
            return inner

        generate = trainer._generate

        def counted(prompts: list, *args: Any, **kwargs: Any) -> Any:
            out = generate(prompts, *args, **kwargs)
            self.completion_tokens += sum(len(c) for c in out[1])
            return out

        trainer._generate = timed("generate", counted)
        trainer._generate_and_score_completions = timed(
            "score", trainer._generate_and_score_completions, minus="generate")

    def callback(self) -> Any:
        from transformers import TrainerCallback

        clock = self

        class StepClock(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                sync(clock.device)
                clock.last = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                sync(clock.device)
                now = time.perf_counter()
                seconds = now - clock.last
                phases = dict(clock.phases)
                phases["train"] = seconds - sum(phases.values())
                step = len(clock.steps) + 1
                clock.steps.append({
                    "step": step, "warmup": step <= clock.warmup, "seconds": round(seconds, 3),
                    "phases": {k: round(v, 3) for k, v in phases.items()},
                    "completion_tokens": clock.completion_tokens,
                    "trainer_peak_gib": torch_peak_gib(clock.device),
                    **clock.monitor.window(clock.last, now)})
                print(f"trl step {step}: {seconds:.2f}s {clock.steps[-1]['phases']}",
                      file=sys.stderr, flush=True)
                clock.phases, clock.completion_tokens = {}, 0
                if clock.device.startswith("cuda"):
                    import torch

                    torch.cuda.reset_peak_memory_stats()
                sync(clock.device)
                clock.last = time.perf_counter()

        return StepClock()


def run_trl(work: Workload, model_dir: Path, device: str, steps: int,
            warmup: int) -> dict[str, Any]:
    """``warmup + steps`` optimizer steps of GRPOTrainer; the side's JSON."""

    import datasets
    import peft
    import torch
    import trl
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    started = time.perf_counter()
    cuda = device.startswith("cuda")
    total = warmup + steps
    # The word tokenizer by its own class: AutoTokenizer would map a qwen2 config to
    # Qwen2Tokenizer and rebuild a BPE from its vocabulary.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.bfloat16 if cuda else torch.float32).to(device)
    vocab = model.get_input_embeddings().weight.shape[0]
    texts = [to_text(p) for step in range(1, total + 1)
             for p in step_prompts(work, step, vocab)]
    dataset = datasets.Dataset.from_dict({"prompt": texts})
    tmp = tempfile.TemporaryDirectory(prefix="rl-step-trl-")
    args = trl.GRPOConfig(
        output_dir=tmp.name, max_steps=total, learning_rate=work.lr, seed=work.seed,
        num_generations=work.rollouts, per_device_train_batch_size=work.rollouts,
        gradient_accumulation_steps=work.prompts, max_completion_length=work.turn_tokens,
        generation_kwargs={"min_new_tokens": work.turn_tokens}, temperature=1.0, top_p=1.0,
        beta=0.0, shuffle_dataset=False, bf16=cuda, use_cpu=not cuda,
        gradient_checkpointing=work.gradient_checkpointing, logging_steps=1,
        report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
    )
    lora = peft.LoraConfig(r=work.lora_r, lora_alpha=work.lora_alpha, lora_dropout=0.0,
                           target_modules="all-linear", task_type="CAUSAL_LM")
    monitor = GpuMonitor(device).start()
    clock = _StepClock(device, monitor, warmup)
    rollout = _multiturn_rollout(work, vocab) if work.turns > 1 else None
    trainer = trl.GRPOTrainer(model=model, reward_funcs=_reward_func, args=args,
                              train_dataset=dataset, processing_class=tokenizer,
                              peft_config=lora, callbacks=[clock.callback()],
                              rollout_func=rollout)
    clock.wrap(trainer)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # its log lines; stdout is the JSON's
            trainer.train()
    finally:
        monitor.stop()
        del trainer, model
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        tmp.cleanup()
    result = summarise(clock.steps, warmup, work.prompts * work.rollouts * work.sampled_tokens)
    result.update({
        "what": "trl.GRPOTrainer, transformers generate (no vLLM), peft LoRA",
        "config": {"per_device_train_batch_size": work.rollouts,
                   "gradient_accumulation_steps": work.prompts, "beta": 0.0,
                   "loss_type": args.loss_type, "bf16": cuda,
                   "gradient_checkpointing": work.gradient_checkpointing,
                   "rollout_func": "multi-turn (TRL's generate per turn)" if rollout else None},
        "gpu_busy_source": monitor.source,
        "wall_seconds": round(time.perf_counter() - started, 1),
    })
    return result
