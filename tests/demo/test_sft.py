"""SFT on assistant tokens only, on the real tiny model (CPU, seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mcprl_demo.sft import (
    SftExample,
    SftSettings,
    load_examples,
    lr_at,
    micro_batches,
    nll_sum,
    train,
)
from mcprl_trainer.grpo import TrainSample, collate_samples
from mcprl_trainer.modeling import shared_prefix_len
from mcprl_trainer.rendering import ChatRenderer

pytestmark = pytest.mark.timeout(120)
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"type": "function", "function": {"name": "list_tables", "arguments": {}}}]}


def _example(renderer: ChatRenderer, task: str) -> tuple[SftExample, list[int]]:
    history = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": task}]
    prompt = renderer.initial_prompt(history, None).ids
    turn = renderer.assistant_turn(history, CALL, None).ids
    return SftExample(prompt + turn, [0] * len(prompt) + [1] * len(turn)), turn


@pytest.fixture(scope="module")
def renderer(tiny_test_model: Path) -> ChatRenderer:
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_test_model))


def test_loss_counts_only_masked_targets(tiny_test_model: Path, renderer) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_test_model)
    ex, turn = _example(renderer, "How many tables are there?")
    cpu = torch.device("cpu")
    loss, n = nll_sum(model, [ex], 0, cpu)
    assert n == len(turn) and loss.item() > 0
    # Dropping the mask of one target removes exactly its term.
    half = SftExample(ex.input_ids, [*ex.mask[:-1], 0])
    loss_half, n_half = nll_sum(model, [half], 0, cpu)
    assert n_half == n - 1 and loss_half.item() < loss.item()


def test_micro_batches_respect_the_token_budget() -> None:
    exs = [SftExample([1] * n, [1] * n) for n in (50, 40, 30, 20, 10)]
    groups = micro_batches(exs, list(range(5)), budget=80)
    assert sorted(i for g in groups for i in g) == list(range(5))
    for g in groups:
        assert len(g) == 1 or len(g) * max(len(exs[i].input_ids) for i in g) <= 80


def test_lr_schedule_warms_up_then_decays() -> None:
    s = SftSettings(steps=100, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, s) == pytest.approx(1e-4)
    assert lr_at(9, s) == pytest.approx(1e-3)
    assert lr_at(99, s) < lr_at(50, s) < lr_at(10, s)
    assert lr_at(100, s) == pytest.approx(1e-4)


def test_time_budget_drives_the_schedule_when_it_ends_first() -> None:
    s = SftSettings(steps=1000, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1, max_seconds=60)
    assert lr_at(20, s, elapsed_s=0.0) == pytest.approx(lr_at(20, SftSettings(
        steps=1000, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)))
    assert lr_at(20, s, elapsed_s=30.0) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert lr_at(20, s, elapsed_s=60.0) == pytest.approx(1e-4)


def test_training_stops_at_the_time_budget(tiny_test_model: Path, renderer, tmp_path) -> None:
    rows = [_example(renderer, f"Question {i}: which tables exist?")[0] for i in range(2)]
    settings = SftSettings(steps=10_000, batch_size=2, device="cpu", threads=1,
                           max_seconds=1.5, log_every=10_000)
    result = train(rows, tiny_test_model, tmp_path / "model", settings)
    assert 0 < result.steps < 10_000 and result.seconds < 10
    assert (tmp_path / "model" / "config.json").exists()


def test_sft_teaches_the_tool_call_format(tiny_test_model: Path, renderer, tmp_path) -> None:
    """From a random init, a few steps make greedy decoding produce the exact call (saved in
    float32: rounding this barely-trained model to bf16 can change a greedy token)."""

    rows = [_example(renderer, f"Question {i}: which tables exist?")[0] for i in range(4)]
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"input_ids": r.input_ids, "mask": r.mask}) + "\n"
                            for r in rows))
    examples = load_examples(data)
    out = tmp_path / "model"
    settings = SftSettings(steps=60, batch_size=4, lr=1e-2, warmup_steps=5, device="cpu",
                           log_every=59, save_at=[30], save_dtype="float32", threads=1)
    result = train(examples, tiny_test_model, out, settings)
    assert result.losses[0][1] > 4 * result.losses[-1][1]
    assert result.trained_tokens == 60 * sum(r.trained_tokens for r in rows)
    assert (tmp_path / "model-step30" / "config.json").exists()
    # A saved HF model dir with the tokenizer and chat template, loadable as usual.
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    ex, turn = _example(ChatRenderer(tok), "Question 9: which tables exist?")
    prompt = ex.input_ids[: len(ex.input_ids) - len(turn)]
    with torch.no_grad():
        gen = model.generate(torch.tensor([prompt]), max_new_tokens=len(turn) + 4,
                             do_sample=False, eos_token_id=tok.eos_token_id)
    assert gen[0, len(prompt):].tolist() == turn


def test_shared_prefix_gives_the_same_loss_and_gradients(tiny_test_model: Path,
                                                         renderer) -> None:
    """Training through the shared prefix's cache computes what full sequences compute."""

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_test_model)
    rows = [_example(renderer, task)[0] for task in ("How many tables?", "List every table.")]
    cpu = torch.device("cpu")
    ids, att, mask, _, _ = collate_samples(
        [TrainSample(r.input_ids, r.mask, [0.0] * len(r.mask), 0.0) for r in rows], 0, cpu)
    assert 0 < shared_prefix_len(ids, att, mask) < min(len(r.input_ids) for r in rows)
    full, n_full = nll_sum(model, rows, 0, cpu)
    full.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    part, n_part = nll_sum(model, rows, 0, cpu, shared_prefix=True)
    assert n_part == n_full
    assert part.item() == pytest.approx(full.item(), rel=1e-4)
    part.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-3, atol=1e-5, msg=name)


def test_lora_sft_saves_only_an_adapter_the_trainer_continues(tiny_test_model: Path, renderer,
                                                              tmp_path: Path) -> None:
    """``sft.lora_r``: the pretrained weights stay, the adapter alone is saved (bf16,
    readable by all), and ``lora.init_adapter`` hands exactly it to RL."""

    from mcprl_trainer.config import LoraSettings, TrainConfig
    from mcprl_trainer.modeling import load_policy

    examples = [_example(renderer, f"How many rows has table {i}?")[0] for i in range(4)]
    out = tmp_path / "adapter"
    settings = SftSettings(steps=3, batch_size=2, lr=5e-3, warmup_steps=0, init="weights",
                           lora_r=4, lora_alpha=8, save_dtype="bfloat16", device="cpu")
    result = train(examples, tiny_test_model, out, settings)
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json",
                                                     "adapter_model.safetensors"]
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in out.iterdir())
    assert result.parameters < 100_000  # the LoRA matrices, not the 0.7M-parameter model
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8
    from safetensors.torch import load_file

    weights = load_file(out / "adapter_model.safetensors")
    assert weights and all(w.dtype == torch.bfloat16 for w in weights.values())
    policy = load_policy(str(tiny_test_model), LoraSettings(init_adapter=out),
                         TrainConfig(device="cpu"))
    lora_b = [p for n, p in policy.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.requires_grad for p in lora_b)
    assert any(p.abs().sum() > 0 for p in lora_b)  # trained weights, not a fresh init (B = 0)


def test_lora_sft_needs_the_pretrained_weights(tiny_test_model: Path, renderer,
                                               tmp_path: Path) -> None:
    examples = [_example(renderer, "How many tables?")[0]]
    with pytest.raises(ValueError, match=r"sft\.init"):
        train(examples, tiny_test_model, tmp_path / "x",
              SftSettings(steps=1, batch_size=1, init="random", lora_r=4, device="cpu"))
