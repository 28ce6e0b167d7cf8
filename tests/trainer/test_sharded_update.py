"""The update on 2 gloo ranks (FSDP2) against one process, on the same micro-batches: the same
loss, LoRA gradients and parameters after the step; and a checkpoint written by 2 ranks
(dcp) loads into 1 with the same parameters and optimizer state."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from mcprl_trainer.config import LoraSettings, TrainConfig
from mcprl_trainer.dist_probe import ProbeSpec, run_config, run_probe
from mcprl_trainer.distributed import DistContext
from mcprl_trainer.grpo import TrainSample
from mcprl_trainer.modeling import load_policy, token_logprobs
from mcprl_trainer.update_group import UpdateGroup

pytestmark = pytest.mark.timeout(120)
TRAIN = {"device": "cpu", "lr": 1e-2, "micro_batch_tokens": 96, "max_grad_norm": 1e3}


def _adapter(model_path: Path, out: Path) -> Path:
    """A LoRA whose B is not zero, so every LoRA parameter has a gradient."""

    torch.manual_seed(0)
    model = load_policy(str(model_path), LoraSettings(), TrainConfig(device="cpu"))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    model.save_pretrained(str(out))
    return out


def _samples(model_path: Path, adapter: Path, n: int = 7) -> list[TrainSample]:
    """Rollout-like samples of different lengths; sampler log-probs near the policy's own,
    so the ratio is near 1 and few tokens are clipped."""

    rng = random.Random(1)
    model = load_policy(str(model_path), LoraSettings(init_adapter=adapter),
                        TrainConfig(device="cpu"))
    out = []
    for i in range(n):
        length = rng.randint(12, 40)
        ids = [rng.randrange(1, 900) for _ in range(length)]
        start = rng.randint(4, length - 4)
        mask = [0] * start + [1] * (length - start)
        t_ids = torch.tensor([ids])
        with torch.no_grad():
            lp = token_logprobs(model, t_ids, torch.ones_like(t_ids),
                                torch.tensor([mask], dtype=torch.bool))[0]
        old = [float(x) + rng.uniform(-0.05, 0.05) if m else 0.0 for x, m in zip(lp, mask,
                                                                                strict=True)]
        out.append(TrainSample(ids, mask, old, (-1.0) ** i * (0.5 + i / n)))
    return out


def test_two_gloo_ranks_match_one_process(tiny_test_model: Path, tmp_path: Path) -> None:
    adapter = _adapter(tiny_test_model, tmp_path / "adapter")
    spec = ProbeSpec(model=str(tiny_test_model), samples=_samples(tiny_test_model, adapter),
                     train=TRAIN, init_adapter=str(adapter))
    one = run_probe(spec, 1, tmp_path)
    spec.save_to = str(tmp_path / "ckpt-2ranks")
    two = run_probe(spec, 2, tmp_path)

    # the same micro-batches, split across the ranks
    assert two["rank_batches"][0] >= 1 and two["rank_batches"][1] >= 1
    assert sum(two["rank_batches"]) == sum(one["rank_batches"]) >= 3
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7)
    assert one["grads"].keys() == two["grads"].keys() and len(one["grads"]) > 4
    for name, g in one["grads"].items():
        assert g.abs().sum() > 0, name
        torch.testing.assert_close(two["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)
    # the optimizer step on the summed gradients: the same parameters, moved
    assert two["metrics"]["grad_norm"] == pytest.approx(one["metrics"]["grad_norm"], rel=1e-4)
    assert two["metrics"]["train_ranks"] == 2.0
    for name, p in one["params"].items():
        torch.testing.assert_close(two["params"][name], p, rtol=1e-4, atol=1e-6, msg=name)
        assert not torch.equal(p, one["params_before"][name]), name
        torch.testing.assert_close(two["params_before"][name], one["params_before"][name])

    # saved by 2 ranks (dcp), loaded by 1: the same LoRA and optimizer state
    group = UpdateGroup(run_config(ProbeSpec(model=str(tiny_test_model), samples=[],
                                             train=TRAIN, init_adapter=str(adapter))),
                        DistContext())
    ckpt = Path(spec.save_to)
    assert (ckpt / "dcp" / ".metadata").is_file() and (ckpt / "adapter_config.json").is_file()
    group.load(0, adapter, ckpt)
    loaded = group.adapter_state()
    assert loaded.keys() == two["params"].keys()
    for name, p in two["params"].items():
        torch.testing.assert_close(loaded[name].float(), p, rtol=0, atol=0, msg=name)
    state = group.updater.optimizer.state
    assert state and all(float(s["step"]) == 1.0 for s in state.values())
    assert any(float(s["exp_avg"].abs().sum()) > 0 for s in state.values())
    assert group.updater.scheduler.last_epoch == 1
