"""The inventory example MCP server over real Streamable HTTP: reads agree with direct SQLite,
writes are validated and atomic, errors are MCP tool errors that say how to fix the call."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from mcprl_common.process import UvicornThread
from mcprl_example_inventory.app import create_app
from mcprl_example_inventory.db import generate
from mcprl_example_inventory.settings import InventorySettings

pytestmark = pytest.mark.timeout(60)


def _serve(settings: InventorySettings) -> UvicornThread:
    return UvicornThread(create_app(settings)).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    db = tmp_path_factory.mktemp("inv") / "inventory.db"
    srv = _serve(InventorySettings(db_path=db))
    try:
        yield f"{srv.url}/mcp", db
    finally:
        srv.stop()


def _sql(db: Path, query: str, *args: Any) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(query, args).fetchall()


async def _call(url: str, tool: str, args: dict[str, Any] | None = None,
                token: str | None = None) -> Any:
    transport = StreamableHttpTransport(url, auth=token) if token else url
    async with Client(transport) as client:
        return await client.call_tool(tool, args or {}, raise_on_error=False)


def call(url: str, tool: str, args: dict[str, Any] | None = None, **kw: Any) -> Any:
    return asyncio.run(_call(url, tool, args, **kw))


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def test_lists_its_tools_with_descriptions(server: tuple[str, Path]) -> None:
    async def tools() -> list:
        async with Client(server[0]) as client:
            return await client.list_tools()

    listed = {t.name: t for t in asyncio.run(tools())}
    assert set(listed) == {"list_warehouses", "list_categories", "search_items", "get_item",
                           "stock_level", "low_stock", "list_movements", "record_movement",
                           "transfer_stock"}
    for tool in listed.values():
        assert len(tool.description or "") > 30, tool.name
    assert "sku" in listed["get_item"].inputSchema["properties"]


def test_reads_agree_with_sqlite(server: tuple[str, Path]) -> None:
    url, db = server
    warehouses = call(url, "list_warehouses").structured_content["warehouses"]
    assert [w["code"] for w in warehouses] == [r[0] for r in _sql(
        db, "SELECT code FROM warehouses ORDER BY id")]
    for w in warehouses:
        (units,) = _sql(db, "SELECT COALESCE(SUM(s.quantity), 0) FROM stock s JOIN warehouses w "
                            "ON w.id = s.warehouse_id WHERE w.code = ?", w["code"])[0]
        assert w["units_in_stock"] == units

    sku, name = _sql(db, "SELECT sku, name FROM items WHERE category = 'tools' LIMIT 1")[0]
    item = call(url, "get_item", {"sku": sku.lower()}).structured_content  # case-insensitive
    assert item["name"] == name
    (total,) = _sql(db, "SELECT SUM(quantity) FROM stock WHERE sku = ?", sku)[0]
    assert item["units_in_stock"] == total == sum(s["quantity"] for s in item["stock"])
    level = call(url, "stock_level", {"sku": sku}).structured_content
    assert level["quantity"] == total

    found = call(url, "search_items", {"category": "tools", "limit": 5}).structured_content
    (n_tools,) = _sql(db, "SELECT count(*) FROM items WHERE category = 'tools'")[0]
    assert found["total"] == n_tools and len(found["items"]) == 5 and found["truncated"]

    low = call(url, "low_stock", {"limit": 100}).structured_content
    expected = _sql(db, "SELECT i.sku FROM items i LEFT JOIN stock s ON s.sku = i.sku "
                        "GROUP BY i.sku HAVING COALESCE(SUM(s.quantity), 0) < i.reorder_level")
    assert {i["sku"] for i in low["items"]} == {r[0] for r in expected}
    assert low["total"] > 0  # the generator leaves some items short, so the tool is useful

    moves = call(url, "list_movements", {"sku": sku, "limit": 3}).structured_content
    times = [m["created_at"] for m in moves["movements"]]
    assert times == sorted(times, reverse=True)


def test_ledger_explains_the_stock(server: tuple[str, Path]) -> None:
    """Sum of movements per (warehouse, item) equals the stock: the data is coherent."""

    _, db = server
    mismatches = _sql(db, """
        SELECT s.warehouse_id, s.sku FROM stock s
        LEFT JOIN (SELECT warehouse_id, sku, SUM(quantity) AS q FROM movements
                   GROUP BY warehouse_id, sku) m
          ON m.warehouse_id = s.warehouse_id AND m.sku = s.sku
        WHERE COALESCE(m.q, 0) != s.quantity""")
    assert mismatches == []


def test_bad_calls_are_tool_errors_that_help(server: tuple[str, Path]) -> None:
    url, _ = server
    cases = [
        ("get_item", {"sku": "NOPE-1"}, "search_items"),
        ("stock_level", {"sku": "TOO-0001", "warehouse": "Atlantis"}, "Valid warehouse codes"),
        ("search_items", {"category": "food"}, "Categories:"),
        ("list_movements", {"since": "last tuesday"}, "ISO date"),
        ("search_items", {"limit": 0}, "limit"),
        ("get_item", {}, "sku"),
    ]
    for tool, args, hint in cases:
        result = call(url, tool, args)
        assert result.is_error, (tool, args)
        assert hint in _text(result), (tool, _text(result))
    assert httpx.get(url.removesuffix("/mcp") + "/healthz").status_code == 200


def test_writes_are_validated_and_atomic(tmp_path: Path) -> None:
    db = tmp_path / "inventory.db"
    srv = _serve(InventorySettings(db_path=db))
    url = f"{srv.url}/mcp"
    try:
        wid, code, sku, have = _sql(db, "SELECT w.id, w.code, s.sku, s.quantity FROM stock s "
                                        "JOIN warehouses w ON w.id = s.warehouse_id "
                                        "WHERE s.quantity > 20 ORDER BY s.sku LIMIT 1")[0]
        before = _sql(db, "SELECT count(*) FROM movements")[0][0]

        refused = call(url, "record_movement", {"sku": sku, "warehouse": code, "kind": "shipment",
                                                "quantity": have + 1, "reference": "SO-1"})
        assert refused.is_error and "Not enough stock" in _text(refused)
        for bad in ({"quantity": -5}, {"quantity": 0}, {"reference": ""}):
            args = {"sku": sku, "warehouse": code, "kind": "receipt", "quantity": 5,
                    "reference": "PO-1", **bad}
            assert call(url, "record_movement", args).is_error, bad
        assert _sql(db, "SELECT count(*) FROM movements")[0][0] == before  # nothing written

        done = call(url, "record_movement", {"sku": sku, "warehouse": code, "kind": "shipment",
                                             "quantity": 20, "reference": "SO-2"})
        assert not done.is_error and done.structured_content["stock_after"] == have - 20
        assert _sql(db, "SELECT quantity FROM stock WHERE sku = ? AND warehouse_id = ?",
                    sku, wid)[0][0] == have - 20

        other = _sql(db, "SELECT code FROM warehouses WHERE id != ? LIMIT 1", wid)[0][0]
        moved = call(url, "transfer_stock", {"sku": sku, "from_warehouse": code,
                                             "to_warehouse": other, "quantity": have - 20 + 1,
                                             "reference": "TR-1"})
        assert moved.is_error  # more than is left: neither side changes
        moved = call(url, "transfer_stock", {"sku": sku, "from_warehouse": code,
                                             "to_warehouse": other, "quantity": 3,
                                             "reference": "TR-2"})
        assert not moved.is_error
        legs = _sql(db, "SELECT kind, quantity FROM movements WHERE reference = 'TR-2' "
                        "ORDER BY kind")
        assert legs == [("transfer_in", 3), ("transfer_out", -3)]
        assert _sql(db, "SELECT count(*) FROM movements")[0][0] == before + 3
    finally:
        srv.stop()


def test_concurrent_shipments_never_oversell(tmp_path: Path) -> None:
    db = tmp_path / "inventory.db"
    srv = _serve(InventorySettings(db_path=db))
    url = f"{srv.url}/mcp"
    try:
        code, sku, have = _sql(db, "SELECT w.code, s.sku, s.quantity FROM stock s "
                                   "JOIN warehouses w ON w.id = s.warehouse_id "
                                   "WHERE s.quantity BETWEEN 5 AND 40 LIMIT 1")[0]
        args = {"sku": sku, "warehouse": code, "kind": "shipment", "quantity": 1}

        async def ship_all() -> list[Any]:
            async with Client(url) as client:
                return await asyncio.gather(*[
                    client.call_tool("record_movement", {**args, "reference": f"SO-{i}"},
                                     raise_on_error=False) for i in range(have + 5)])

        results = asyncio.run(ship_all())
        assert sum(not r.is_error for r in results) == have
        assert sum(r.is_error for r in results) == 5
        assert _sql(db, "SELECT quantity FROM stock s JOIN warehouses w ON w.id = "
                        "s.warehouse_id WHERE s.sku = ? AND w.code = ?", sku, code)[0][0] == 0
    finally:
        srv.stop()


def test_read_only_mode_and_bearer_token(tmp_path: Path) -> None:
    srv = _serve(InventorySettings(db_path=tmp_path / "inv.db", allow_writes=False,
                                   auth_token="s3cret"))
    url = f"{srv.url}/mcp"
    try:
        assert httpx.post(url, json={}, timeout=5).status_code == 401
        assert httpx.get(f"{srv.url}/healthz").status_code == 200  # probes stay open

        async def names() -> set[str]:
            async with Client(StreamableHttpTransport(url, auth="s3cret")) as client:
                return {t.name for t in await client.list_tools()}

        tools = asyncio.run(names())
        assert "search_items" in tools
        assert not tools & {"record_movement", "transfer_stock"}
    finally:
        srv.stop()


def test_generation_is_deterministic(tmp_path: Path) -> None:
    def digest(path: Path) -> str:
        with sqlite3.connect(path) as conn:
            dump = "\n".join(conn.iterdump())
        return hashlib.sha256(dump.encode()).hexdigest()

    generate(tmp_path / "a.db", seed=3, items=30, movements=200)
    generate(tmp_path / "b.db", seed=3, items=30, movements=200)
    generate(tmp_path / "c.db", seed=4, items=30, movements=200)
    assert digest(tmp_path / "a.db") == digest(tmp_path / "b.db")
    assert digest(tmp_path / "a.db") != digest(tmp_path / "c.db")
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically


def test_metrics_count_calls_by_tool_and_outcome(server: tuple[str, Path]) -> None:
    url, _ = server
    call(url, "list_categories")
    call(url, "get_item", {"sku": "NOPE-2"})
    text = httpx.get(url.removesuffix("/mcp") + "/metrics").text
    assert 'mcprl_mcp_tool_calls_total{outcome="ok",tool="list_categories"}' in text
    assert 'mcprl_mcp_tool_calls_total{outcome="error",tool="get_item"}' in text
    assert "mcprl_mcp_tool_call_duration_seconds_bucket" in text
    assert "mcprl_http_requests_total" in text
