"""SIGKILL the trainer itself mid-rollout and right after a checkpoint (before the adapter is
published and the metrics written); ``--resume`` ends with the same steps as an uninterrupted
run: each step once, on the scenarios the schedule gives it, and the
engine serving the last step's adapter.

Cost: one 3-step run started three times (~35 s on two cores).
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from mcprl_trainer.config import ScenarioSourceConfig
from mcprl_trainer.scenarios import load_scenarios, step_scenarios

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(300)]
STEPS = 3


def _wait_file(path, proc, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.proc.poll() is None and time.monotonic() < deadline, proc.tail()
        time.sleep(0.005)


def test_sigkill_trainer_mid_rollout_and_mid_save_then_resume(fault_stack, trainer,
                                                              tmp_path) -> None:
    config = fault_stack.run_config(tmp_path, "kill-trainer", steps=STEPS)
    run = trainer(config).start()
    run.wait_for(lambda s: s["step"] == 2 and s["phase"] == "rollout", "step 2's rollouts")
    # step 1's optimizer state and state.json are written in the background while step 2's
    # rollouts run (background_checkpoints); a kill before that ends resumes from the step
    # before, as a crash mid-save does (test_checkpoint_writer.py). Kill once it is on disk.
    _wait_file(run.run_dir / "checkpoints" / "step-1" / "state.json", run)
    run.kill()
    assert [h["step"] for h in run.rows("metrics.jsonl")] == [1]

    run.start("--resume")
    _wait_file(run.run_dir / "checkpoints" / "step-2" / "state.json", run)
    run.kill()
    assert not (run.run_dir / "checkpoints" / "step-3").exists()

    run.start("--resume")
    assert run.wait() == 0, run.tail()
    log = run.tail(1_000_000)
    assert "(step 1 done)" in log and "(step 2 done)" in log
    history = run.rows("metrics.jsonl")
    assert [h["step"] for h in history] == [1, 2, 3]  # as many as uninterrupted, none twice
    assert sorted(p.name for p in (run.run_dir / "checkpoints").iterdir()) == \
        ["step-1", "step-2", "step-3"]  # no temporary left by the kills
    report = json.loads((run.run_dir / "report.json").read_text())
    assert report["steps_done"] == STEPS and not report["stopped_early"]
    splits = asyncio.run(load_scenarios(ScenarioSourceConfig(**config["scenarios"])))
    for step in range(1, STEPS + 1):
        expected = {s.id for s in step_scenarios(splits.train, step, 2, 0)}
        rows = run.rows(f"rollouts/step-{step}.jsonl")
        assert {r["scenario_id"] for r in rows} == expected
        assert len(rows) == 2 * 4
    models = httpx.get(f"{fault_stack.engine_url}/models", timeout=10).json()["data"]
    roots = {m["id"]: m.get("root") for m in models}
    assert roots["kill-trainer"] == str((run.run_dir / "checkpoints" / "step-3").resolve())
