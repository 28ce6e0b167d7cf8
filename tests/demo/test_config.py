"""The demo's and the warm start's configs: validation, overrides, the hosted-judge switch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mcprl_demo.config import load_demo_config
from mcprl_demo.warmstart_config import (
    ConfigError,
    load_warmstart_config,
    trainer_rollout_section,
)
from mcprl_trainer.config import RolloutConfig, RunConfig

pytestmark = pytest.mark.timeout(30)
REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo.yaml"
WARM = REPO / "configs" / "warmstart.yaml"
DEMO_AGENT = REPO / "configs" / "warmstart-demo.yaml"


def test_shipped_configs_validate() -> None:
    loaded = load_demo_config(DEMO, env={})
    assert not loaded.hosted and loaded.strategy == "sql"
    # The trainer section is a valid run config once the demo fills in the wiring.
    run = RunConfig.model_validate({**loaded.trainer, "model": "m",
                                    "scenarios": {"url": "http://x", "set_id": "s"}})
    assert run.reward.mode == "verifiable"
    # The demo's before/after: greedy, one rollout per val scenario, at least 64 of them
    # (64 x 0.33 of the generated set), within a wall-clock budget of the steps.
    assert run.eval.temperature == 0 and run.eval.samples == 1
    assert run.eval.max_scenarios >= 64 and loaded.demo.scenarios * loaded.demo.val_fraction >= 64
    assert run.max_train_seconds is not None and run.max_train_seconds <= 600
    model = REPO / loaded.demo.model
    assert (model / "config.json").exists() and (model / "model.safetensors").exists()
    # the careless agent is an adapter on that base, which RL trains further
    adapter = REPO / run.lora.init_adapter
    assert (adapter / "adapter_config.json").exists()
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == run.lora.r
    for recipe in (WARM, DEMO_AGENT):
        warm = load_warmstart_config(recipe)
        assert warm.trainer_config == Path("configs/demo.yaml")
        # The demonstrations are rendered with exactly the demo's rollout settings.
        ro = RolloutConfig(**trainer_rollout_section(REPO / warm.trainer_config))
        assert _rendering(ro) == _rendering(run.rollout)
    careless = load_warmstart_config(DEMO_AGENT)
    assert careless.output_dir == run.lora.init_adapter
    assert careless.base.path == Path(loaded.demo.model) and careless.sft.lora_r == run.lora.r


def _rendering(ro: RolloutConfig) -> dict:
    """What decides the tokens of a rollout (not how many run at once or how they sample)."""

    return ro.model_dump(exclude={"temperature", "top_p", "concurrency"})


def test_quick_and_overrides(tmp_path: Path) -> None:
    loaded = load_demo_config(DEMO, quick=True, env={},
                              overrides={"trainer.group_size": 8, "demo.seed": 3})
    assert loaded.trainer["steps"] == 2 and loaded.demo.scenarios == 24
    assert loaded.trainer["group_size"] == 8 and loaded.demo.seed == 3
    with pytest.raises(ValueError, match="scenarios"):
        load_demo_config(DEMO, env={}, overrides={"demo.scenarios": 1})
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"demo": {"no_such_key": 1}, "trainer": {}}))
    with pytest.raises(ValueError, match="no_such_key"):
        load_demo_config(bad, env={})


def test_hosted_judge_switches_to_ruler_and_llm_scenarios() -> None:
    env = {"JUDGE_BASE_URL": "https://judge.example/v1", "JUDGE_API_KEY": "sk-test-123456"}
    loaded = load_demo_config(DEMO, env=env)
    assert loaded.hosted and loaded.strategy == "llm"
    assert loaded.trainer["reward"]["mode"] == "ruler"
    assert loaded.trainer["eval"]["success_threshold"] == pytest.approx(0.7)
    sql = load_demo_config(DEMO, env=env, overrides={"demo.hosted.strategy": "sql"})
    assert sql.strategy == "sql" and sql.trainer["reward"]["mode"] == "weighted"
    # A URL without a key is not a hosted judge.
    assert not load_demo_config(DEMO, env={"JUDGE_BASE_URL": "https://x/v1"}).hosted


def test_warmstart_config_rejects_unknown_keys_and_bad_values(tmp_path: Path) -> None:
    cfg = tmp_path / "w.yaml"
    cfg.write_text(yaml.safe_dump({"sft": {"stepz": 3}}))
    with pytest.raises(ConfigError, match="stepz"):
        load_warmstart_config(cfg)
    with pytest.raises(ConfigError, match="noise"):
        load_warmstart_config(None, {"expert.noise": 2})
    with pytest.raises(ConfigError, match="number"):
        load_warmstart_config(None, {"sft.lr": "fast"})
    ok = load_warmstart_config(WARM, {"sft.steps": 7, "scenarios.train_db_seeds": [1]})
    assert ok.sft.steps == 7 and ok.scenarios.train_db_seeds == [1]
    assert ok.set_id != load_warmstart_config(WARM).set_id  # the set id names the data


def test_the_smollm2_demo_starts_from_the_shipped_adapter(monkeypatch) -> None:
    """A GPU box gets SmolLM2 + its warm-start adapter; CPUs the small model."""

    from mcprl_demo.config import default_config

    assert default_config(cuda=True) == Path("configs/smollm2.yaml")
    assert default_config(cuda=False) == Path("configs/demo.yaml")
    monkeypatch.chdir(REPO)  # the adapter path is relative to the repository, as in make demo
    loaded = load_demo_config(REPO / "configs" / "smollm2.yaml", env={})
    run = RunConfig.model_validate({**loaded.trainer, "model": loaded.demo.model,
                                    "scenarios": {"url": "http://x", "set_id": "s"}})
    assert run.lora.init_adapter == Path("demo/checkpoints/smollm2-warm-start")
    assert (run.lora.r, run.lora.alpha) == (8, 16)
    warm = load_warmstart_config(REPO / "configs" / "warmstart-smollm2.yaml")
    assert warm.sft.lora_r == run.lora.r and warm.sft.init == "weights"
    assert RolloutConfig(**trainer_rollout_section(REPO / warm.trainer_config)) == run.rollout
