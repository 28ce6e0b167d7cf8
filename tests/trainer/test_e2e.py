"""One full RL loop on loopback: rollouts through MCP against our engine, RULER scores from
the judge (its judge model is our engine), a GRPO update of the LoRA, the adapter published
to the engine, and the next step's rollouts sampled from it."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from safetensors.torch import load_file

from mcprl_common.process import free_port
from mcprl_trainer.config import RunConfig
from mcprl_trainer.trainer import RunExistsError, Trainer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class _Poller(threading.Thread):
    """Reads the status server while the run goes on (what Prometheus and humans see)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.seen: dict[str, object] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                health = httpx.get(f"{self.url}/healthz", timeout=2)
                status = httpx.get(f"{self.url}/v1/status", timeout=2).json()
                metrics = httpx.get(f"{self.url}/metrics", timeout=2).text
                self.seen.setdefault("health", health.status_code)
                self.seen.setdefault("phases", set()).add(status["phase"])  # type: ignore[union-attr]
                if "mcprl_trainer_step 1.0" in metrics:
                    self.seen["metrics_after_step_1"] = metrics
            except httpx.HTTPError:
                pass
            time.sleep(0.2)


async def test_one_rl_step_end_to_end(stack, tmp_path) -> None:
    port = free_port()
    config = RunConfig.model_validate(stack.run_config(
        tmp_path, name="e2e", reward={"mode": "ruler"}, sleep_engine_during_train=True,
        status={"enabled": True, "port": port}))
    poller = _Poller(f"http://127.0.0.1:{port}")
    poller.start()
    started = time.perf_counter()
    outcome = await Trainer(config).run()
    poller.done.set()
    elapsed = time.perf_counter() - started
    run = config.run_dir
    assert outcome.steps_done == 2 and not outcome.stopped_early

    history = _rows(run / "metrics.jsonl")
    assert [h["step"] for h in history] == [1, 2]
    # Step 1 samples from the base model, step 2 from the adapter step 1 published.
    assert history[0]["sampled_with"] == stack.base_model
    assert history[1]["sampled_with"] == "e2e"
    # Synchronous (train.max_staleness 0): every step on-policy, waiting for its rollouts.
    assert [h["policy_version"] for h in history] == [0, 1]
    assert [h["staleness"] for h in history] == [0, 0]
    assert all(h["rollout_wait_seconds"] >= h["rollout_seconds"] for h in history)
    for step, served in ((1, stack.base_model), (2, "e2e")):
        rows = _rows(run / "rollouts" / f"step-{step}.jsonl")
        assert len(rows) == 8 and all(r["reward"] is not None for r in rows)
        for r in rows:
            traj = r["trajectory"]
            assert traj["metadata"]["served_by"] == [served]  # the engine's own answer
            names = {t["function"]["name"] for t in traj["tools"]}
            assert {"list_tables", "describe_table", "run_query", "complete_task"} <= names
            assert "ruler" in r["components"]

    # Some group had reward variance and was trained on; the adapter moved away from init.
    trained = [h for h in history if h["groups_trained"] > 0]
    assert trained, [(h["reward_mean"], h["reward_std"]) for h in history]
    first = trained[0]
    assert first["train_tokens"] > 0 and first["grad_norm"] > 0
    weights = load_file(run / "checkpoints" / f"step-{first['step']}" /
                        "adapter_model.safetensors")
    lora_b = [t for name, t in weights.items() if "lora_B" in name]
    assert lora_b and any(float(t.abs().max()) > 0 for t in lora_b)  # B starts at zero

    # The engine serves the adapter: same prompt and seed, other log-probs than the base.
    async with httpx.AsyncClient(timeout=60) as client:
        answers = {}
        for model in (stack.base_model, "e2e"):
            resp = await client.post(f"{stack.engine_url}/completions", json={
                "model": model, "prompt": [1, 2, 3, 4, 5], "max_tokens": 4, "temperature": 1.0,
                "seed": 11, "logprobs": 1, "return_token_ids": True})
            resp.raise_for_status()
            answers[model] = resp.json()
    assert answers["e2e"]["model"] == "e2e"
    lp_base = answers[stack.base_model]["choices"][0]["logprobs"]["token_logprobs"]
    lp_adapter = answers["e2e"]["choices"][0]["logprobs"]["token_logprobs"]
    assert lp_base != lp_adapter

    # The status server was up during the run and exported the step's metrics.
    assert poller.seen.get("health") == 200
    assert {"rollout", "train"} & poller.seen.get("phases", set())  # type: ignore[operator]
    metrics = str(poller.seen.get("metrics_after_step_1", ""))
    for name in ("mcprl_trainer_reward_mean", "mcprl_trainer_phase_seconds",
                 "mcprl_trainer_rollout_duration_seconds_bucket", "mcprl_trainer_rollouts_total"):
        assert name in metrics

    # The report: JSON, Markdown, and the reward curve PNG.
    report = json.loads((run / "report.json").read_text())
    assert report["steps_done"] == 2 and len(report["history"]) == 2
    assert (run / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "| step | reward" in (run / "report.md").read_text()

    # One CPU step's time split, for the record (pytest -s shows it).
    for h in history:
        print(f"step {h['step']}: rollout {h['rollout_seconds']:.2f}s judge "
              f"{h['judge_seconds']:.2f}s (busy {h['judge_busy_seconds']:.2f}s) train "
              f"{h['train_seconds']:.2f}s publish {h['publish_seconds']:.2f}s total "
              f"{h['step_seconds']:.2f}s; run {elapsed:.1f}s")

    # Starting it again without --resume refuses to overwrite the run.
    with pytest.raises(RunExistsError):
        await Trainer(config).run()


async def test_rollouts_are_reproducible_from_the_seed(stack, tiny_test_model) -> None:
    """Same (seed, step) -> the same sampled tokens; another step -> other tokens."""

    from mcprl_common.wire import RewardConfig
    from mcprl_trainer.config import RolloutConfig, ScenarioSourceConfig
    from mcprl_trainer.groups import GroupRunner, McpTarget
    from mcprl_trainer.judge_client import JudgeClient
    from mcprl_trainer.modeling import load_tokenizer
    from mcprl_trainer.policy import PolicyClient
    from mcprl_trainer.rendering import ChatRenderer
    from mcprl_trainer.rollout import RolloutSettings
    from mcprl_trainer.scenarios import load_scenarios

    splits = await load_scenarios(ScenarioSourceConfig(url=stack.scenario_gen_url,
                                                       set_id=stack.set_id, max_train=2))
    policy, judge = PolicyClient(stack.engine_url), JudgeClient(stack.judge_url)
    runner = GroupRunner(sampler=policy, renderer=ChatRenderer(load_tokenizer(
        str(tiny_test_model))), mcp=McpTarget(stack.mcp_url), judge=judge,
        reward=RewardConfig(mode="verifiable"), concurrency=4)
    settings = RolloutSettings.from_config(RolloutConfig(max_turns=1, max_tokens_per_turn=16))

    async def tokens(step: int) -> list[list[int]]:
        batch = await runner.run(splits.train, group_size=2, model=stack.base_model,
                                 settings=settings, seed_parts=(0, step))
        assert not batch.failed
        return [r.tokens.flatten()[0] for g in batch.groups for r in g.results]

    try:
        first, again, other = await tokens(1), await tokens(1), await tokens(2)
    finally:
        await policy.aclose()
        await judge.aclose()
    assert first == again
    assert first != other
    assert first[0] != first[1]  # group members get their own seeds


async def test_a_spent_time_budget_makes_the_step_the_last_and_still_evaluates(
        stack, tmp_path) -> None:
    """train.max_train_seconds: the step that crosses the budget ends the run (a machine
    slower than planned gets fewer steps, never a run past its bound), and the final eval
    still runs after it, so the before/after comparison stands."""

    config = RunConfig.model_validate(stack.run_config(
        tmp_path, name="budget", steps=5, max_train_seconds=0.001,
        eval={"every": 10}))  # due at step 0 and at step 5, not at step 1 by itself
    outcome = await Trainer(config).run()
    assert outcome.steps_done == 1 and not outcome.stopped_early
    assert [h["step"] for h in _rows(config.run_dir / "metrics.jsonl")] == [1]
    assert [e["step"] for e in _rows(config.run_dir / "evals.jsonl")] == [0, 1]
    report = json.loads((config.run_dir / "report.json").read_text())
    assert report["steps_done"] == 1 and report["steps_planned"] == 5
