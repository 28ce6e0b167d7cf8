"""The GRPO update on the tiny model, in process: it moves the LoRA only, micro-batching is
exact, and rewarded behaviour becomes more likely (less likely with the sign flipped)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from mcprl_trainer.advantages import group_advantages
from mcprl_trainer.config import LoraSettings, TrainConfig
from mcprl_trainer.grpo import GRPOUpdater, TrainSample, pack_micro_batches
from mcprl_trainer.modeling import (
    load_policy,
    plan_shared_prefix,
    right_padded,
    selective_logprobs,
    shared_prefix_len,
    token_logprobs,
)
from mcprl_trainer.rendering import ChatRenderer

pytestmark = pytest.mark.timeout(120)


def _policy(path, seed: int = 0, **train):
    torch.manual_seed(seed)
    return load_policy(str(path), LoraSettings(), TrainConfig(**train))


def test_pack_micro_batches_respects_budget() -> None:
    lengths = [100, 30, 70, 300, 10, 60]
    batches = pack_micro_batches(lengths, 200)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 200
    assert [3] in batches  # longer than the budget: alone


def test_pack_micro_batches_keeps_a_group_together() -> None:
    """Rollouts of three groups, lengths interleaved across groups: by length alone the
    micro-batches mix the groups; with group keys each holds whole groups, longest first."""

    lengths = [90, 60, 100, 80, 95, 70, 62, 88, 61]
    groups = ["a", "b", "c", "a", "c", "b", "a", "b", "c"]
    by_length = pack_micro_batches(lengths, 300)
    assert any(len({groups[i] for i in b}) > 1 for b in by_length)
    batches = pack_micro_batches(lengths, 300, groups)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert [[groups[i] for i in b] for b in batches] == [["c"] * 3, ["a"] * 3, ["b"] * 3]
    assert [lengths[i] for i in batches[0]] == [100, 95, 61]
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 300


def test_a_groups_rollouts_share_a_prompt_key() -> None:
    prompt = [5, 6, 7]
    a, b = (TrainSample(prompt + c, [0, 0, 0] + [1] * len(c), [0.0] * (3 + len(c)), 1.0)
            for c in ([1, 2], [3, 4, 9]))
    other = TrainSample([5, 6, 8, 1], [0, 0, 0, 1], [0.0] * 4, 1.0)
    assert a.prompt_key == b.prompt_key != other.prompt_key


def test_token_logprobs_match_full_log_softmax(tiny_test_model) -> None:
    """Logits only at trained positions (per row) give the same log-probs as the full pass."""

    model = _policy(tiny_test_model)
    ids = torch.randint(0, 1000, (3, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(3, 24, dtype=torch.bool)
    mask[0, 5:10] = mask[1, 12:15] = mask[2, 20:] = True
    attn = torch.ones(3, 24, dtype=torch.long)
    attn[2, 22:] = 0  # right padding never trained on
    mask[2, 22:] = False
    got = token_logprobs(model, ids, attn, mask)
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits.float(), -1)
    want = torch.zeros(3, 24)
    want[:, 1:] = torch.gather(full[:, :-1], -1, ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(got, want * mask, atol=1e-5)
    assert got.requires_grad


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selective_logprobs_match_log_softmax_across_chunks(dtype, device: str) -> None:
    """Chunked fp32 log-probs and their gradient equal the full log-softmax's, for rows that
    do not fill the last chunk; the gradient keeps the logits' dtype."""

    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(37, 300, generator=gen) * 3).to(device, dtype)
    targets = torch.randint(0, 300, (37,), generator=gen).to(device)
    weights = torch.randn(37, generator=gen).to(device)
    ours, full = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    got = selective_logprobs(ours, targets, chunk=8)
    want = torch.log_softmax(full.float(), -1).gather(-1, targets[:, None]).squeeze(-1)
    (got * weights).sum().backward()
    (want * weights).sum().backward()
    assert got.dtype == torch.float32 and torch.allclose(got, want, atol=1e-6)
    assert ours.grad.dtype == dtype
    rtol = 1e-5 if dtype == torch.float32 else 8e-3  # the bf16 gradients round alike or 1 ulp
    assert torch.allclose(ours.grad.float(), full.grad.float(), rtol=rtol, atol=1e-6)
    x = torch.randn(5, 11, dtype=torch.float64, generator=gen).to(device).requires_grad_()
    assert torch.autograd.gradcheck(lambda z: selective_logprobs(z, targets[:5] % 11, 2), (x,))


def test_padding_mask_is_dropped_only_for_right_padding(tiny_test_model) -> None:
    """Right padding needs no mask under causal attention (the flash kernel may run); any
    other layout keeps it: with left padding, real tokens must not see the pad tokens."""

    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    assert right_padded(right) and right_padded(torch.ones(2, 4, dtype=torch.long))
    assert not right_padded(left)
    model = _policy(tiny_test_model)
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(1))
    attn = torch.ones(2, 16, dtype=torch.long)
    attn[0, :5] = 0
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[:, 8:] = True
    got = token_logprobs(model, ids, attn, mask)
    with torch.no_grad():
        masked = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits.float(), -1)
        unmasked = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
    want, wrong = (torch.gather(x[:, 7:-1], -1, ids[:, 8:, None]).squeeze(-1)
                   for x in (masked, unmasked))
    assert torch.allclose(got[:, 8:], want, atol=1e-5)
    assert (got[0, 8:] - wrong[0]).abs().max() > 1e-3  # the pads do change row 0


def test_shared_prefix_gives_the_same_logprobs_and_gradients(tiny_test_model) -> None:
    """Rows sharing a 40-token start: running it once (KV cache repeated per row) gives the
    full pass's log-probs and LoRA gradients, right padding and all."""

    gen = torch.Generator().manual_seed(4)
    shared = torch.randint(0, 1000, (40,), generator=gen)
    ids = torch.cat([shared.expand(3, 40), torch.randint(0, 1000, (3, 20), generator=gen)], 1)
    attn = torch.ones(3, 60, dtype=torch.long)
    attn[1, 52:] = 0
    mask = torch.zeros(3, 60, dtype=torch.bool)
    mask[0, 45:50] = mask[1, 41:52] = mask[2, 55:] = True
    assert shared_prefix_len(ids, attn, mask) == 40
    grads = []
    for on in (False, True):
        model = _policy(tiny_test_model, seed=5)
        torch.nn.init.normal_(next(p for n, p in model.named_parameters() if "lora_B" in n))
        lp = token_logprobs(model, ids, attn, mask, shared_prefix=on)
        lp.sum().backward()
        grads.append((lp.detach(), torch.cat([p.grad.flatten() for n, p in
                                              model.named_parameters() if p.grad is not None])))
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-5)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-5)
    assert grads[0][1].abs().sum() > 0
    one_row = shared_prefix_len(ids[:1], attn[:1], mask[:1])
    assert one_row == 0  # nothing to share


def _logprobs_and_lora_grads(path, ids, attn, mask, shared: bool):
    model = _policy(path, seed=5)
    torch.nn.init.normal_(next(p for n, p in model.named_parameters() if "lora_B" in n))
    lp = token_logprobs(model, ids, attn, mask, shared_prefix=shared)
    (lp * torch.linspace(0.5, 1.5, lp.numel()).view_as(lp)).sum().backward()
    return lp.detach(), torch.cat([p.grad.flatten() for n, p in model.named_parameters()
                                   if p.grad is not None])


def test_several_groups_in_a_micro_batch_each_run_their_prompt_once(tiny_test_model) -> None:
    """Three GRPO groups of two rollouts, each group its own 30-token prompt after a common
    6-token system start, rows out of group order: each prompt runs once (three rows of
    prefix, gathered per row) and the log-probs and LoRA gradients are the full pass's."""

    gen = torch.Generator().manual_seed(7)
    system = torch.randint(0, 1000, (6,), generator=gen)
    prompts = [torch.cat([system, torch.randint(0, 1000, (24,), generator=gen)])
               for _ in range(3)]
    group = [0, 1, 2, 0, 2, 1]
    ids = torch.stack([torch.cat([prompts[g], torch.randint(0, 1000, (14,), generator=gen)])
                       for g in group])
    attn = torch.ones(6, 44, dtype=torch.long)
    attn[4, 40:] = 0
    mask = torch.zeros(6, 44, dtype=torch.bool)
    mask[:, 31:40] = True
    mask[[0, 2, 5], 40:] = True
    plan = plan_shared_prefix(ids, attn, mask)
    assert plan is not None and plan.length == 30 and len(plan.firsts) == 3
    assert len(set(zip(group, plan.row_class.tolist(), strict=True))) == 3  # class = group
    assert plan.saved_tokens == 30 * 3  # against the common start's 6 x 5
    assert torch.equal(ids[plan.firsts[plan.row_class], :30], ids[:, :30])
    full, shared = (_logprobs_and_lora_grads(tiny_test_model, ids, attn, mask, on)
                    for on in (False, True))
    assert torch.allclose(full[0], shared[0], atol=1e-5)
    assert torch.allclose(full[1], shared[1], atol=1e-5)
    assert full[1].abs().sum() > 0


def test_the_start_all_rows_share_wins_when_groups_save_less() -> None:
    """Six distinct rows after a 20-token common start: no two rows share more, so the
    common start is the plan (one class); with no common start and no repeats, none."""

    gen = torch.Generator().manual_seed(8)
    common = torch.randint(0, 1000, (20,), generator=gen)
    ids = torch.cat([common.expand(6, 20), torch.randint(0, 1000, (6, 20), generator=gen)], 1)
    attn = torch.ones(6, 40, dtype=torch.long)
    mask = torch.zeros(6, 40, dtype=torch.bool)
    mask[:, 35:] = True
    plan = plan_shared_prefix(ids, attn, mask)
    assert plan is not None and plan.length == 20 and plan.firsts.tolist() == [0]
    assert plan.row_class.tolist() == [0] * 6
    assert plan_shared_prefix(ids[:, 20:], attn[:, 20:], mask[:, 20:]) is None
    mask[:, 1] = True  # a target at position 1: nothing before it can be shared
    assert plan_shared_prefix(ids, attn, mask) is None


def test_shared_prefix_refuses_gradient_checkpointing() -> None:
    with pytest.raises(ValueError, match="shared_prefix"):
        TrainConfig(shared_prefix=True, gradient_checkpointing=True)


@pytest.fixture(scope="module")
def tok(tiny_test_model):
    return AutoTokenizer.from_pretrained(tiny_test_model)


@pytest.fixture(scope="module")
def prompt(tok) -> list[int]:
    return ChatRenderer(tok).initial_prompt(
        [{"role": "system", "content": "You use tools."},
         {"role": "user", "content": "How many employees are there?"}], None).ids


@torch.no_grad()
def _first_token_probs(model, prompt: list[int]) -> torch.Tensor:
    logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    return torch.softmax(logits, -1)


@torch.no_grad()
def _sample(model, prompt: list[int], n: int, length: int, gen: torch.Generator):
    """n completions of ``length`` tokens with their raw log-probs (as an engine returns)."""

    out = []
    for _ in range(n):
        ids, lps = list(prompt), []
        for _ in range(length):
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(),
                                     -1)
            tok_id = int(torch.multinomial(logp.exp(), 1, generator=gen))
            ids.append(tok_id)
            lps.append(float(logp[tok_id]))
        out.append((ids[len(prompt):], lps))
    return out


def _samples(prompt, completions, rewards) -> list[TrainSample]:
    adv = group_advantages(rewards).advantages
    return [TrainSample(prompt + c, [0] * len(prompt) + [1] * len(c), [0.0] * len(prompt) + lp, a)
            for (c, lp), a in zip(completions, adv, strict=True)]


def test_update_moves_only_the_adapter(tiny_test_model, prompt) -> None:
    model = _policy(tiny_test_model, lr=1e-3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(0)
    comps = _sample(model, prompt, 4, 3, gen)
    metrics = GRPOUpdater(model, TrainConfig(lr=1e-3), 0).step(
        _samples(prompt, comps, [1.0, 0.0, 0.0, 1.0]))
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert any("lora_B" in n for n in changed)
    # First step is on-policy: the ratio is 1 up to float error, nothing clipped.
    assert metrics["clip_fraction"] == 0.0
    assert metrics["logprob_diff_abs"] < 1e-4
    assert metrics["train_tokens"] == 12 and metrics["grad_norm"] > 0


def test_micro_batching_is_exact(tiny_test_model, prompt) -> None:
    """One big batch and many small micro-batches give the same update."""

    gen = torch.Generator().manual_seed(1)
    base = _policy(tiny_test_model, seed=3)
    comps = _sample(base, prompt, 4, 3 + 0, gen)
    comps[1] = (comps[1][0][:2], comps[1][1][:2])  # unequal lengths: padding in play
    samples = _samples(prompt, comps, [1.0, 0.0, 0.5, 0.0])
    params = []
    for budget, agg in [(100_000, "token_mean"), (64, "token_mean"), (100_000, "seq_mean"),
                        (64, "seq_mean")]:
        model = _policy(tiny_test_model, seed=3)
        cfg = TrainConfig(lr=1e-3, micro_batch_tokens=budget, loss_aggregation=agg)
        m = GRPOUpdater(model, cfg, 0).step(samples)
        assert (m["micro_batches"] == 1) == (budget > 1000)
        params.append(torch.cat([p.detach().flatten() for n, p in model.named_parameters()
                                 if "lora_" in n]))
    # Adam turns the float noise of summing in another order into at most a few 1e-6 of
    # movement (a step is ~lr = 1e-3); the two aggregations differ by far more.
    assert torch.allclose(params[0], params[1], atol=1e-5)
    assert torch.allclose(params[2], params[3], atol=1e-5)
    assert (params[0] - params[2]).abs().max() > 1e-4  # aggregations differ


def _rewarded_set(model, prompt: list[int]) -> tuple[torch.Tensor, float]:
    """Tokens on one side of a hyperplane of the (tied) output embeddings, cut so that they
    hold about half the first-token probability: a behaviour the policy can shift by moving
    its last hidden state, as rewarding one tool over another would."""

    probs = _first_token_probs(model, prompt)
    emb = model.get_output_embeddings().weight.detach().float()
    direction = torch.randn(emb.shape[1], generator=torch.Generator().manual_seed(0))
    score = emb @ direction
    order = torch.argsort(score, descending=True)
    cut = int((probs[order].cumsum(0) < 0.5).sum()) + 1
    member = torch.zeros_like(probs, dtype=torch.bool)
    member[order[:cut]] = True
    return member, float(probs[member].sum())


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("optimizer", ["adamw:3e-3", "sgd:1.0"])
def test_rewarded_behaviour_becomes_more_likely(tiny_test_model, prompt, sign,
                                                optimizer) -> None:
    """Reward "the first token is in S" (half the mass at the start): over GRPO steps on
    groups sampled from the current policy, P(S) rises; with the rewards' sign flipped it
    falls. With either optimizer."""

    name, _, lr = optimizer.partition(":")
    model = _policy(tiny_test_model, seed=0)
    member, p_before = _rewarded_set(model, prompt)
    updater = GRPOUpdater(model, TrainConfig(optimizer=name, lr=float(lr)), 0)
    gen = torch.Generator().manual_seed(7)
    curve = []
    for _ in range(8):
        with torch.no_grad():  # one-token completions: one forward gives the distribution
            logp = torch.log_softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1], -1)
        firsts = torch.multinomial(logp.exp(), 64, replacement=True, generator=gen).tolist()
        comps = [([t], [float(logp[t])]) for t in firsts]
        rewards = [(1.0 if bool(member[t]) else 0.0) * sign for t in firsts]
        updater.step(_samples(prompt, comps, rewards))
        curve.append(float(_first_token_probs(model, prompt)[member].sum()))
    p_after = curve[-1]
    if sign > 0:
        assert p_after > p_before + 0.05 and p_after > curve[0], (p_before, curve)
    else:
        assert p_after < p_before - 0.05 and p_after < curve[0], (p_before, curve)


def _assert_kl_starts_at_zero_and_grows(model, prompt) -> None:
    """Three KL-regularised steps: KL 0 at the first (policy == reference), then > 0."""

    updater = GRPOUpdater(model, TrainConfig(lr=1e-2, kl_coef=0.1), 0)
    gen = torch.Generator().manual_seed(2)
    kls = []
    for _ in range(3):
        comps = _sample(model, prompt, 4, 2, gen)
        kls.append(updater.step(_samples(prompt, comps, [1.0, 0.0, 0.0, 1.0]))["kl"])
    assert kls[0] == pytest.approx(0.0, abs=1e-7)
    assert kls[-1] > 1e-6


def test_kl_to_base_is_zero_at_start_and_grows(tiny_test_model, prompt) -> None:
    """KL is measured against the base model (adapter disabled): 0 while LoRA B is still 0,
    positive once the adapter has moved."""

    model = _policy(tiny_test_model, seed=0)
    _assert_kl_starts_at_zero_and_grows(model, prompt)
    # The adapter is back on after the reference passes: policy != base.
    with model.disable_adapter():
        base = _first_token_probs(model, prompt)
    assert not torch.allclose(_first_token_probs(model, prompt), base)


def test_kl_to_the_warm_start_when_there_is_one(tiny_test_model, prompt, tmp_path) -> None:
    """With ``lora.init_adapter`` the KL reference is that warm start, frozen: 0 at the first
    step although the warm start is far from the base, positive once the policy moved; the
    reference never trains and the saved adapter is the trained one alone."""

    from mcprl_trainer.modeling import REFERENCE_ADAPTER, attach_reference, reference_policy

    warm = _policy(tiny_test_model, seed=5)
    for name, p in warm.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)  # a warm start that is not the base
    warm.save_pretrained(str(tmp_path / "warm"))
    torch.manual_seed(0)
    model = load_policy(str(tiny_test_model), LoraSettings(init_adapter=tmp_path / "warm"),
                        TrainConfig())
    attach_reference(model, tmp_path / "warm")
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()
              if f".{REFERENCE_ADAPTER}." in n}
    assert frozen and not any(p.requires_grad for n, p in model.named_parameters()
                              if n in frozen)
    _assert_kl_starts_at_zero_and_grows(model, prompt)
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]) and not p.requires_grad
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained and all(p.grad is None for p in trained)
    with reference_policy(model):
        reference = _first_token_probs(model, prompt)
    with model.disable_adapter():
        base = _first_token_probs(model, prompt)
    assert not torch.allclose(reference, base)  # the reference is the warm start, not the base
    assert not torch.allclose(_first_token_probs(model, prompt), reference)
    model.save_pretrained(str(tmp_path / "out"), selected_adapters=["default"])
    assert not (tmp_path / "out" / REFERENCE_ADAPTER).exists()
