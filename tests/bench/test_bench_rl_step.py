"""bench/bench_rl_step.py end to end on the CPU at ``--shape tiny``: our engine as a real
process and the trainer's step beside TRL's GRPOTrainer (skipped without trl: make
setup-trl); checks the JSON the H200 run will print and that each step is its phases."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HAS_TRL = importlib.util.find_spec("trl") is not None
OURS_PHASES = {"rollout", "reward", "update", "checkpoint", "publish"}
TRL_PHASES = {"generate", "score", "train"}
ENGINE_KEYS = {"prefill_s", "prefill_batches", "prefill_forwards", "decode_s", "decode_steps",
               "decode_tokens", "graph_captures", "decode_forward_s", "sample_s", "rollout_other_s",
               "ahead_steps"}


def _bench(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    out = tmp_path / "rl_step.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_rl_step.py"), "--shape", "tiny",
         "--device", "cpu", "--threads", "1", "--workdir", str(tmp_path / "work"),
         "--out", str(out), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=150, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)  # stdout is the JSON alone
    assert result == json.loads(out.read_text())
    return result


def _check_engine(ours: dict, work: dict, ahead: bool = False) -> None:
    """Each step's rollout phase split by the engine's counters (CPU: no graphs, no profile
    times; ``ahead``: async scheduling was turned on, off by default on the CPU)."""

    rollouts = work["prompts"] * work["rollouts"]
    requests = rollouts * work["turns"]
    for step in ours["steps"]:
        engine = step["engine"]
        assert set(engine) == ENGINE_KEYS
        assert engine["prefill_batches"] >= 1 and engine["decode_steps"] > 0
        # the group's equal prompts share one prefill: at most one forward per distinct prompt
        # and turn, well under one per request
        assert 1 <= engine["prefill_forwards"] < requests
        # each request's first token comes from its prefill, every other one from a decode step
        assert engine["decode_tokens"] == step["sampled_tokens"] - requests
        assert engine["decode_steps"] <= engine["decode_tokens"]
        assert engine["prefill_s"] > 0 and engine["decode_s"] > 0
        assert engine["graph_captures"] == engine["decode_forward_s"] == engine["sample_s"] == 0
        # async scheduling launches most decode steps before the one before is read
        assert (engine["ahead_steps"] > engine["decode_steps"] // 2) if ahead \
            else engine["ahead_steps"] == 0, json.dumps(engine)
        rollout = step["rollout_seconds"]  # a phase of its own unless overlapped
        assert engine["rollout_other_s"] == pytest.approx(
            rollout - engine["prefill_s"] - engine["decode_s"], abs=2e-3)
        assert engine["prefill_s"] + engine["decode_s"] <= rollout + 2e-3
    assert set(ours["engine_median"]) == ENGINE_KEYS


def _check_side(side: dict, phases: set[str], steps: int, sampled: int,
                first_phases: set[str] | None = None) -> None:
    assert side["timed_steps"] == steps and len(side["steps"]) == steps + 1
    assert [s["warmup"] for s in side["steps"]] == [True] + [False] * steps
    timed = [s["seconds"] for s in side["steps"][1:]]
    assert side["seconds_per_step"] == pytest.approx(sorted(timed)[len(timed) // 2], abs=1e-3)
    assert side["seconds_best"] == min(timed)
    for i, step in enumerate(side["steps"]):
        assert set(step["phases"]) == (first_phases if i == 0 and first_phases else phases)
        assert all(v >= 0 for v in step["phases"].values())
        # the phases are the step: nothing much outside them, nothing counted twice
        assert sum(step["phases"].values()) <= step["seconds"] + 0.01
        assert sum(step["phases"].values()) >= 0.9 * step["seconds"]
        assert step["gpu_busy_seconds"] is None and step["device_peak_gib"] is None  # CPU
    assert set(side["phases_median"]) >= phases
    assert side["sampled_tokens_per_s"] == pytest.approx(sampled / side["seconds_per_step"],
                                                         rel=1e-2)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_single_turn_ours_and_trl(tmp_path: Path) -> None:
    result = _bench(tmp_path, "--steps", "3", "--warmup", "1")
    setup = result["setup"]
    work = setup["workload"]
    assert setup["device"] == "cpu" and setup["versions"]["torch"]
    assert (work["shape"], work["variant"], work["turns"]) == ("tiny", "single", 1)
    rollouts = work["prompts"] * work["rollouts"]
    sampled = rollouts * work["new_tokens"]
    ours = result["ours"]
    _check_side(ours, OURS_PHASES, 3, sampled)
    for step in ours["steps"]:
        assert step["sampled_tokens"] == sampled  # eos ignored: every rollout full length
        assert step["trained_tokens"] == sampled  # every sampled token trained on
    # step 1 samples the base; later steps the adapter published by the step before
    assert [s["sampled_with"] for s in ours["steps"]] == ["bench-base"] + ["rl-step"] * 3
    _check_engine(ours, work)
    assert ours["engine_profile"].startswith("INFERENCE_PROFILE off")
    if not HAS_TRL:
        assert "skipped" in result["trl"] and result["speedup"] is None
        pytest.skip("trl is not installed (make setup-trl): TRL side not run")
    trl = result["trl"]
    _check_side(trl, TRL_PHASES, 3, sampled)
    assert all(s["completion_tokens"] == sampled for s in trl["steps"])
    assert trl["config"]["gradient_accumulation_steps"] == work["prompts"]
    assert result["speedup"] == pytest.approx(trl["seconds_per_step"] / ours["seconds_per_step"],
                                              rel=1e-2)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_multiturn_appends_tool_results(tmp_path: Path) -> None:
    result = _bench(tmp_path, "--variant", "multiturn", "--steps", "1", "--warmup", "1",
                    "--engine-profile", "on", *(() if HAS_TRL else ("--only", "ours")))
    work = result["setup"]["workload"]
    assert work["turns"] == 4 and work["turn_tokens"] * 4 == work["new_tokens"]
    rollouts = work["prompts"] * work["rollouts"]
    sampled = rollouts * work["new_tokens"]
    for step in result["ours"]["steps"]:
        assert step["sampled_tokens"] == step["trained_tokens"] == sampled
    _check_engine(result["ours"], work)
    assert result["ours"]["engine_profile"].startswith("INFERENCE_PROFILE on")
    if HAS_TRL:  # TRL's completions hold the tool results too (masked out of its loss)
        tools = rollouts * work["tool_tokens"] * (work["turns"] - 1)
        assert all(s["completion_tokens"] == sampled + tools for s in result["trl"]["steps"])


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_overlapped_steps_sample_one_version_behind(tmp_path: Path) -> None:
    """--max-staleness both: our side also overlapped, where step k+1's rollouts run during
    step k's update, from adapter k-1 (published before they start), and the step waits
    only for what is left of them. The engine runs with async scheduling on (the CUDA
    default), so both loops meet decode steps launched ahead, adapter loads among them."""

    result = _bench(tmp_path, "--only", "ours", "--max-staleness", "both", "--steps", "3",
                    "--warmup", "1", env={"INFERENCE_ASYNC_SCHEDULING": "true"})
    assert result["setup"]["engine_env"] == {"INFERENCE_ASYNC_SCHEDULING": "true"}
    work = result["setup"]["workload"]
    sampled = work["prompts"] * work["rollouts"] * work["new_tokens"]
    sync = result["ours"]  # the synchronous side beside it: each step samples the last adapter
    assert sync["max_staleness"] == 0
    assert [s["sampled_version"] for s in sync["steps"]] == [0, 1, 2, 3]
    assert result["speedup"] is None and result["speedup_overlapped"] is None  # no TRL side
    ours = result["ours_overlapped"]
    assert ours["max_staleness"] == 1
    _check_side(ours, {"rollout_wait", "reward", "update", "checkpoint"}, 3, sampled,
                first_phases={"rollout", "reward", "update", "checkpoint"})
    steps = ours["steps"]
    for step in steps:
        assert step["sampled_tokens"] == step["trained_tokens"] == sampled
        assert step["rollout_seconds"] > 0
    # step 1 samples the base (version 0), step 2 too (its rollouts ran during update 1);
    # step k >= 3 samples adapter k-2, published by its collection before it sampled
    assert [s["sampled_version"] for s in steps] == [0, 0, 1, 2]
    assert [s["sampled_with"] for s in steps] == ["bench-base"] * 2 + ["rl-step"] * 2
    assert "publish_overlapped_s" not in steps[0]
    assert steps[1]["publish_overlapped_s"] == 0.0  # nothing to publish before step 2's
    assert all(s["publish_overlapped_s"] > 0 for s in steps[2:])
    # the collection overlapped the update: the step waited for less than it took
    assert all(s["phases"]["rollout_wait"] < s["rollout_seconds"] for s in steps[1:])
    _check_engine(sync, work, ahead=True)
    _check_engine(ours, work, ahead=True)
