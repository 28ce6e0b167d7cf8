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


def test_curves_carry_rl_minutes_and_the_time_to_the_bar(bench_module) -> None:
    """Per-minute comparison of arms (issue 15: an overlapped arm must learn at least as well
    per minute): curve points carry the RL minutes of their step, and each arm says when its
    runs first stood 20 points above the warm start."""

    report = bench_module("learning_report")
    rows = [{"step": 1, "step_seconds": 30.0}, {"step": 2, "step_seconds": 15.0},
            {"step": 3, "step_seconds": 45.0}]
    assert report.rl_minutes(rows) == {1: 0.5, 2: 0.75, 3: 1.5}

    def run(arm: str, points: list[tuple[int, float, float]]) -> dict:
        return {"arm": arm, "steps_per_minute": 2.0, "train": {"steps": 3},
                "after": {"success_rate": points[-1][2]},
                "curve": [{"step": s, "minutes": m, "greedy": g, "sampled": None,
                           "query_rate": None, "sampled_query_rate": None}
                          for s, m, g in points]}

    fast = run("overlap", [(1, 0.5, 0.25), (2, 0.8, 0.4), (3, 1.2, 0.45)])
    slow = run("overlap", [(1, 0.6, 0.1), (2, 1.0, 0.3), (3, 1.5, 0.45)])
    flat = run("grpo", [(1, 0.5, 0.1), (2, 1.0, 0.2), (3, 1.5, 0.25)])
    before = {"success_rate": 0.1}
    arms = report.aggregate({"overlap": [fast, slow], "grpo": [flat]}, 0.1, before_row=before)
    bar = arms["overlap"]["minutes_to_bar"]
    assert (bar["n"], bar["runs"], bar["min"], bar["max"]) == (2, 2, 0.8, 1.0)
    assert arms["grpo"]["minutes_to_bar"]["n"] == 0  # 0.25 - 0.1 stays below 20 points
    assert [p["minutes"] for p in arms["overlap"]["curve"]] == pytest.approx([0.0, 0.55, 0.9, 1.35])
    result = {"setup": {"warm_start": "w", "db_seed": 42, "train": 1, "val": 1, "eval_n": 1,
                        "val_templates": [], "budget_s": 1, "max_steps": 1, "group_size": 8,
                        "groups_per_step": 4, "lr": 0.1, "parallel": 1},
              "finished_at": "now", "device": "cpu", "json_path": "x.json",
              "before": before, "arms": arms, "comparisons": {}}
    section = report.results_section(result, "python3 bench/learning_run.py", None)
    assert "| overlap | 2 | 0.9 | 2 | 35.0 |" in section
    assert "- overlap: 0.9 min (0.8..1.0), 2 of 2 runs" in section
    assert "- grpo: never, 0 of 1 runs" in section
    for p in flat["curve"]:  # a run saved before curves had minutes: no time, not "never"
        del p["minutes"]
    untimed = report.aggregate({"grpo": [flat]}, 0.1, before_row=before)["grpo"]
    assert "minutes_to_bar" not in untimed and untimed["curve"][1]["minutes"] is None
