"""The run configuration: one documented pydantic model, validated once.

A run is described by one YAML file (see ``configs/``). Environment variables override it,
so the same file works on a laptop, in compose and on a GPU box:

- the project-wide names: ``POLICY_BASE_URL``, ``POLICY_BASE_URLS`` (several engine
  replicas, comma-separated), ``POLICY_MODEL``, ``POLICY_API_KEY``,
  ``MCP_URL``, ``MCP_AUTH_TOKEN``, ``JUDGE_URL``, ``SCENARIO_GEN_URL``, ``TRAINER_HOST``,
  ``TRAINER_PORT``;
- any field as ``TRAINER_<FIELD>`` or ``TRAINER_<SECTION>__<FIELD>`` (lists and mappings
  parsed as YAML, ``null`` as None; e.g. ``TRAINER_STEPS=20``, ``TRAINER_TRAIN__LR=2e-5``,
  ``TRAINER_LORA__TARGET_MODULES=[q_proj]``).

Highest first: explicit overrides (``--steps``), ``TRAINER_*``, the project-wide names, the
YAML file, the defaults. :class:`RunConfig` is a pydantic-settings class whose sources are
exactly these (:meth:`RunConfig.settings_customise_sources`) when :func:`load_config` builds
it; ``RunConfig(...)`` and ``RunConfig.model_validate`` read no environment (tests and
programs that build a config from values get those values).

The resolved config is written into the run directory (secrets blanked) so a run can be
reproduced from ``seed`` plus that file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)
from pydantic_settings.sources.types import EnvNoneType  # the "unset" marker env sources use

from mcprl_common.model_formats import get_model_format
from mcprl_common.wire import RewardConfig

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent that answers questions about a database by calling tools. "
    "The database works: first list the tables, then describe the ones you need, then run "
    "SQL queries. When you know the answer, call complete_task with the final answer only "
    "(a number, a name, or a comma-separated list)."
)

# Well-known environment variables shared with the rest of the stack -> config path.
ENV_ALIASES: dict[str, tuple[str, ...]] = {
    "POLICY_BASE_URL": ("policy", "base_url"),
    "POLICY_BASE_URLS": ("policy", "base_urls"),
    "POLICY_MODEL": ("policy", "model"),
    "POLICY_API_KEY": ("policy", "api_key"),
    "MCP_URL": ("mcp", "url"),
    "MCP_AUTH_TOKEN": ("mcp", "auth_token"),
    "JUDGE_URL": ("judge", "url"),
    "SCENARIO_GEN_URL": ("scenarios", "url"),
    "TRAINER_HOST": ("status", "host"),
    "TRAINER_PORT": ("status", "port"),
}
ENV_PREFIX = "TRAINER_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class PolicyConfig(_Section):
    """The inference engine that samples rollouts (vLLM or ours, OpenAI completions API)."""

    base_url: str = Field("http://127.0.0.1:8000/v1", description="Engine base URL, with /v1.")
    base_urls: list[str] = Field(
        default_factory=list, description="Several engine replicas (base URLs with /v1; "
        "POLICY_BASE_URLS=a,b): each group of rollouts goes to one of them, the one with the "
        "fewest open requests; every adapter is loaded into all. Empty = [base_url]."
    )
    replica_backoff_s: float = Field(
        1.0, gt=0, description="A replica that fails is left out this long, doubling with "
        "each failure in a row (up to replica_backoff_max_s), then tried again."
    )
    replica_backoff_max_s: float = Field(
        30.0, gt=0, description="Longest time a failed replica is left out."
    )
    model: str = Field("", description="Served name of the base model; empty = the model path.")
    adapter_name: str = Field(
        "", description="Name the trained LoRA is served under; empty = the run name."
    )
    api_key: SecretStr = Field(SecretStr("EMPTY"), description="Engine API key; never logged.")
    timeout_s: float = Field(300.0, gt=0, description="Timeout of one completion request.")
    max_retries: int = Field(3, ge=0, description="Retries on 5xx/connection errors.")
    engine_output_dir: str | None = Field(
        None, description="output_dir as the engine sees it (shared volume); None = same path."
    )

    @field_validator("base_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        if isinstance(value, str):  # POLICY_BASE_URLS=http://a:8000/v1,http://b:8000/v1
            return [u.strip() for u in value.replace(" ", ",").split(",") if u.strip()]
        return value

    @property
    def engine_urls(self) -> list[str]:
        """The replicas rollouts are spread over (one: ``base_url``)."""

        urls = list(dict.fromkeys(u.rstrip("/") for u in self.base_urls))
        return urls or [self.base_url]


class McpConfig(_Section):
    url: str = Field("http://127.0.0.1:8903/mcp", description="MCP server URL (Streamable HTTP).")
    auth_token: SecretStr | None = Field(None, description="Optional bearer token for the server.")
    timeout_s: float = Field(30.0, gt=0, description="Timeout of one MCP request (tool call).")


class JudgeConfig(_Section):
    url: str = Field("http://127.0.0.1:8920", description="Judge service URL (score-group API).")
    timeout_s: float = Field(300.0, gt=0, description="Timeout of one score-group request.")
    rubric: str | None = Field(None, description="Overrides the judge's default RULER rubric.")
    judge_model: str | None = Field(None, description="Overrides the judge's model.")


class ScenarioSourceConfig(_Section):
    """Where scenarios come from: scenario-gen over HTTP, or a local directory of sets."""

    url: str | None = Field(None, description="scenario-gen URL (GET /v1/scenario-sets/...).")
    dir: Path | None = Field(None, description="Local dir holding <set_id>/{train,val}.jsonl.")
    set_id: str = Field("", description="Scenario set id (required).")
    max_train: int | None = Field(None, ge=1, description="Use at most this many train scenarios.")
    max_val: int | None = Field(None, ge=1, description="Use at most this many val scenarios.")

    @model_validator(mode="after")
    def _one_source(self) -> ScenarioSourceConfig:
        if not self.set_id:
            raise ValueError("scenarios.set_id is required")
        if self.dir is None and not self.url:
            raise ValueError("set scenarios.dir (local sets) or scenarios.url (scenario-gen)")
        return self


class RolloutConfig(_Section):
    max_turns: int = Field(5, ge=1, description="Model turns per rollout at most.")
    max_tokens_per_turn: int = Field(256, ge=1, description="Sampled tokens per turn at most.")
    max_context: int = Field(4096, ge=64, description="Prompt + sampled tokens of a rollout.")
    min_tokens_per_turn: int = Field(
        16, ge=1, description="A turn starts only if this many tokens still fit in the context."
    )
    tool_output_max_tokens: int = Field(
        512, ge=16, description="Tool results longer than this (tokens) are truncated."
    )
    temperature: float = Field(1.0, ge=0, description="Sampling temperature of training rollouts.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of training rollouts.")
    concurrency: int = Field(8, ge=1, description="Rollouts in flight at most (one step).")
    system_prompt: str = Field(DEFAULT_SYSTEM_PROMPT, description="The agent's system prompt.")


class LoraSettings(_Section):
    r: int = Field(8, ge=1, description="LoRA rank.")
    alpha: int = Field(16, ge=1, description="LoRA alpha (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Modules to adapt; 'all-linear' = every linear layer."
    )
    init_adapter: Path | None = Field(
        None, description="A saved peft adapter to start from (a warm start, e.g. "
        "demo/checkpoints/smollm2-warm-start): trained further, and served in place of the "
        "bare base for step 0's rollouts and eval. Its own rank, alpha and modules win over "
        "r, alpha and target_modules."
    )

    @model_validator(mode="after")
    def _adapter_exists(self) -> LoraSettings:
        if self.init_adapter is not None and not (self.init_adapter
                                                  / "adapter_config.json").is_file():
            raise ValueError(f"lora.init_adapter {self.init_adapter} holds no "
                             "adapter_config.json (a peft adapter folder)")
        return self


class TrainConfig(_Section):
    loss: str = Field("grpo", description="Loss from the registry in mcprl_trainer.loss.")
    optimizer: Literal["adamw", "sgd"] = Field(
        "adamw", description="adamw, or sgd: an update linear in the gradient, so a reward "
        "that carries no signal (the shuffled control) moves the policy by zero on average; "
        "AdamW's per-coordinate normalisation does not keep that (bench/control_drift.py)."
    )
    lr: float = Field(1e-5, gt=0, description="Learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay (AdamW).")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas.")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum (optimizer: sgd).")
    warmup_steps: int = Field(0, ge=0, description="Linear LR warm-up (optimizer steps).")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping (global L2 norm).")
    clip_eps: float = Field(0.2, gt=0, description="PPO clip: ratio kept in [1-eps, 1+eps_high].")
    clip_eps_high: float | None = Field(None, gt=0, description="Upper clip; None = clip_eps.")
    kl_coef: float = Field(0.0, ge=0, description="KL(policy || reference) weight (k3); 0 = "
                           "off. The reference is the warm start (lora.init_adapter) if set, "
                           "else the base model.")
    loss_aggregation: Literal["token_mean", "seq_mean"] = Field(
        "token_mean", description="Mean over all tokens of the step, or per sequence first."
    )
    micro_batch_tokens: int = Field(
        4096, ge=64, description="Padded tokens per micro-batch (gradient accumulation)."
    )
    epochs_per_step: int = Field(1, ge=1, description="Optimizer steps on each step's batch.")
    skip_zero_variance: bool = Field(True, description="Drop groups whose rewards are all equal.")
    scale_advantages: bool = Field(True, description="Divide (r - mean) by (std + 1e-6).")
    shuffle_rewards: bool = Field(
        False, description="Control runs only (the shuffled-reward control of a learning "
        "experiment): permute the rewards within each group before advantages, seeded by "
        "(seed, step, group), so the reward distribution is unchanged but carries no signal "
        "about which rollout earned it (advantages.shuffled_group_rewards)."
    )
    device: str = Field("auto", description="'auto' (cuda if available), 'cpu', 'cuda:0'...")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Base weights dtype; auto = bf16 on GPU (with autocast), fp32 on CPU."
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations (GPU memory).")
    shared_prefix: bool = Field(
        False, description="Run the start all rows of a micro-batch share (system prompt, "
        "tools), or each group's prompt where it holds several groups, once and the rest "
        "from its KV cache (the packer keeps a group's rollouts together): same loss and "
        "gradients, less work when the prompt is long next to the turns. Not with "
        "gradient_checkpointing (a recomputed pass would append to the cache twice)."
    )
    lean_lora: bool = Field(
        True, description="LoRA linears add their product into the base output with one "
        "in-place addmm (mcprl_trainer.lora_forward): same math as peft's forward, fewer "
        "element-wise passes and no fp32 copy of each input under autocast. False = peft's."
    )
    liger_kernels: bool = Field(
        False, description="CUDA: Liger's Triton kernels for RMSNorm and SwiGLU in the "
        "trained model (needs the liger-kernel package): fewer kernels and less saved "
        "activation memory per layer, same math."
    )

    max_staleness: int = Field(
        0, ge=0, le=1, description="Rollouts overlapped with the update: 0 = synchronous "
        "(each step's rollouts sampled from the adapter of the step before, then the update); "
        "1 = step k+1's rollouts are collected while step k's update runs, from the adapter "
        "served when they started (one step off-policy; the GRPO ratio against the sampler's "
        "log-probs corrects for it). A batch more than this many updates older than the "
        "weights it would train is dropped and collected again (mcprl_trainer_stale_batches"
        "_total). Not with sleep_engine_during_train (the engine samples during the update)."
    )

    @model_validator(mode="after")
    def _prefix_without_checkpointing(self) -> TrainConfig:
        if self.shared_prefix and self.gradient_checkpointing:
            raise ValueError("train.shared_prefix cannot be combined with "
                             "train.gradient_checkpointing")
        return self


class EvalConfig(_Section):
    every: int = Field(5, ge=0, description="Eval every K steps (and before/after); 0 = never.")
    max_scenarios: int | None = Field(None, ge=1, description="Val scenarios used at most.")
    temperature: float = Field(0.0, ge=0, description="Eval sampling temperature (0 = greedy).")
    samples: int = Field(
        1, ge=1, description="Rollouts per val scenario (with temperature > 0: success is the "
        "mean over samples, the expected success of the sampled policy, less noisy than one)."
    )
    success_threshold: float = Field(
        1.0, ge=0, le=1, description="Score counted as success when no ground truth exists."
    )


class RetryConfig(_Section):
    """Riding out a service that is down or restarting: what failed is tried again with
    backoff for ``window_s`` before it is given up (a rollout is then dropped and counted)."""

    window_s: float = Field(
        90.0, ge=0, description="How long a rollout, a judge call, an adapter load or loading "
        "the scenarios is retried after a transient failure (no answer, dropped connection, "
        "5xx) of the engine, the MCP server, the judge or scenario-gen; 0 = only the HTTP "
        "client's own few retries."
    )
    backoff_max_s: float = Field(5.0, gt=0, description="Longest wait between two attempts.")


class StatusConfig(_Section):
    enabled: bool = Field(True, description="Serve /healthz, /metrics, /v1/status.")
    host: str = Field("127.0.0.1", description="Status server interface.")
    port: int = Field(8930, ge=0, le=65535, description="Status server port (0 = any free).")


class RunConfig(BaseSettings):
    """Everything a training run needs, in one place."""

    model_config = SettingsConfigDict(
        extra="forbid", validate_assignment=True, env_prefix=ENV_PREFIX,
        env_nested_delimiter="__", env_parse_none_str="null",
    )

    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="Run name.")
    seed: int = Field(0, description="Seeds adapter init, scenario order and sampling seeds.")
    output_dir: Path = Field(Path("runs"), description="Runs live in <output_dir>/<name>/.")
    model: str = Field(..., description="Base model: local path or HF id (same as the engine's).")
    tokenizer: str | None = Field(None, description="Tokenizer path/id; None = the model's.")
    model_format: str = Field(
        "hermes", description="The model's chat format (tool calls, stop tokens, template): a "
        "name in mcprl_common.model_formats, as the engine's --tool-call-parser."
    )
    steps: int = Field(8, ge=0, description="GRPO steps of the run.")
    max_train_seconds: float | None = Field(
        None, gt=0, description="Wall-clock budget of the steps (from the first step's start, "
        "evals between steps included): the step that crosses it is the last, then the final "
        "eval runs. Bounds a run on a machine of unknown speed (the CPU demo); None = steps "
        "alone decide."
    )
    group_size: int = Field(4, ge=2, description="Rollouts per scenario (G).")
    groups_per_step: int = Field(2, ge=1, description="Scenarios per step (S).")
    sleep_engine_during_train: bool = Field(
        False, description="POST /sleep to a same-GPU engine before training, /wake_up after."
    )
    keep_checkpoints: int = Field(0, ge=0, description="Keep the last N checkpoints; 0 = all.")
    keep_checkpoints_every: int = Field(
        0, ge=0, description="Also keep every K-th step's checkpoint whatever keep_checkpoints "
        "says (adapters for a learning curve evaluated afterwards); 0 = off."
    )
    background_checkpoints: bool = Field(
        True, description="Write each step's checkpoint off the critical path: the adapter "
        "(what the engine loads) at once, then the optimizer, scheduler, RNG and state.json "
        "from a host copy in a writer thread, at most one in flight (the next save, and the "
        "run's end, wait for it and raise its error). A crash before the write ends (it runs "
        "beside the next step's rollouts, typically well under a second) resumes from the "
        "step before: a step directory without state.json is not a checkpoint. On by "
        "default: the resumable state is the same, only when it reaches the disk differs. "
        "Several trainer ranks save synchronously (dcp's save is "
        "collective). false = the whole checkpoint before publishing, as before."
    )
    publish_dir: str = Field(
        "off", description="Where each step's adapter is written for the engines to load "
        "when they run on this host: a tmpfs folder, so publishing skips the run volume's "
        "file system (the checkpoint writer copies the files into checkpoints/step-N in the "
        "background; resume is unchanged). off (default) = load from the checkpoint folder: "
        "on a local disk the page cache absorbs the write, and tmpfs measured no faster "
        "(bench/bench_publish.py, docs/benchmarks.md); auto = /dev/shm where it exists and is "
        "writable, for a run volume that is slow to write (network storage); or an absolute "
        "path. Only the "
        "current and previous adapters are kept there, and the run's folder is removed when "
        "it ends. Not used (the checkpoint folder is) with policy.engine_output_dir, for "
        "replicas that are not on this host (their URL is not loopback or this host's name), "
        "with background_checkpoints off or several trainer ranks; a replica that answers "
        "404 for the path loads the checkpoint's copy instead, with a warning."
    )
    save_rollouts: bool = Field(True, description="Write each step's trajectories as JSONL.")
    reward: RewardConfig = Field(
        default_factory=RewardConfig, description="How the judge combines reward components."
    )
    policy: PolicyConfig = Field(
        default_factory=PolicyConfig, description="The engine that samples rollouts."
    )
    mcp: McpConfig = Field(default_factory=McpConfig, description="The MCP server under training.")
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="The judge service.")
    scenarios: ScenarioSourceConfig = Field(
        ..., description="Where the train/val scenarios come from (required)."
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="Limits and sampling of agent rollouts."
    )
    lora: LoraSettings = Field(default_factory=LoraSettings, description="The LoRA adapter.")
    train: TrainConfig = Field(
        default_factory=TrainConfig, description="Loss, optimizer and micro-batching."
    )
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Periodic evaluation.")
    status: StatusConfig = Field(
        default_factory=StatusConfig, description="Status server (/healthz, /metrics)."
    )
    retry: RetryConfig = Field(
        default_factory=RetryConfig, description="Retries while a service is down."
    )

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.name

    @property
    def served_base(self) -> str:
        return self.policy.model or self.model

    @property
    def served_adapter(self) -> str:
        return self.policy.adapter_name or self.name

    @field_validator("publish_dir")
    @classmethod
    def _publish_dir(cls, value: str) -> str:
        if value not in ("auto", "off") and not Path(value).is_absolute():
            raise ValueError(f"publish_dir must be auto, off or an absolute path, got {value!r}")
        return value

    @model_validator(mode="after")
    def _fits(self) -> RunConfig:
        get_model_format(self.model_format)  # a clear error on an unknown name
        ro = self.rollout
        if ro.max_tokens_per_turn > ro.max_context:
            raise ValueError("rollout.max_tokens_per_turn exceeds rollout.max_context")
        if ro.min_tokens_per_turn > ro.max_tokens_per_turn:
            raise ValueError("rollout.min_tokens_per_turn exceeds rollout.max_tokens_per_turn")
        if self.train.max_staleness > 0 and self.sleep_engine_during_train:
            raise ValueError("train.max_staleness > 0 overlaps rollouts with the update: it "
                             "cannot be combined with sleep_engine_during_train")
        return self

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Highest first: explicit values, ``TRAINER_*``, the project-wide names, the YAML
        file. Only :func:`load_config` reads the environment and the file: a config built
        from values (``RunConfig(...)``, ``model_validate``) holds those values alone."""

        request = _LOAD.get()
        if request is None:
            return (init_settings,)
        sources: list[PydanticBaseSettingsSource] = [
            init_settings, TrainerEnvSource(settings_cls, request.env),
            AliasEnvSource(settings_cls, request.env)]
        if request.path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=request.path))
        return tuple(sources)

    def dump_yaml(self) -> str:
        """The resolved config as YAML with secrets blanked (what goes into the run dir)."""

        data = self.model_dump(mode="json")
        data["policy"]["api_key"] = "***"
        if data["mcp"]["auth_token"] is not None:
            data["mcp"]["auth_token"] = "***"
        return yaml.safe_dump(data, sort_keys=False)


def set_path(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Set ``data[path[0]][path[1]]... = value``, creating the dicts on the way."""

    node = data
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[path[-1]] = value


_NULLS = ("null", "none", "~")


class TrainerEnvSource(EnvSettingsSource):
    """``TRAINER_<FIELD>`` / ``TRAINER_<SECTION>__<FIELD>`` from a given mapping (tests pass
    their own), with YAML instead of JSON for lists and mappings (``[q_proj, v_proj]``) and
    ``null``, ``none`` or ``~`` read as None."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        out: dict[str, str | None] = {}
        for name, value in self._environ.items():
            if value is not None and value.strip().lower() in _NULLS:
                value = EnvNoneType(value)
            out[name if self.case_sensitive else name.lower()] = value
        return out

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ValueError(f"{field_name}: not YAML: {exc}") from exc


class AliasEnvSource(InitSettingsSource):
    """The project-wide names (:data:`ENV_ALIASES`: ``POLICY_BASE_URL``, ``MCP_URL`` ...)
    that compose and the stack set for every service; an empty one is ignored."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        data: dict[str, Any] = {}
        for var, path in ENV_ALIASES.items():
            if environ.get(var):
                set_path(data, path, environ[var])
        super().__init__(settings_cls, data)


@dataclass(frozen=True)
class _LoadRequest:
    path: Path | None
    env: Mapping[str, str]


# What load_config asks RunConfig's sources to read (the YAML path and the environment).
_LOAD: ContextVar[_LoadRequest | None] = ContextVar("mcprl_trainer_load", default=None)


@contextmanager
def _reading(request: _LoadRequest) -> Iterator[None]:
    token = _LOAD.set(request)
    try:
        yield
    finally:
        _LOAD.reset(token)


def load_config(
    path: Path | str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> RunConfig:
    """Read YAML (if given), apply env then explicit overrides, validate once.

    Relative ``model``/``scenarios.dir``/``output_dir`` paths are resolved against the
    current directory, as a user typing the command expects.
    """

    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text()) or {}  # a missing file raises here
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: the config must be a YAML mapping")
    with _reading(_LoadRequest(None if path is None else Path(path),
                               os.environ if env is None else env)):
        return RunConfig(**dict(overrides or {}))


def save_config(config: RunConfig, run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / "config.yaml"
    out.write_text(config.dump_yaml())
    return out
