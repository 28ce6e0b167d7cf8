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
def test_shuffle_keeps_rewards_and_is_reproducible(rewards: list[float], seed: int, step: int,
                                                    group: int) -> None:
    out = shuffled_group_rewards(rewards, seed=seed, step=step, group=group)
    assert sorted(out) == sorted(rewards)  # the same multiset: the reward distribution is kept
    assert out == shuffled_group_rewards(rewards, seed=seed, step=step, group=group)


def test_shuffled_reward_is_independent_of_the_rollout() -> None:
    """The control's null: a rollout's own reward says nothing about the one it is given.

    With one success among 8, the successful rollout must keep its reward 1/8 of the time,
    like every other rollout. A permutation that excludes the identity gives it 0 of the
    time: a systematic penalty on what earned the reward (an anti-signal that made the
    SmolLM2 control fall on H200). 4,000 draws put 1/8 within about 0.016 (3 sigma)."""

    rewards = [1.0] + [0.0] * 7
    n = 4000
    kept = [shuffled_group_rewards(rewards, seed=s, step=1 + s % 7, group=s % 5)[0]
            for s in range(n)]
    assert abs(sum(kept) / n - 1 / 8) < 0.016
    # and the advantage the true success is given averages zero, as for any other rollout
    advs = [group_advantages(shuffled_group_rewards(rewards, seed=s, step=1, group=0))
            .advantages[0] for s in range(n)]
    assert abs(sum(advs) / n) < 0.1


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
