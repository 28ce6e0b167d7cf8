"""Settings base classes shared by every service.

Each service defines one ``<Service>Settings`` class (``McpServerSettings``,
``InferenceSettings``, ``JudgeSettings``, ``ScenarioGenSettings``, ``InventorySettings``,
``StackSettings``) with its own env prefix (``MCP_``, ``INFERENCE_``, ``JUDGE_``, ...) that
inherits the fields below, so host, port and logging are configured the same way everywhere.

Names: ``*Settings`` is read from the environment (pydantic-settings); ``*Config`` is a model
of a config file (the trainer's run YAML ``RunConfig`` and its sections, the demo's YAML) or a
wire object (``RewardConfig``). Plain parameter holders that are neither (the trainer's
``RolloutSettings``, ``LossSettings``, ``LoraSettings``, the demo's ``SftSettings``) predate
this and are still to be renamed.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field, SecretStr
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from mcprl_common.retry import RetryPolicy


def split_csv(value: object) -> object:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; lists and other values pass through unchanged."""

    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def blank_to_none(value: object) -> object:
    """An unset-looking value (``None``, ``""``, spaces) -> ``None``, so ``X_TOKEN=`` means off."""

    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return value


# A list field read from one comma-separated variable (``MCP_ALLOWED_HOSTS=a,b``) rather than
# pydantic-settings' JSON for complex types: ``hosts: CsvList = Field(default_factory=list)``.
CsvList = Annotated[list[str], NoDecode, BeforeValidator(split_csv)]
# An optional secret (e.g. a bearer token) where an empty variable means "not set".
OptionalSecret = Annotated[SecretStr | None, BeforeValidator(blank_to_none)]


class ServiceSettings(BaseSettings):
    """Fields every HTTP service has. Subclasses set ``env_prefix`` and the default port."""

    model_config = SettingsConfigDict(extra="ignore", env_file=None, populate_by_name=True)

    host: str = Field("127.0.0.1", description="Interface to bind; 0.0.0.0 inside a container.")
    port: int = Field(0, ge=0, le=65535, description="TCP port to listen on.")
    log_level: str = Field("info", description="Log level: debug, info, warning, error.")
    log_json: bool = Field(True, description="Write logs as JSON lines (false: plain text).")
    graceful_shutdown_s: float = Field(
        10.0, ge=0, description="Seconds in-flight requests get to finish on SIGTERM."
    )


class McpServiceSettings(ServiceSettings):
    """What every MCP server of ours adds: the bearer token and the Host/Origin allow-lists of
    its MCP endpoints (company-db's ``MCP_``, the inventory example's ``INVENTORY_``)."""

    auth_token: OptionalSecret = Field(
        None, description="If set, the MCP endpoints require 'Authorization: Bearer <token>' "
        "(never logged); /healthz and /metrics stay open for probes and Prometheus.")
    allowed_hosts: CsvList = Field(
        default_factory=list, description="Extra Host header values accepted on the MCP "
        "endpoints (comma-separated; wildcards like '*.example.com' or 'mcp-server:*'; e.g. "
        "the compose service name). Loopback is always allowed.")
    allowed_origins: CsvList = Field(
        default_factory=list, description="Browser Origins accepted besides same-origin and "
        "loopback (comma-separated, e.g. 'https://app.example.com').")


class UpstreamSettings(BaseSettings):
    """An OpenAI-compatible upstream (OpenRouter, vLLM, our engine).

    Used with different prefixes: ``JUDGE_`` for the judge, ``GENERATOR_`` for
    scenario-gen and ``POLICY_`` for the trainer's rollout engine.
    """

    model_config = SettingsConfigDict(extra="ignore", env_file=None, populate_by_name=True)

    base_url: str = Field(
        "http://127.0.0.1:8000/v1", description="Base URL of the OpenAI-compatible API."
    )
    model: str = Field("Qwen/Qwen2.5-3B-Instruct", description="Model name sent upstream.")
    api_key: SecretStr = Field(
        SecretStr("EMPTY"), description="API key; never logged. 'EMPTY' for local engines."
    )
    timeout_s: float = Field(120.0, gt=0, description="Timeout of one upstream request.")
    max_retries: int = Field(3, ge=0, description="Retries on 429/5xx and connection errors.")
    backoff_initial_s: float = Field(0.5, gt=0, description="First retry delay after a "
                                     "429/5xx/connection error (doubles).")
    backoff_max_s: float = Field(8.0, gt=0, description="Longest single retry delay, also the "
                                 "cap on an upstream's Retry-After we honour.")
    max_concurrency: int = Field(8, ge=1, description="Upstream requests in flight at most.")

    def retry_policy(self) -> RetryPolicy:
        """The common retry loop's policy for calls to this upstream."""

        return RetryPolicy(self.max_retries, self.backoff_initial_s, self.backoff_max_s)


def upstream_settings(prefix: str, **overrides: object) -> UpstreamSettings:
    """Read an :class:`UpstreamSettings` from the environment under ``prefix`` (e.g. ``JUDGE_``)."""

    cls = type(
        f"{prefix.strip('_').title()}UpstreamSettings",
        (UpstreamSettings,),
        {"model_config": SettingsConfigDict(env_prefix=prefix, extra="ignore")},
    )
    return cls(**overrides)
