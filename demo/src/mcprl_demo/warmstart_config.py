"""The warm-start recipe's configuration (``configs/warmstart*.yaml``), validated once.

Pydantic models (unknown keys and wrong types are errors that name the field); the SFT
hyper-parameters are :class:`mcprl_demo.sft.SftSettings`, the dataclass the SFT stage takes.
The rollout settings (system prompt, turn and token limits, tool-output truncation) are NOT
repeated here: they are read from the demo's trainer config (``trainer_config``), so the
demonstrations are rendered exactly as the trainer will render the agent's rollouts.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    model_validator,
)

from mcprl_demo.sft import SftSettings


class ConfigError(ValueError):
    """The YAML names an unknown key or has a value of the wrong type."""


class _Section(BaseModel):
    """Unknown keys are errors; true/false must be YAML booleans (not "yes", not 1)."""

    model_config = ConfigDict(extra="forbid")


class BaseModelConfig(_Section):
    """The model SFT starts from."""

    path: Path = Path("models/tiny-learn")
    # Optional shape of a tiny model to build first (mcprl_inference.tiny_model.TinySpec
    # fields): lets a recipe try a size that has no named spec yet.
    spec: dict[str, int] | None = None


class ScenarioConfig(_Section):
    """The ``sql`` scenario set demonstrations and the held-out eval are drawn from."""

    n: int = 600
    seed: int = 0
    val_fraction: float = 0.2
    holdout_templates: StrictBool = False
    holdout_entities: StrictBool = True
    db_preset: str = "default"
    db_seed: int = 42  # the eval (and demo) database: the val split comes from it
    # Extra databases (same schema and names, other rows) whose scenarios train the expert
    # imitation: the same questions get other answers there, so the agent must read the
    # tool results instead of memorising answers. Their scenarios naming a val entity are
    # dropped (the val entities stay unseen).
    train_db_seeds: list[int] = Field(default_factory=list)
    include_eval_db_train: StrictBool = True  # also train on the eval database's train split
    exclude_val_entities: StrictBool = True  # drop extra-database scenarios naming a val entity


class ExpertConfig(_Section):
    noise: float = Field(0.0, ge=0, le=1)  # share of demonstrations made wrong on purpose
    # corrupt: the result is read, then the answer copied wrong | guess: no run_query, the
    # answer is made up (one early decision that rewards separate: RL's easiest fix)
    noise_kind: Literal["corrupt", "guess"] = "corrupt"
    concurrency: int = 4
    include_wrong: StrictBool = False  # also train on demonstrations the judge marks wrong
    number_style: Literal["raw", "rounded"] = "raw"  # raw: copied as the result shows them


class EvalConfig(_Section):
    max_scenarios: int = 60  # held-out (val) scenarios evaluated
    concurrency: int = 4
    temperature: float = 0.0
    base_too: StrictBool = True  # also evaluate the base model (the "before SFT" number)
    max_turns: int = 0  # 0: the trainer config's (shorter only to bound a smoke test)
    max_tokens_per_turn: int = 0  # 0: the trainer config's


class WarmStartConfig(_Section):
    seed: int = 0
    work_dir: Path = Path("data/warmstart")
    output_dir: Path = Path("models/warm-start")
    trainer_config: Path = Path("configs/demo.yaml")
    base: BaseModelConfig = Field(default_factory=BaseModelConfig)
    scenarios: ScenarioConfig = Field(default_factory=ScenarioConfig)
    expert: ExpertConfig = Field(default_factory=ExpertConfig)
    sft: SftSettings = Field(default_factory=SftSettings)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @model_validator(mode="before")
    @classmethod
    def _empty_sections(cls, data: Any) -> Any:
        """A section written as ``sft:`` with nothing under it (None) means its defaults."""

        if isinstance(data, dict):
            sections = ("base", "scenarios", "expert", "sft", "eval")
            return {k: {} if v is None and k in sections else v for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _sft_steps(self) -> WarmStartConfig:
        if self.sft.steps < 0:
            raise ValueError("sft.steps must be >= 0")
        return self

    @property
    def set_id(self) -> str:
        s = self.scenarios
        hold = ("t" if s.holdout_templates else "") + ("e" if s.holdout_entities else "")
        dbs = "-".join(str(x) for x in s.train_db_seeds)
        if len(s.train_db_seeds) > 6:  # keep the folder name short: count + digest
            dbs = f"{len(s.train_db_seeds)}x" + hashlib.sha1(dbs.encode()).hexdigest()[:6]
        return (f"sql-{s.db_preset}{s.db_seed}-n{s.n}-s{s.seed}" + (f"-h{hold}" if hold else "")
                + (f"-db{dbs}" if dbs else "") + ("" if s.include_eval_db_train else "-x")
                + ("" if s.exclude_val_entities else "-all"))

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def load_warmstart_config(path: Path | str | None,
                          overrides: dict[str, Any] | None = None) -> WarmStartConfig:
    data: dict[str, Any] = {}
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the config must be a YAML mapping")
        data = loaded
    for dotted, value in (overrides or {}).items():
        node = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    try:
        return WarmStartConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(str(exc)) from None


def trainer_rollout_section(path: Path) -> dict[str, Any]:
    """The ``trainer.rollout`` section of the demo config (where the trainer reads it)."""

    data = yaml.safe_load(Path(path).read_text()) or {}
    trainer = data.get("trainer", data)
    return dict(trainer.get("rollout") or {})
