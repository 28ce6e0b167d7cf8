"""The shuffled-reward control: same rewards, wrong rollouts, reproducible."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcprl_trainer.advantages import group_advantages, shuffled_group_rewards

pytestmark = pytest.mark.timeout(60)

GROUPS = st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=2, max_size=8)


@settings(max_examples=200, deadline=None)
@given(rewards=GROUPS, seed=st.integers(0, 10_000), step=st.integers(1, 500),
       group=st.integers(0, 16))
def test_shuffle_keeps_rewards_and_moves_them(rewards: list[float], seed: int, step: int,
                                              group: int) -> None:
    out = shuffled_group_rewards(rewards, seed=seed, step=step, group=group)
    assert sorted(out) == sorted(rewards)  # the same multiset: the reward distribution is kept
    assert out == shuffled_group_rewards(rewards, seed=seed, step=step, group=group)
    if len(set(rewards)) > 1:
        assert out != rewards  # the assignment changed: the signal is really gone
    else:
        assert out == rewards


def test_shuffle_depends_on_seed_step_and_group() -> None:
    rewards = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    draws = {tuple(shuffled_group_rewards(rewards, seed=s, step=t, group=g))
             for s in range(3) for t in range(1, 4) for g in range(3)}
    assert len(draws) > 4  # not one fixed permutation


def test_shuffled_advantages_keep_their_statistics() -> None:
    rewards = [1.0, 0.0, 0.5, 0.0]
    plain = group_advantages(rewards)
    shuffled = group_advantages(shuffled_group_rewards(rewards, seed=0, step=1, group=0))
    assert shuffled.mean == pytest.approx(plain.mean)
    assert shuffled.std == pytest.approx(plain.std)
    assert sorted(shuffled.advantages) == pytest.approx(sorted(plain.advantages))
    assert shuffled.advantages != plain.advantages
