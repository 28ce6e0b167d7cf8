"""SIGKILL each service in the middle of a training step, restart it on the same port, and
check the run loses and repeats nothing: every step once, every checkpoint, no rollout
trained on half-made, and the engine serving the latest adapter again after its restart.

Cost: one 3-step run of the tiny-test model per service (~20-30 s each on two cores).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(300)]
STEPS = 3
KILL_STEP = 2
# The service stays dead until the trainer has felt it (a retry in its log), then restarts.
FELT = {"mcp-server": "rollout failed, retrying", "inference": "rollout failed, retrying",
        "judge": "judging a group failed, retrying", "scenario-gen": None}
OUTAGE_S = 1.0  # scenario-gen, which the run does not call mid-step: down this long


def _checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def assert_complete(trainer, steps: int = STEPS) -> list[dict]:
    """Every step once, in order; every checkpoint; no temporaries; the report agrees."""

    history = trainer.rows("metrics.jsonl")
    assert [h["step"] for h in history] == list(range(1, steps + 1)), trainer.tail()
    assert _checkpoints(trainer.run_dir) == [f"step-{s}" for s in range(1, steps + 1)]
    report = json.loads((trainer.run_dir / "report.json").read_text())
    assert report["steps_done"] == steps and report["stopped_early"] is False
    for h in history:  # tool errors are the agent's own: none comes from a dead server
        assert not set(h["tool_errors"]) & {"transport", "protocol", "timeout"}, h["tool_errors"]
    return history


def assert_no_half_made(trainer, step: int) -> None:
    """No trajectory of ``step`` carries a trace of the outage (what the agent would learn)."""

    for row in trainer.rows(f"rollouts/step-{step}.jsonl"):
        for msg in row["trajectory"]["messages"]:
            text = str(msg.get("content") or "")
            for trace in ("Connection closed", "connection attempts failed", "unavailable",
                          "not connected"):
                assert trace not in text, (step, msg)


def _kill_mid_step(fault_stack, trainer_proc, service: str) -> float:
    """Wait for step KILL_STEP's rollouts, SIGKILL ``service``, restart it; seconds down."""

    trainer_proc.wait_for(lambda s: s["step"] == KILL_STEP and s["phase"] == "rollout",
                          f"step {KILL_STEP}'s rollouts")
    t0 = time.monotonic()
    fault_stack.stack.kill(service)
    if FELT[service]:
        trainer_proc.wait_log(FELT[service], timeout_s=90)
    else:
        time.sleep(OUTAGE_S)
    fault_stack.stack.restart(service)  # returns once /healthz answers
    return time.monotonic() - t0


@pytest.mark.parametrize("service", ["mcp-server", "inference", "judge", "scenario-gen"])
def test_kill_service_mid_step(fault_stack, trainer, tmp_path, service) -> None:
    name = f"kill-{service}"
    run = trainer(fault_stack.run_config(tmp_path, name))
    if service == "scenario-gen":  # the run needs it at the start: begin while it is down
        fault_stack.stack.kill(service)
        run.start()
        run.wait_log("retrying")  # loading the set failed and is being retried
        fault_stack.stack.restart(service)
    else:
        run.start()
    down_s = _kill_mid_step(fault_stack, run, service)
    metrics_seen = ""
    if service != "scenario-gen":  # (the run does not wait for it: it may be done already)
        run.wait_for(lambda s: (s.get("last_step") or {}).get("step", 0) >= KILL_STEP,
                     f"step {KILL_STEP} done")
        metrics_seen = run.metrics()
    assert run.wait() == 0, run.tail()
    history = assert_complete(run)
    killed = history[KILL_STEP - 1]
    print(f"{service}: down {down_s:.1f}s; step {KILL_STEP}: retried "
          f"{killed['rollouts_retried']} rollouts, {killed['judge_retried']} judge calls, "
          f"dropped {killed['rollouts_dropped']}, {killed['step_seconds']:.1f}s")
    for step in range(1, STEPS + 1):
        assert_no_half_made(run, step)

    if service == "mcp-server":  # the cut rollouts were started again, and counted
        assert killed["rollouts_retried"] >= 1
        assert 'mcprl_trainer_rollouts_retried_total{service="mcp"}' in metrics_seen
    elif service == "inference":
        assert killed["rollouts_retried"] >= 1
        assert 'mcprl_trainer_rollouts_retried_total{service="engine"}' in metrics_seen
        # The restarted engine lost the adapter; the trainer loaded it again, so step 2 still
        # sampled from step 1's adapter (not the base model, no dropped group) ...
        assert "publishing it again" in run.tail(200_000)
        assert "mcprl_trainer_adapter_republished_total 1.0" in metrics_seen
        assert killed["groups_failed"] == 0
        for step in range(2, STEPS + 1):
            served = {tuple(r["trajectory"]["metadata"]["served_by"])
                      for r in run.rows(f"rollouts/step-{step}.jsonl")}
            assert served == {(name,)}, (step, served)
        # ... and it serves the latest adapter now.
        models = httpx.get(f"{fault_stack.engine_url}/models", timeout=10).json()["data"]
        roots = {m["id"]: m.get("root") for m in models}
        assert roots[name] == str((run.run_dir / "checkpoints" / f"step-{STEPS}").resolve())
    elif service == "judge":  # the judge calls made while it was down were retried
        assert killed["judge_retried"] >= 1 and killed["groups_failed"] == 0
        assert 'mcprl_trainer_service_retries_total{service="judge"}' in metrics_seen
    else:  # scenario-gen: needed only to load the set, which was retried and survives kills
        retries = [line for line in run.tail(1_000_000).splitlines()
                   if "retrying" in line and "scenario-sets" in line]
        assert retries, run.tail()
        resp = httpx.get(f"{fault_stack.urls['scenario-gen']}/v1/scenario-sets/"
                         f"{fault_stack.set_id}/scenarios", params={"split": "train"}, timeout=10)
        assert resp.status_code == 200 and resp.json()["count"] > 0
