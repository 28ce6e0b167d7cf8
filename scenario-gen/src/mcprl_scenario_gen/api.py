"""Wire models of the scenario-gen HTTP API (pydantic only, no logic)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
)

from mcprl_common.wire import Scenario
from mcprl_scenario_gen.store import StoredManifest


class CreateScenarioSetRequest(BaseModel):
    """``POST /v1/scenario-sets``: what to generate from which MCP server."""

    # Strict scalars (no "50" for n, no false for a number), as the OpenAPI document says;
    # difficulty_mix stays lax: JSON object keys are strings ("1"), its keys integers.
    model_config = ConfigDict(extra="forbid")

    mcp_url: str | None = Field(
        None, description="MCP endpoint, e.g. http://127.0.0.1:8903/mcp (Streamable HTTP) or "
        ".../sse (SSE); default: the service's MCP_URL.", min_length=1, max_length=2000)
    auth_token: SecretStr | None = Field(None, description="Bearer token for the MCP server; "
                                         "never stored or logged.")
    transport: Literal["auto", "http", "sse"] = Field(
        "auto", description="MCP transport; auto picks SSE for URLs ending in /sse.")
    strategy: str = Field("sql", description="'sql' (verifiable, needs list_tables/"
                          "describe_table/run_query) or 'llm' (written by the generator model).")
    n: StrictInt = Field(50, ge=1, description="Scenarios to generate (train + val).")
    val_fraction: StrictFloat = Field(0.2, ge=0.0, le=0.9, description="Share that goes to val.")
    seed: StrictInt = Field(0, ge=0, description="Seed: same server data + seed give the same set "
                      "(sql strategy).")
    difficulty_mix: dict[int, float] | None = Field(
        None, description="Relative weight per difficulty 1-5, e.g. {\"1\": 1, \"3\": 2}; "
        "uniform when absent.")
    holdout_templates: StrictBool = Field(False, description="No template in both train and val.")
    holdout_entities: StrictBool = Field(False, description="No entity (department, year, ...) in "
                                   "both train and val.")
    model: str | None = Field(None, description="Generator model override (llm strategy).",
                              max_length=200)
    json_schema: Literal["auto", "on", "off"] | None = Field(
        None, description="Structured output of the generator: on, off (prompt + extract + "
        "repair) or auto; default from SCENARIO_GEN_GENERATOR_JSON_SCHEMA.")

    @field_validator("difficulty_mix")
    @classmethod
    def _mix(cls, value: dict[int, float] | None) -> dict[int, float] | None:
        if value is None:
            return None
        bad = [k for k in value if k not in range(1, 6)]
        if bad:
            raise ValueError(f"difficulty keys must be 1-5, got {bad}")
        if any(v < 0 for v in value.values()) or sum(value.values()) <= 0:
            raise ValueError("weights must be >= 0 with a positive sum")
        return value


class Links(BaseModel):
    self: str
    scenarios_train: str
    scenarios_val: str


class ScenarioSetCreated(BaseModel):
    id: str
    status: str
    links: Links


class ScenarioSetStatus(BaseModel):
    """``GET /v1/scenario-sets/{id}``: status, live progress and the manifest."""

    id: str
    status: str
    progress: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    manifest: StoredManifest


class ScenarioSetList(BaseModel):
    object: Literal["list"] = "list"
    data: list[StoredManifest]


class ScenarioList(BaseModel):
    """``GET /v1/scenario-sets/{id}/scenarios``: one split, full scenarios or ART's shape."""

    object: Literal["list"] = "list"
    set_id: str
    split: Literal["train", "val"]
    status: str
    count: int
    data: list[Scenario] | list[dict[str, Any]]
