"""bench/learning_report.py: the paired gain (each run's after against its own before) and the
results section's table of it, on a learning run's JSON shape."""

from __future__ import annotations

import pytest


def _run(seed: int, before: float | None, after: float, sampled: float) -> dict:
    run = {"arm": "shuffled", "seed": seed, "name": f"shuffled-s{seed}", "steps_per_minute": 3.0,
           "train": {"steps": 20},
           "after": {"success_rate": after, "sampled_success_rate": sampled}}
    if before is not None:
        run["before"] = {"success_rate": before, "sampled_success_rate": 0.25}
    return run


def test_paired_gain_reads_each_run_against_its_own_before(bench_module) -> None:
    report = bench_module("learning_report")
    runs = [_run(0, 0.0625, 0.03125, 0.25), _run(1, 0.125, 0.125, 0.3125),
            _run(2, None, 0.5, 0.5)]  # no before of its own (its re-eval failed): left out
    arm = report.aggregate({"shuffled": runs}, before=0.09375, before_sampled=0.25)["shuffled"]
    assert arm["gain"]["mean"] == pytest.approx((0.03125 + 0.125 + 0.5) / 3 - 0.09375)
    assert arm["before_paired"] == {"n": 2, "mean": pytest.approx(0.09375),
                                    "std": pytest.approx(0.0441942), "min": 0.0625,
                                    "max": 0.125}
    assert arm["gain_paired"]["n"] == 2
    assert arm["gain_paired"]["mean"] == pytest.approx((-0.03125 + 0.0) / 2)
    assert arm["gain_paired_sampled"]["mean"] == pytest.approx((0.0 + 0.0625) / 2)
    result = {"setup": {"warm_start": "w", "db_seed": 42, "train": 1, "val": 1, "eval_n": 1,
                        "val_templates": [], "budget_s": 1, "max_steps": 1, "group_size": 8,
                        "groups_per_step": 4, "lr": 0.1, "parallel": 1},
              "finished_at": "now", "device": "cpu", "json_path": "x.json",
              "before": {"success_rate": 0.09375}, "arms": {"shuffled": arm},
              "comparisons": {}}
    section = report.results_section(result, "python3 bench/learning_run.py", None)
    assert "| shuffled | 2 | 9.4 | -1.6 (-3.1..0.0) | 25.0 | 3.1 (0.0..6.2) |" in section


def test_no_paired_before_means_no_paired_gain(bench_module) -> None:
    report = bench_module("learning_report")
    arm = report.aggregate({"grpo": [_run(0, None, 0.5, 0.5)]}, before=0.1)["grpo"]
    assert "gain_paired" not in arm and "before_paired" not in arm
