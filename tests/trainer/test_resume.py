"""`mcprl-train` as a real process: SIGTERM stops it after the current step, SIGKILL after a
checkpoint loses nothing, and `--resume` continues with the same step numbering, the same
scenarios per step, and no step lost or repeated."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from mcprl_common.process import free_port
from mcprl_trainer.config import ScenarioSourceConfig
from mcprl_trainer.scenarios import load_scenarios, step_scenarios

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _start(config: Path, log: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "mcprl_trainer.cli", "--config", str(config), "--no-progress",
         *extra], stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env,
        start_new_session=True)


def _wait_for(predicate, proc: subprocess.Popen, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited ({proc.returncode}) before {what}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _phase(port: int) -> str | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v1/status", timeout=1).json()["phase"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_sigterm_then_sigkill_then_resume(stack, tmp_path) -> None:
    port = free_port()
    data = stack.run_config(tmp_path, name="resume", steps=3, eval={"every": 2},
                            status={"enabled": True, "port": port})
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(data))
    run = Path(data["output_dir"]) / "resume"
    log = tmp_path / "trainer.log"

    # 1. SIGTERM while step 1 samples: the step is finished and checkpointed, then it stops.
    proc = _start(config, log)
    _wait_for(lambda: _phase(port) == "rollout", proc, 120, "step 1's rollouts")
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(120) == 0, log.read_text()[-3000:]
    assert "stopped early after step 1" in log.read_text()
    assert [h["step"] for h in _rows(run / "metrics.jsonl")] == [1]
    assert (run / "checkpoints" / "step-1" / "state.json").exists()
    assert json.loads((run / "report.json").read_text())["stopped_early"] is True

    # 2. Resume, then SIGKILL as soon as step 2's checkpoint is on disk (mid step 3 or eval).
    proc = _start(config, log, "--resume")
    step2 = run / "checkpoints" / "step-2" / "state.json"
    _wait_for(step2.exists, proc, 180, "step 2's checkpoint")
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    assert not (run / "checkpoints" / "step-3").exists()

    # 3. Resume again: it runs what step 2 had left (its eval, if it was cut) and step 3.
    proc = _start(config, log, "--resume")
    assert proc.wait(240) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert text.count("resumed from") == 2 and "(step 1 done)" in text and "(step 2 done)" in text
    history = _rows(run / "metrics.jsonl")
    assert [h["step"] for h in history] == [1, 2, 3]  # nothing lost, nothing repeated
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == \
        ["step-1", "step-2", "step-3"]  # no temporaries left behind
    assert [e["step"] for e in _rows(run / "evals.jsonl")] == [0, 2, 3]
    # Step 2 after the first resume sampled from step 1's adapter, step 3 from step 2's.
    assert [h["sampled_with"] for h in history] == [stack.base_model, "resume", "resume"]
    # Every step trained on the scenarios the schedule gives it, whichever process ran it.
    splits = asyncio.run(load_scenarios(ScenarioSourceConfig(**data["scenarios"])))
    for step in (1, 2, 3):
        expected = [s.id for s in step_scenarios(splits.train, step, 2, 0)]
        rows = _rows(run / "rollouts" / f"step-{step}.jsonl")
        got = [r["scenario_id"] for r in rows if r["group"] is not None]
        assert sorted(set(got)) == sorted(set(expected))
    report = json.loads((run / "report.json").read_text())
    assert report["steps_done"] == 3 and report["stopped_early"] is False
    # The run report covers the steps and evals of all three processes.
    data = run / "report-data"
    assert sorted(p.stem for p in data.glob("*.js")) == \
        ["eval-0000", "eval-0002", "eval-0003", "train-0001", "train-0002", "train-0003"]
