"""InventorySettings of the inventory example server (env prefix ``INVENTORY_``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from mcprl_common.settings import McpServiceSettings


class InventorySettings(McpServiceSettings):
    """Everything the inventory server reads from the environment."""

    model_config = SettingsConfigDict(env_prefix="INVENTORY_", extra="ignore")

    port: int = Field(8904, ge=0, le=65535, description="TCP port to listen on.")
    db_path: Path = Field(
        Path("./data/inventory.db"),
        description="SQLite file of the inventory; created and seeded on first start if missing.",
    )
    seed: int = Field(7, description="Seed of the deterministic generator that fills a new DB.")
    warehouses: int = Field(6, ge=1, le=50, description="Warehouses in a newly generated DB.")
    items: int = Field(120, ge=1, le=5000, description="Catalogue items in a newly generated DB.")
    movements: int = Field(
        1500, ge=0, le=200_000, description="Historical stock movements in a newly generated DB."
    )
    allow_writes: bool = Field(
        True,
        description="Expose the write tools (record_movement, transfer_stock). Turn off for "
        "training runs that need a state that never changes between rollouts.",
    )
    max_results: int = Field(
        100, ge=1, le=10_000, description="Rows one tool call returns at most (limit is capped)."
    )
    busy_timeout_s: float = Field(
        5.0, gt=0, description="How long a write waits for SQLite's lock before failing."
    )
