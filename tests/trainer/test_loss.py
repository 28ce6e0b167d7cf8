"""Loss functions on toy tensors: clipping, masks, aggregation, KL, zero advantages."""

from __future__ import annotations

import math

import pytest
import torch

from mcprl_trainer.loss import LOSSES, LossInputs, LossSettings, aggregate, get_loss, k3_kl

pytestmark = pytest.mark.timeout(30)


def _inputs(logp, old, adv, mask, ref=None):
    lp = torch.tensor(logp, dtype=torch.float32, requires_grad=True)
    return lp, LossInputs(lp, torch.tensor(old), torch.tensor(adv), torch.tensor(mask),
                          None if ref is None else torch.tensor(ref))


def test_registry_has_grpo_and_rejects_unknown() -> None:
    assert {"grpo", "reinforce"} <= set(LOSSES)
    with pytest.raises(ValueError, match="unknown loss"):
        get_loss("nope")


def test_on_policy_gradient_is_minus_advantage_over_tokens() -> None:
    # ratio = 1 everywhere: d loss / d logp = -A / n_tokens on masked tokens, 0 elsewhere.
    lp, inp = _inputs([[-1.0, -2.0, -3.0]], [[-1.0, -2.0, -3.0]], [2.0], [[1.0, 1.0, 0.0]])
    loss, metrics = get_loss("grpo")(inp, LossSettings())
    loss.backward()
    assert math.isclose(float(loss), -2.0, rel_tol=1e-6)
    assert torch.allclose(lp.grad, torch.tensor([[-1.0, -1.0, 0.0]]))
    assert metrics["clip_fraction"] == 0.0
    assert math.isclose(metrics["ratio_mean"], 1.0)


def test_positive_advantage_clipped_above_one_plus_eps() -> None:
    # logp - old = log(1.5) > log(1.2): positive advantage -> clipped, no gradient.
    up = math.log(1.5)
    lp, inp = _inputs([[up, 0.0]], [[0.0, 0.0]], [1.0], [[1.0, 1.0]])
    loss, metrics = get_loss("grpo")(inp, LossSettings(clip_eps=0.2))
    loss.backward()
    assert lp.grad[0, 0] == 0.0  # clipped token gives no gradient
    assert lp.grad[0, 1] < 0.0  # the unclipped one still pushes up
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    # Loss uses the clipped ratio 1.2 for the first token: -(1.2 + 1.0) / 2.
    assert float(loss) == pytest.approx(-1.1)


def test_negative_advantage_not_clipped_above_but_clipped_below() -> None:
    # A < 0 and ratio 1.5: min(1.5*A, 1.2*A) = 1.5*A -> unclipped, gradient flows.
    lp, inp = _inputs([[math.log(1.5)]], [[0.0]], [-1.0], [[1.0]])
    loss, m = get_loss("grpo")(inp, LossSettings(clip_eps=0.2))
    loss.backward()
    assert lp.grad[0, 0] > 0 and m["clip_fraction"] == 0.0
    # A < 0 and ratio 0.5 < 0.8: clipped, no gradient.
    lp, inp = _inputs([[math.log(0.5)]], [[0.0]], [-1.0], [[1.0]])
    loss, m = get_loss("grpo")(inp, LossSettings(clip_eps=0.2))
    loss.backward()
    assert lp.grad[0, 0] == 0.0 and m["clip_fraction"] == 1.0


def test_asymmetric_upper_clip() -> None:
    lp, inp = _inputs([[math.log(1.25)]], [[0.0]], [1.0], [[1.0]])
    loss, _ = get_loss("grpo")(inp, LossSettings(clip_eps=0.2, clip_eps_high=0.28))
    loss.backward()
    assert lp.grad[0, 0] != 0.0  # 1.25 < 1.28: inside the (wider) upper bound


def test_masked_positions_never_matter() -> None:
    # Garbage log-probs where mask is 0 (even huge ratios) change nothing.
    base = get_loss("grpo")(_inputs([[-1.0, -1.0]], [[-1.0, -1.0]], [1.0], [[1.0, 0.0]])[1],
                            LossSettings())[0]
    lp, inp = _inputs([[-1.0, 50.0]], [[-1.0, -80.0]], [1.0], [[1.0, 0.0]])
    loss, m = get_loss("grpo")(inp, LossSettings())
    loss.backward()
    assert float(loss) == pytest.approx(float(base))
    assert lp.grad[0, 1] == 0.0
    assert math.isfinite(m["ratio_max"]) and m["clip_fraction"] == 0.0


@pytest.mark.parametrize("name", ["grpo", "reinforce"])
def test_zero_advantage_gives_zero_gradient(name: str) -> None:
    lp, inp = _inputs([[-0.5, -2.0], [-1.0, -3.0]], [[-0.7, -2.1], [-1.0, -2.0]], [0.0, 0.0],
                      [[1.0, 1.0], [1.0, 0.0]])
    loss, _ = get_loss(name)(inp, LossSettings())
    loss.backward()
    assert torch.count_nonzero(lp.grad) == 0


def test_aggregation_token_vs_sequence_mean() -> None:
    per_token = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    tok = aggregate(per_token, mask, LossSettings(aggregation="token_mean"))
    seq = aggregate(per_token, mask, LossSettings(aggregation="seq_mean"))
    assert float(tok) == pytest.approx(8.0 / 5.0)  # every token weighs the same
    assert float(seq) == pytest.approx((1.0 + 4.0) / 2.0)  # every sequence weighs the same


def test_normalisers_make_micro_batches_add_up() -> None:
    """Two micro-batches with step-wide normalisers sum to the one-batch loss."""

    logp = [[-1.0, -2.0, -0.5], [-0.3, -0.1, -4.0]]
    old = [[-1.1, -1.9, -0.5], [-0.2, -0.3, -3.0]]
    adv, mask = [1.0, -0.5], [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    for agg in ("token_mean", "seq_mean"):
        full, _ = get_loss("grpo")(_inputs(logp, old, adv, mask)[1], LossSettings(aggregation=agg))
        s = LossSettings(aggregation=agg, token_normalizer=5.0, seq_normalizer=2.0)
        parts = [get_loss("grpo")(_inputs([logp[i]], [old[i]], [adv[i]], [mask[i]])[1], s)[0]
                 for i in range(2)]
        assert float(sum(parts)) == pytest.approx(float(full), rel=1e-6)


def test_k3_kl_is_zero_at_equality_and_positive_elsewhere() -> None:
    lp = torch.tensor([-1.0, -2.0, -0.1])
    assert torch.allclose(k3_kl(lp, lp), torch.zeros(3))
    assert bool((k3_kl(lp, lp + torch.tensor([0.5, -0.5, 1.0])) > 0).all())


def test_kl_term_pulls_towards_reference() -> None:
    # Zero advantage, policy above reference on this token: the KL gradient pushes logp down.
    lp, inp = _inputs([[-0.5]], [[-0.5]], [0.0], [[1.0]], ref=[[-1.5]])
    loss, m = get_loss("grpo")(inp, LossSettings(kl_coef=0.1))
    loss.backward()
    assert m["kl"] > 0 and float(loss) > 0
    assert lp.grad[0, 0] > 0  # gradient descent lowers logp towards the reference
