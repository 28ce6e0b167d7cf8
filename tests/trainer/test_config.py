"""The run config: YAML + env overrides, validated once, saved without secrets; the example
configs in configs/ are valid."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from mcprl_trainer.config import load_config, save_config

pytestmark = pytest.mark.timeout(30)

MINIMAL = {"model": "models/tiny-test", "scenarios": {"set_id": "s1", "dir": "data/sets"}}


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_defaults_follow_the_issue(tmp_path) -> None:
    cfg = load_config(_write(tmp_path, MINIMAL), env={})
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.target_modules) == (8, 16, "all-linear")
    assert cfg.train.lr == 1e-5 and cfg.train.kl_coef == 0.0
    assert cfg.train.skip_zero_variance and cfg.train.loss_aggregation == "token_mean"
    assert cfg.status.port == 8930
    assert cfg.train.max_staleness == 0  # synchronous unless asked
    assert load_config(_write(tmp_path, MINIMAL), env={"TRAINER_TRAIN__MAX_STALENESS": "1"}
                       ).train.max_staleness == 1
    assert cfg.served_base == "models/tiny-test" and cfg.served_adapter == "run"


def test_env_overrides_yaml(tmp_path) -> None:
    env = {
        "POLICY_BASE_URL": "http://engine:8000/v1", "POLICY_MODEL": "base",
        "MCP_URL": "http://mcp:8903/mcp", "JUDGE_URL": "http://judge:8920",
        "SCENARIO_GEN_URL": "http://sg:8910", "TRAINER_PORT": "9999",
        "TRAINER_STEPS": "20", "TRAINER_TRAIN__LR": "2e-5",
        "TRAINER_LORA__TARGET_MODULES": "[q_proj, v_proj]", "TRAINER_TRAIN__DEVICE": "cpu",
        "TRAINER_UNRELATED_THING": "ignored", "MCP_AUTH_TOKEN": "s3cret",
    }
    cfg = load_config(_write(tmp_path, {**MINIMAL, "steps": 3}), env=env)
    assert cfg.policy.base_url == "http://engine:8000/v1" and cfg.served_base == "base"
    assert cfg.mcp.url == "http://mcp:8903/mcp" and cfg.judge.url == "http://judge:8920"
    assert cfg.scenarios.url == "http://sg:8910" and cfg.status.port == 9999
    assert cfg.steps == 20 and cfg.train.lr == 2e-5 and cfg.train.device == "cpu"
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]
    # Saved into the run dir without the secret; it loads back to the same config.
    saved = save_config(cfg, tmp_path / "run")
    assert "s3cret" not in saved.read_text()
    again = load_config(saved, env={})
    assert again.steps == 20 and again.lora.target_modules == ["q_proj", "v_proj"]


def test_precedence_overrides_then_trainer_env_then_aliases_then_yaml(tmp_path,
                                                                     monkeypatch) -> None:
    from mcprl_trainer.config import RunConfig

    path = _write(tmp_path, {**MINIMAL, "steps": 3, "policy": {"base_url": "http://yaml/v1"},
                             "train": {"clip_eps_high": 0.3}})
    env = {"POLICY_BASE_URL": "http://alias/v1", "TRAINER_POLICY__BASE_URL": "http://t/v1",
           "TRAINER_STEPS": "5", "TRAINER_TRAIN__CLIP_EPS_HIGH": "null"}
    cfg = load_config(path, env=env, overrides={"steps": 9})
    assert (cfg.steps, cfg.policy.base_url, cfg.train.clip_eps_high) == (9, "http://t/v1", None)
    assert load_config(path, env={"POLICY_BASE_URL": "http://alias/v1"}).policy.base_url \
        == "http://alias/v1"
    assert load_config(path, env={"POLICY_BASE_URL": ""}).policy.base_url == "http://yaml/v1"
    monkeypatch.setenv("TRAINER_STEPS", "11")
    assert load_config(path).steps == 11  # the process environment when none is given
    # A config built from values reads no environment.
    assert RunConfig.model_validate(MINIMAL).steps == RunConfig(**MINIMAL).steps == 8


@pytest.mark.parametrize("bad, match", [
    ({"group_size": 1}, "group_size"),
    ({"train": {"loss_aggregation": "sum"}}, "loss_aggregation"),
    ({"train": {"lr": 0}}, "lr"),
    ({"rollout": {"max_tokens_per_turn": 9000, "max_context": 4096}}, "max_tokens_per_turn"),
    ({"scenarios": {"set_id": "s1"}}, "scenarios.dir"),
    ({"typo_field": 1}, "typo_field"),
    ({"name": "../escape"}, "name"),
    ({"train": {"max_staleness": 2}}, "max_staleness"),
    ({"train": {"max_staleness": 1}, "sleep_engine_during_train": True}, "max_staleness"),
])
def test_invalid_configs_are_rejected_with_the_field_named(tmp_path, bad, match) -> None:
    data = {**MINIMAL, **bad}
    with pytest.raises(ValidationError, match=match):
        load_config(_write(tmp_path, data), env={})


def test_example_configs_are_valid(repo_root) -> None:
    for name in ("tiny-cpu.yaml", "qwen2.5-3b.yaml"):
        cfg = load_config(repo_root / "configs" / name, env={})
        assert cfg.steps > 0 and cfg.group_size >= 2


def test_init_adapter_must_be_an_adapter(tmp_path) -> None:
    from mcprl_trainer.config import LoraSettings, RunConfig

    with pytest.raises(ValidationError, match=r"adapter_config\.json"):
        LoraSettings(init_adapter=tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")
    assert LoraSettings(init_adapter=tmp_path).init_adapter == tmp_path
    cfg = RunConfig.model_validate({"model": "m", "scenarios": {"url": "http://x", "set_id": "s"},
                                    "lora": {"init_adapter": str(tmp_path)},
                                    "train": {"kl_coef": 0.1}})  # KL to the warm start
    assert cfg.train.kl_coef == 0.1
