"""The demo's configuration (``configs/demo*.yaml``): a ``demo:`` section read here and a
``trainer:`` section that becomes the run config of ``mcprl-train``.

Two switches change what the same command does:

- hosted judge: with ``JUDGE_BASE_URL`` and ``JUDGE_API_KEY`` in the environment, the judge
  runs RULER against that endpoint and scenarios come from the ``llm`` strategy (its
  ``GENERATOR_*`` upstream defaults to the judge's);
- ``--model ID``: the engine serves and the trainer trains that model (a HF id or a path; on
  a GPU box device ``auto`` picks CUDA and bf16) instead of the shipped warm-start agent.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from mcprl_trainer.config import set_path

DEFAULT_CONFIG = Path("configs/demo.yaml")  # 2 CPU cores: the 5M warm start
GPU_CONFIG = Path("configs/smollm2.yaml")  # a CUDA GPU: SmolLM2-135M-Instruct + its warm start


def default_config(cuda: bool | None = None) -> Path:
    """The demo a machine gets without --config: SmolLM2 where a GPU makes it fast enough,
    the small from-scratch model on CPUs (SmolLM2's CPU figures: docs/benchmarks.md)."""

    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    return GPU_CONFIG if cuda else DEFAULT_CONFIG


class HostedConfig(BaseModel):
    """What changes when a hosted judge is configured (JUDGE_BASE_URL + JUDGE_API_KEY)."""

    model_config = ConfigDict(extra="forbid")

    strategy: Literal["llm", "sql"] = Field("llm", description="Scenario strategy then.")
    reward_mode: Literal["ruler", "weighted"] = Field(
        "ruler", description="Judge mode for `llm` scenarios (no ground truth); `sql` "
        "scenarios use `weighted` (RULER + verifiable).")
    success_threshold: float = Field(
        0.7, ge=0, le=1, description="RULER score counted as a success (no ground truth).")


class DemoConfig(BaseModel):
    """The ``demo:`` section."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("demo/checkpoints/warm-start",
                       description="Model served and trained: a path or a HF id.")
    scenarios: int = Field(48, ge=4, description="Scenarios generated (train + val).")
    val_fraction: float = Field(0.33, gt=0, lt=1, description="Share held out for eval.")
    holdout_entities: bool = Field(True, description="Val names entities train never does.")
    holdout_templates: bool = Field(False, description="Val uses templates train never does.")
    seed: int = Field(0, ge=0, description="Seeds the scenario set and the run.")
    db_preset: str = Field("default", description="MCP server database preset.")
    db_seed: int = Field(42, description="MCP server database seed (the warm start's eval DB).")
    output_dir: Path = Field(Path("runs/demo"), description="Logs, data, run and report.")
    health_timeout_s: float = Field(300.0, gt=0, description="Per service start-up.")
    scenario_timeout_s: float = Field(600.0, gt=0, description="Scenario generation at most.")
    run_timeout_s: float = Field(1800.0, gt=0, description="The trainer's run at most.")
    quick: dict[str, Any] = Field(default_factory=dict,
                                  description="Overrides applied by --quick (dotted keys).")
    hosted: HostedConfig = Field(default_factory=HostedConfig)


class LoadedConfig(BaseModel):
    demo: DemoConfig
    trainer: dict[str, Any]
    hosted: bool = False
    strategy: str = "sql"


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    set_path(data, tuple(dotted.split(".")), value)


def hosted_judge(env: Mapping[str, str]) -> bool:
    return bool(env.get("JUDGE_BASE_URL", "").strip() and env.get("JUDGE_API_KEY", "").strip())


def load_demo_config(
    path: Path | str = DEFAULT_CONFIG,
    *,
    quick: bool = False,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> LoadedConfig:
    """Read the YAML, apply ``quick`` then the dotted ``overrides`` (``demo.scenarios``,
    ``trainer.steps`` ...), and decide local vs hosted-judge mode from ``env``."""

    raw = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict) or not isinstance(raw.get("trainer", {}), dict):
        raise ValueError(f"{path}: expected a mapping with `demo:` and `trainer:` sections")
    data = copy.deepcopy(raw)
    data.setdefault("demo", {})
    data.setdefault("trainer", {})
    if quick:
        for key, value in (data["demo"].get("quick") or {}).items():
            _set(data, key, value)
    for key, value in (overrides or {}).items():
        _set(data, key, value)
    demo = DemoConfig.model_validate(data["demo"])
    env = os.environ if env is None else env
    hosted = hosted_judge(env)
    trainer = data["trainer"]
    strategy = "sql"
    if hosted:
        strategy = demo.hosted.strategy
        mode = "weighted" if strategy == "sql" else demo.hosted.reward_mode
        _set(trainer, "reward.mode", mode)
        if strategy == "llm":
            _set(trainer, "eval.success_threshold", demo.hosted.success_threshold)
    return LoadedConfig(demo=demo, trainer=trainer, hosted=hosted, strategy=strategy)
