"""bench/learning_run.py --smoke end to end on the CPU: real MCP server, engine, judge and
trainer processes on loopback, tiny-test model; checks the JSON the GPU run will print."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ARMS = ["grpo", "shuffled", "no-skip"]


def _smoke(out: Path, *args: str) -> dict:
    """``learning_run.py --smoke`` on the CPU; its stdout, which must be the JSON alone."""

    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "learning_run.py"), "--smoke", "--device", "cpu",
         *args, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_smoke_run_reports_every_arm(tmp_path: Path) -> None:
    out = tmp_path / "learning"
    result = _smoke(out, "--arms", ",".join(ARMS), "--no-paired-before")
    assert result == {k: v for k, v in json.loads((out / "learning_run.json").read_text())
                      .items() if k != "runs"}
    setup = result["setup"]
    assert setup["train"] > 0 and setup["val"] > 0 and setup["eval_n"] > 0
    # held out: val templates (and so val scenarios) never appear in RL training
    assert not set(setup["val_templates"]) & set(setup["train_templates"])
    assert 0.0 <= result["before"]["success_rate"] <= 1.0
    assert result["before"]["n"] == setup["eval_n"]
    assert list(result["arms"]) == ARMS
    for name, arm in result["arms"].items():
        assert arm["runs"] == 1 and arm["failed"] == 0, name
        assert arm["before"] == result["before"]["success_rate"]
        assert 0.0 <= arm["after"]["mean"] <= 1.0
        assert arm["gain"]["mean"] == pytest.approx(arm["after"]["mean"] - arm["before"])
        assert arm["train"]["steps"] == 2  # the smoke's step budget, reached
        assert "gain_paired" not in arm  # --no-paired-before
        assert arm["train"]["reward_std"] is not None and arm["train"]["reward_std"] >= 0
        assert 0.0 <= arm["train"]["zero_variance_fraction"] <= 1.0
    # no-skip trains every group, so the update ran and reported its statistics
    assert result["arms"]["no-skip"]["train"]["clip_fraction"] is not None
    assert result["arms"]["no-skip"]["train"]["loss"] is not None
    assert "grpo - shuffled (signal)" in result["comparisons"]
    assert (out / "curves.png").stat().st_size > 0
    for run in ("grpo-s0", "shuffled-s0", "no-skip-s0"):
        config = (out / "configs" / f"{run}.yaml").read_text()
        assert ("shuffle_rewards: true" in config) == run.startswith("shuffled")
        assert len((out / "runs" / run / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_engine_per_run_gives_each_run_its_own_engine(tmp_path: Path) -> None:
    out = tmp_path / "learning"
    result = _smoke(out, "--arms", "grpo,shuffled", "--parallel", "2", "--engine-per-run",
                    "--first-seed", "4")  # a re-run with other trainer seeds
    assert result["setup"]["engine_per_run"] is True and result["setup"]["first_seed"] == 4
    urls = {}
    for run in ("grpo-s4", "shuffled-s4"):
        config = yaml.safe_load((out / "configs" / f"{run}.yaml").read_text())
        assert config["seed"] == 4
        urls[run] = config["policy"]["base_url"]
        # the run's engine served its rollouts and its after-eval: its log names that port
        log = (out / "stack" / f"engine-{run}" / "logs" / "inference.log").read_text()
        assert urls[run].removesuffix("/v1") in log
        assert len((out / "runs" / run / "metrics.jsonl").read_text().splitlines()) == 2
    assert len(set(urls.values())) == 2  # two engines, neither shared
    for name, arm in result["arms"].items():
        assert arm["runs"] == 1 and arm["failed"] == 0, name
        # the start evaluated again on the run's own engine, and the gain read against it
        assert arm["before_paired"]["n"] == arm["gain_paired"]["n"] == 1, name
        assert arm["gain_paired"]["mean"] == pytest.approx(
            arm["after"]["mean"] - arm["before_paired"]["mean"])
    runs = json.loads((out / "learning_run.json").read_text())["runs"]
    assert {r["name"] for r in runs} == {"grpo-s4", "shuffled-s4"}
    for run in runs:
        assert run["before"]["n"] == result["setup"]["eval_n"], run["name"]


def test_extra_arms_run_beside_an_arms_subset(bench_module) -> None:
    """An --extra-arm is not dropped by an --arms list that does not name it (2026-12-06: the
    GPU script's fixed --arms grpo,shuffled swallowed an overlap arm and a lease ran
    without it); --seeds applies to it too; an unknown name still fails."""

    lr = bench_module("learning_run")
    args = lr.parse_args(["--arms", "grpo", "--seeds", "2",
                          "--extra-arm", "overlap:train.max_staleness=1:3"])
    arms = lr.select_arms(args)
    assert list(arms) == ["grpo", "overlap"]
    assert arms["overlap"].overrides == {"train": {"max_staleness": 1}}
    assert [a.seeds for a in arms.values()] == [2, 2]
    named = lr.select_arms(lr.parse_args(["--arms", "overlap,shuffled",
                                          "--extra-arm", "overlap:train.lr=0.1:1"]))
    assert list(named) == ["shuffled", "overlap"]
    with pytest.raises(SystemExit, match="unknown arm"):
        lr.select_arms(lr.parse_args(["--arms", "grpo,overlap"]))
