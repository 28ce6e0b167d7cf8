"""What a local stack runs: which services, on which ports, with which model.

Read from ``STACK_*`` variables plus the services' own names where they exist (a port is
``MCP_PORT``, ``JUDGE_PORT`` ..., the model ``INFERENCE_MODEL``, an external MCP server
``MCP_URL``), so ``make stack`` honours the same ``.env`` settings as compose.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mcprl_common.settings import CsvList
from mcprl_stack.services import DEFAULT_SERVICES, SERVICES


class StackSettings(BaseSettings):
    """One local stack. ``StackSettings()`` reads the environment; tests pass values."""

    model_config = SettingsConfigDict(env_prefix="STACK_", extra="ignore", env_file=None,
                                      populate_by_name=True)

    services: CsvList = Field(
        default_factory=lambda: list(DEFAULT_SERVICES),
        description="Services to run, comma-separated (mcp-server, inventory-mcp, inference, "
        "scenario-gen, judge, trainer). A dependency left out is expected elsewhere.",
    )
    host: str = Field("127.0.0.1", description="Interface every service binds.")
    ports: dict[str, int] = Field(
        default_factory=dict,
        description="Port per service name (JSON); 0 picks a free port. Default: the "
        "service's own <PREFIX>PORT variable (MCP_PORT ...), else its usual port (8903 ...).",
    )
    model: str = Field(
        "models/tiny-learn",
        description="Model the inference engine serves and the trainer trains: a local path or "
        "a HF id. Unset: INFERENCE_MODEL, else models/tiny-learn.",
    )
    mcp: Literal["mcp-server", "inventory-mcp"] = Field(
        "mcp-server", description="Which local MCP server MCP_URL points at."
    )
    mcp_url: str | None = Field(
        None, description="An external MCP server for the pipeline (Streamable HTTP URL); "
        "no local MCP server is needed then. Unset: MCP_URL, else the local server's URL.",
    )
    runs_dir: Path = Field(
        Path("runs/stack"), description="Logs (logs/*.log), data (DB, scenario sets, judge "
        "cache) and training runs of the stack live here.",
    )
    train_config: Path | None = Field(
        None, description="Trainer run config (YAML); with 'trainer' in services the stack "
        "runs `mcprl-train --config FILE` once the other services are up.",
    )
    health_timeout_s: float = Field(
        300.0, gt=0, description="How long one service may take to become healthy."
    )
    stop_timeout_s: float = Field(
        20.0, gt=0, description="SIGTERM grace per service before SIGKILL."
    )
    inherit_env: bool = Field(
        True, description="Let the caller's environment override the stack's wiring defaults "
        "(e.g. JUDGE_BASE_URL pointing at a hosted judge). Ports and hosts always come from "
        "this config.",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment for every service (JSON); wins "
        "over everything else.",
    )

    @model_validator(mode="after")
    def _known(self) -> StackSettings:
        unknown = [n for n in [*self.services, *self.ports] if n not in SERVICES]
        if unknown:
            raise ValueError(f"unknown service(s) {unknown}; known: {', '.join(SERVICES)}")
        if "trainer" in self.services and self.train_config is None:
            raise ValueError("the trainer needs train_config (STACK_TRAIN_CONFIG or "
                             "--train-config FILE)")
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object
                 ) -> StackSettings:
        """Like ``StackSettings()``, plus the services' own variables where no ``STACK_*``
        variable or override says otherwise: ``<PREFIX>PORT``, ``INFERENCE_MODEL``,
        ``MCP_URL``."""

        environ = os.environ if environ is None else environ
        probe = cls(**overrides)
        given = probe.model_fields_set
        extra: dict[str, object] = {}
        ports = {spec.name: int(environ[spec.port_env]) for spec in SERVICES.values()
                 if environ.get(spec.port_env, "").strip().isdigit()}
        if ports:
            extra["ports"] = {**ports, **probe.ports} if "ports" in given else ports
        if "model" not in given and environ.get("INFERENCE_MODEL"):
            extra["model"] = environ["INFERENCE_MODEL"]
        if "mcp_url" not in given and environ.get("MCP_URL"):
            extra["mcp_url"] = environ["MCP_URL"]
        return cls(**{**overrides, **extra}) if extra else probe

    def port_of(self, name: str) -> int:
        return self.ports.get(name, SERVICES[name].default_port)

