"""ScenarioGenSettings of scenario-gen (env prefix ``SCENARIO_GEN_``).

The generator LLM is configured apart, under ``GENERATOR_`` (see
:func:`mcprl_common.settings.upstream_settings`), like every OpenAI-compatible upstream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from mcprl_common.settings import ServiceSettings

JsonSchemaMode = Literal["auto", "on", "off"]


class ScenarioGenSettings(ServiceSettings):
    """Everything the service and the CLI read from the environment."""

    model_config = SettingsConfigDict(env_prefix="SCENARIO_GEN_", extra="ignore")

    port: int = Field(8910, ge=0, le=65535, description="TCP port to listen on.")
    data_dir: Path = Field(
        Path("./data/scenarios"),
        description="Directory of the stored scenario sets (<set_id>/train.jsonl, val.jsonl, "
        "manifest.json); a volume in compose.",
    )
    default_mcp_url: str | None = Field(
        None, validation_alias=AliasChoices("SCENARIO_GEN_DEFAULT_MCP_URL", "MCP_URL"),
        description="MCP server used when a request names none (MCP_URL in the stack).",
    )
    default_mcp_auth_token: SecretStr | None = Field(
        None, validation_alias=AliasChoices("SCENARIO_GEN_DEFAULT_MCP_AUTH_TOKEN",
                                            "MCP_AUTH_TOKEN"),
        description="Bearer token for default_mcp_url (MCP_AUTH_TOKEN); never logged.",
    )
    max_scenarios: int = Field(
        5000, ge=1, description="Largest N one request may ask for; larger asks get a 400."
    )
    max_concurrent_jobs: int = Field(
        2, ge=1, description="Generations running at once; more wait in the queue."
    )
    max_queued_jobs: int = Field(
        16, ge=0, description="Generations waiting for a slot at most; beyond that POST gets 429."
    )
    mcp_timeout_s: float = Field(
        30.0, gt=0, description="Timeout of one MCP request (tool call, listing)."
    )
    mcp_connect_timeout_s: float = Field(
        10.0, gt=0, description="Timeout to connect to an MCP server and initialise the session."
    )
    generator_json_schema: JsonSchemaMode = Field(
        "auto",
        description="Structured output of the generator LLM: 'on' always sends response_format "
        "json_schema, 'off' never (prompt + extract + validate + retry), 'auto' tries it and "
        "switches to the fallback when the provider rejects response_format.",
    )
    llm_batch_size: int = Field(
        10, ge=1, le=50, description="Tasks asked of the generator LLM in one call."
    )
    llm_max_repairs: int = Field(
        2, ge=0, le=10,
        description="Retries of one batch with the validation error in the conversation.",
    )
    llm_max_failed_batches: int = Field(
        2, ge=1, description="Batches that may fail for good before the generation gives up."
    )
    llm_max_tokens: int = Field(
        3000, ge=64, description="max_tokens of one generator call."
    )
    llm_temperature: float = Field(
        1.0, ge=0, le=2, description="Sampling temperature of the generator (diversity)."
    )
    llm_task_max_chars: int = Field(
        400, ge=20, le=2000,
        description="maxLength of one task in the json_schema sent to the generator.",
    )
    llm_context_max_chars: int = Field(
        12000, ge=500,
        description="Characters of server description (tools, schemas, sample rows, "
        "resources) put in the generator prompt at most.",
    )
    sql_max_candidates: int = Field(
        4000, ge=10, description="Ground-truth queries the sql strategy runs at most per set."
    )
    near_duplicate_threshold: float = Field(
        0.85, gt=0, le=1,
        description="Token-set Jaccard similarity at or above which two free-text tasks count "
        "as near-duplicates (tasks that differ in a number never do).",
    )
    checkpoint_every_s: float = Field(
        5.0, ge=0, description="How often a running generation saves its candidates to disk."
    )

