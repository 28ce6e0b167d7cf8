"""The demo's results table: rates come with their 95% interval, so a small eval is read
as the noisy estimate it is."""

from __future__ import annotations

import math

import pytest

from mcprl_demo.display import wilson_interval


def test_wilson_interval_matches_the_textbook_values() -> None:
    # 11 of 64 (the demo's greedy eval): Wilson 95% = [0.0988, 0.2821] (by hand).
    lo, hi = wilson_interval(11 / 64, 64)
    assert math.isclose(lo, 0.0988, abs_tol=2e-4) and math.isclose(hi, 0.2821, abs_tol=2e-4)


@pytest.mark.parametrize("n", [1, 8, 64, 1000])
def test_interval_is_sound_at_the_edges(n: int) -> None:
    lo0, hi0 = wilson_interval(0.0, n)
    lo1, hi1 = wilson_interval(1.0, n)
    assert lo0 == 0.0 and 0.0 < hi0 < 1.0 and 0.0 < lo1 < 1.0 and math.isclose(hi1, 1.0)
    assert math.isclose(hi0, 1.0 - lo1)  # symmetric
    assert hi0 < wilson_interval(0.0, max(1, n // 2))[1] or n == 1  # more rollouts, narrower


def test_no_rollouts_means_no_information() -> None:
    assert wilson_interval(0.0, 0) == (0.0, 1.0)
