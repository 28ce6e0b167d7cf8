"""McpServerSettings of the company-db MCP server, read from ``MCP_*`` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from mcprl_common.settings import McpServiceSettings

Preset = Literal["default", "tutorial"]


class McpServerSettings(McpServiceSettings):
    """One place for every knob; ``McpServerSettings()`` reads the environment, tests pass
    values."""

    model_config = SettingsConfigDict(
        env_prefix="MCP_", extra="ignore", env_file=None, populate_by_name=True
    )

    port: int = Field(8903, ge=0, le=65535, description="TCP port to listen on (0: any free).")
    db_path: Path = Field(
        Path("data/company.db"),
        description="SQLite file of the company database; created (atomically) on first start "
        "if missing, never modified afterwards.",
    )
    db_preset: Preset = Field(
        "default",
        description="Content used when the database is created: 'default' (8 departments, "
        "~150 employees, ~40 projects, seeded) or 'tutorial' (the tutorial's exact 5/15/8 rows).",
    )
    db_seed: int = Field(
        42, description="Seed of the deterministic generator for the 'default' preset."
    )
    query_timeout_s: float = Field(
        5.0, gt=0, le=600, description="Wall-clock limit of one query; longer ones are stopped."
    )
    max_rows: int = Field(
        1000, ge=1, description="Rows returned at most by run_query; more marks 'truncated'."
    )
    max_result_bytes: int = Field(
        256 * 1024,
        ge=1024,
        description="Size (bytes of JSON) of run_query's rows at most; more marks 'truncated'.",
    )
    max_sql_chars: int = Field(
        20_000, ge=16, description="Longest SQL text accepted by run_query."
    )
    max_concurrent_queries: int = Field(
        8, ge=1, description="Queries running at once (worker threads); others wait their turn."
    )
    host_origin_protection: bool = Field(
        True,
        description="Validate Host and Origin headers on /mcp, /sse and /messages "
        "(DNS-rebinding protection). Loopback names are always allowed.",
    )
    session_idle_timeout_s: float = Field(
        900.0, gt=0, description="Streamable HTTP sessions idle this long are closed."
    )
