"""One GRPO update of SmolLM2-135M-Instruct (``make base-model``) on the CPU: the real Llama
forward and backward passes, LoRA only, the sampler's log-probs reproduced on-policy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mcprl_trainer.advantages import group_advantages
from mcprl_trainer.config import LoraSettings, TrainConfig
from mcprl_trainer.grpo import GRPOUpdater, TrainSample
from mcprl_trainer.modeling import load_policy
from mcprl_trainer.rendering import ChatRenderer

pytestmark = pytest.mark.timeout(240)


def test_one_update_moves_only_the_lora(smollm2_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_model)
    prompt = ChatRenderer(tok).initial_prompt(
        [{"role": "system", "content": "You answer with one word."},
         {"role": "user", "content": "Is the sky blue?"}], None).ids
    torch.manual_seed(0)
    cfg = TrainConfig(lr=1e-3, device="cpu", shared_prefix=True)
    model = load_policy(str(smollm2_model), LoraSettings(), cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(0)
    samples, rewards, comps = [], [1.0, 0.0, 0.0, 1.0], []
    with torch.no_grad():
        for _ in rewards:
            ids, lps = list(prompt), []
            for _ in range(3):
                logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1], -1)
                t = int(torch.multinomial(logp.exp(), 1, generator=gen))
                ids.append(t)
                lps.append(float(logp[t]))
            comps.append((ids[len(prompt):], lps))
    for (c, lp), adv in zip(comps, group_advantages(rewards).advantages, strict=True):
        samples.append(TrainSample(prompt + c, [0] * len(prompt) + [1] * 3,
                                   [0.0] * len(prompt) + lp, adv))
    metrics = GRPOUpdater(model, cfg, tok.pad_token_id).step(samples)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert metrics["train_tokens"] == 12 and metrics["grad_norm"] > 0
    assert metrics["logprob_diff_abs"] < 1e-3  # trainer and sampler agree (same weights)
