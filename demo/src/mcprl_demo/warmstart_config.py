"""The warm-start recipe's configuration (``configs/warmstart*.yaml``), validated once.

Plain dataclasses + PyYAML (no pydantic) so that the SFT stage can run on a bare GPU box.
The rollout settings (system prompt, turn and token limits, tool-output truncation) are NOT
repeated here: they are read from the demo's trainer config (``trainer_config``), so the
demonstrations are rendered exactly as the trainer will render the agent's rollouts.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mcprl_demo.sft import SftSettings


class ConfigError(ValueError):
    """The YAML names an unknown key or has a value of the wrong type."""


@dataclass
class BaseModelConfig:
    """The model SFT starts from."""

    path: Path = Path("models/tiny-learn")
    # Optional shape of a tiny model to build first (mcprl_inference.tiny_model.TinySpec
    # fields): lets a recipe try a size that has no named spec yet.
    spec: dict[str, int] | None = None


@dataclass
class ScenarioConfig:
    """The ``sql`` scenario set demonstrations and the held-out eval are drawn from."""

    n: int = 600
    seed: int = 0
    val_fraction: float = 0.2
    holdout_templates: bool = False
    holdout_entities: bool = True
    db_preset: str = "default"
    db_seed: int = 42  # the eval (and demo) database: the val split comes from it
    # Extra databases (same schema and names, other rows) whose scenarios train the expert
    # imitation: the same questions get other answers there, so the agent must read the
    # tool results instead of memorising answers. Their scenarios naming a val entity are
    # dropped (the val entities stay unseen).
    train_db_seeds: list = field(default_factory=list)
    include_eval_db_train: bool = True  # also train on the eval database's train split
    exclude_val_entities: bool = True  # drop extra-database scenarios naming a val entity


@dataclass
class ExpertConfig:
    noise: float = 0.0  # share of demonstrations made wrong on purpose
    # corrupt: the result is read, then the answer copied wrong | guess: no run_query, the
    # answer is made up (one early decision that rewards separate: RL's easiest fix)
    noise_kind: str = "corrupt"
    concurrency: int = 4
    include_wrong: bool = False  # also train on demonstrations the judge marks wrong
    number_style: str = "raw"  # raw: numbers copied as the result shows them | rounded


@dataclass
class EvalConfig:
    max_scenarios: int = 60  # held-out (val) scenarios evaluated
    concurrency: int = 4
    temperature: float = 0.0
    base_too: bool = True  # also evaluate the base model (the "before SFT" number)
    max_turns: int = 0  # 0: the trainer config's (shorter only to bound a smoke test)
    max_tokens_per_turn: int = 0  # 0: the trainer config's


@dataclass
class WarmStartConfig:
    seed: int = 0
    work_dir: Path = Path("data/warmstart")
    output_dir: Path = Path("models/warm-start")
    trainer_config: Path = Path("configs/demo.yaml")
    base: BaseModelConfig = field(default_factory=BaseModelConfig)
    scenarios: ScenarioConfig = field(default_factory=ScenarioConfig)
    expert: ExpertConfig = field(default_factory=ExpertConfig)
    sft: SftSettings = field(default_factory=SftSettings)
    eval: EvalConfig = field(default_factory=EvalConfig)

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
        return _plain(dataclasses.asdict(self))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where or 'config'}: unknown key(s) {unknown}; known: "
                          f"{sorted(fields)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        f = fields[name]
        key = f"{where}.{name}" if where else name
        default = (f.default_factory() if f.default_factory is not dataclasses.MISSING  # type: ignore[misc]
                   else f.default)
        if dataclasses.is_dataclass(default):
            kwargs[name] = _build(type(default), value or {}, key)
        elif isinstance(default, Path):
            kwargs[name] = Path(value)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{key}: expected true/false, got {value!r}")
            kwargs[name] = value
        elif isinstance(default, int | float) and not isinstance(default, bool):
            try:
                kwargs[name] = type(default)(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        elif isinstance(default, tuple):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


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
    config = _build(WarmStartConfig, data, "")
    if not 0 <= config.expert.noise <= 1:
        raise ConfigError("expert.noise must be in [0, 1]")
    if config.expert.noise_kind not in ("corrupt", "guess"):
        raise ConfigError(f"expert.noise_kind must be corrupt or guess, got "
                          f"{config.expert.noise_kind!r}")
    if config.expert.number_style not in ("raw", "rounded"):
        raise ConfigError("expert.number_style must be 'raw' or 'rounded'")
    if config.sft.steps < 0:
        raise ConfigError("sft.steps must be >= 0")
    return config


def trainer_rollout_section(path: Path) -> dict[str, Any]:
    """The ``trainer.rollout`` section of the demo config (where the trainer reads it)."""

    data = yaml.safe_load(Path(path).read_text()) or {}
    trainer = data.get("trainer", data)
    return dict(trainer.get("rollout") or {})
