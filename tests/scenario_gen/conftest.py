"""Fixtures of the scenario-gen tests: the real company-db MCP server on loopback, small
FastMCP servers of other shapes (no tools, no SQL tools), settings on a temp data dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastmcp import FastMCP

from mcprl_common.process import UvicornThread
from mcprl_mcp_server.loopback import serve_mcp
from mcprl_scenario_gen.settings import ScenarioGenSettings


@pytest.fixture(scope="module")
def company(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(mcp_url, db_path) of the real company-db server, default preset."""

    with serve_mcp(tmp_path_factory.mktemp("mcp")) as served:
        yield served


@pytest.fixture
def settings(tmp_path: Path) -> ScenarioGenSettings:
    return ScenarioGenSettings(data_dir=tmp_path / "scenarios", checkpoint_every_s=0.0,
                    mcp_connect_timeout_s=5.0, mcp_timeout_s=15.0)


def _inventory_like() -> FastMCP:
    """A server without SQL tools (the llm strategy's 'other servers' case)."""

    mcp = FastMCP("warehouse")

    @mcp.tool
    def list_warehouses() -> list[str]:
        """List warehouse codes."""
        return ["AMS-1", "BER-2"]

    @mcp.tool
    def stock_level(sku: str, warehouse: str) -> dict:
        """Units of one SKU in one warehouse."""
        return {"sku": sku, "warehouse": warehouse, "units": 12}

    @mcp.resource("docs://catalog")
    def catalog() -> str:
        """The product catalog."""
        return "SKU-1 red chair; SKU-2 blue table"

    return mcp


@pytest.fixture(scope="module")
def other_server() -> Iterator[str]:
    with UvicornThread(_inventory_like().http_app(path="/mcp")) as srv:
        yield f"{srv.url}/mcp"


@pytest.fixture(scope="module")
def empty_server() -> Iterator[str]:
    with UvicornThread(FastMCP("empty").http_app(path="/mcp")) as srv:
        yield f"{srv.url}/mcp"
