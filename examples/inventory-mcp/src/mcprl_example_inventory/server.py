"""The MCP tools of the inventory server and the FastMCP instance that serves them.

Tool failures raise ``ToolError`` so the client sees ``isError`` with a message that says
how to fix the call. Each call runs in a worker thread (SQLite is blocking) and is counted
under the same metric names as the company-db server (``mcprl_mcp_tool_calls_total``,
``mcprl_mcp_tool_call_duration_seconds``), so the dashboard's MCP row works whichever
server the pipeline points at.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, Literal

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.middleware import Middleware
from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import Field

from mcprl_common.metrics import LATENCY_BUCKETS_S
from mcprl_example_inventory.service import InventoryError, InventoryService

INSTRUCTIONS = (
    "Warehouse inventory of a hardware wholesaler: warehouses, a catalogue of items (SKUs), "
    "stock per warehouse and the ledger of stock movements. Start with list_warehouses or "
    "search_items to find codes and SKUs, then ask get_item, stock_level, low_stock or "
    "list_movements. Warehouses are named by code (e.g. ROT1) or city."
)

Sku = Annotated[str, Field(description="Item SKU such as 'TOO-0002' (find it with search_items).")]
Warehouse = Annotated[str, Field(description="Warehouse code such as 'ROT1', or its city.")]
Limit = Annotated[int, Field(description="Rows to return at most.", ge=1)]


class ToolMetrics(Middleware):
    """Counts every tool call by tool and outcome and times it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter("mcprl_mcp_tool_calls", "MCP tool calls by tool and outcome.",
                             ["tool", "outcome"], registry=registry)
        self.duration = Histogram("mcprl_mcp_tool_call_duration_seconds",
                                  "Duration of MCP tool calls.", ["tool"], registry=registry,
                                  buckets=LATENCY_BUCKETS_S)

    async def on_call_tool(self, context: Any, call_next: Any) -> Any:
        tool = context.message.name
        start = time.perf_counter()
        outcome = "error"
        try:
            result = await call_next(context)
            outcome = "error" if getattr(result, "is_error", False) else "ok"
            return result
        finally:
            self.calls.labels(tool, outcome).inc()
            self.duration.labels(tool).observe(time.perf_counter() - start)


async def _run(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except InventoryError as exc:
        raise ToolError(str(exc)) from None


def build_mcp(service: InventoryService, registry: CollectorRegistry, *,
              allow_writes: bool = True) -> FastMCP:
    """The FastMCP server with the read tools and, when allowed, the write tools."""

    mcp = FastMCP("inventory", instructions=INSTRUCTIONS, middleware=[ToolMetrics(registry)],
                  mask_error_details=False)

    @mcp.tool(annotations={"readOnlyHint": True})
    async def list_warehouses() -> dict:
        """List every warehouse with its code, city, capacity, units in stock and utilisation."""
        return await _run(service.list_warehouses)

    @mcp.tool(annotations={"readOnlyHint": True})
    async def list_categories() -> dict:
        """List the item categories with how many items and units each has."""
        return await _run(service.list_categories)

    @mcp.tool(annotations={"readOnlyHint": True})
    async def search_items(
        query: Annotated[str, Field(description="Words of the item name or SKU; '' = all.")] = "",
        category: Annotated[str | None, Field(description="Exact category, e.g. 'tools'.")] = None,
        supplier: Annotated[str | None, Field(description="Exact supplier name.")] = None,
        min_price: Annotated[float | None, Field(description="Lowest unit price.")] = None,
        max_price: Annotated[float | None, Field(description="Highest unit price.")] = None,
        limit: Limit = 20,
        offset: Annotated[int, Field(description="Rows to skip (paging).", ge=0)] = 0,
    ) -> dict:
        """Find catalogue items by name/SKU text, category, supplier or price range.

        Returns the total number of matches and one page of items (SKU, name, category,
        unit price, supplier, units in stock over all warehouses)."""
        return await _run(service.search_items, query, category, supplier, min_price,
                          max_price, limit, offset)

    @mcp.tool(annotations={"readOnlyHint": True})
    async def get_item(sku: Sku) -> dict:
        """Everything about one item: catalogue data, stock in each warehouse, total units and
        whether it is below its reorder level."""
        return await _run(service.get_item, sku)

    @mcp.tool(annotations={"readOnlyHint": True})
    async def stock_level(
        sku: Sku,
        warehouse: Annotated[str | None, Field(
            description="Warehouse code or city; omit for the total over all warehouses.")] = None,
    ) -> dict:
        """Units of one item in stock, in one warehouse or in all of them together."""
        return await _run(service.stock_level, sku, warehouse)

    @mcp.tool(annotations={"readOnlyHint": True})
    async def low_stock(
        warehouse: Annotated[str | None, Field(
            description="Warehouse code or city; omit to compare totals over all warehouses."
        )] = None,
        limit: Limit = 20,
    ) -> dict:
        """Items whose stock is below their reorder level, the largest shortfall first."""
        return await _run(service.low_stock, warehouse, limit)

    @mcp.tool(annotations={"readOnlyHint": True})
    async def list_movements(
        sku: Annotated[str | None, Field(description="Only this item's movements.")] = None,
        warehouse: Annotated[str | None, Field(description="Only this warehouse.")] = None,
        kind: Annotated[Literal["receipt", "shipment", "transfer_in", "transfer_out",
                                "adjustment"] | None,
                        Field(description="Only movements of this kind.")] = None,
        since: Annotated[str | None, Field(description="ISO date/time, inclusive.")] = None,
        until: Annotated[str | None, Field(description="ISO date/time, exclusive.")] = None,
        limit: Limit = 50,
    ) -> dict:
        """The stock ledger, newest first: receipts (+), shipments (-), transfers and
        adjustments, with their reference and time. Quantities are signed."""
        return await _run(service.list_movements, sku, warehouse, kind, since, until, limit)

    if allow_writes:
        @mcp.tool(annotations={"readOnlyHint": False, "destructiveHint": False})
        async def record_movement(
            sku: Sku,
            warehouse: Warehouse,
            kind: Annotated[Literal["receipt", "shipment", "adjustment"], Field(
                description="receipt adds units, shipment removes them, adjustment corrects "
                "a count (signed).")],
            quantity: Annotated[int, Field(
                description="Units: positive for receipts and shipments, signed for "
                "adjustments.")],
            reference: Annotated[str, Field(description="Order or note number, 1-64 chars.")],
        ) -> dict:
            """Record a receipt, shipment or adjustment; refuses to take stock below zero or
            a warehouse over its capacity. Returns the stock after the movement."""
            return await _run(service.record_movement, sku, warehouse, kind, quantity,
                              reference)

        @mcp.tool(annotations={"readOnlyHint": False, "destructiveHint": False})
        async def transfer_stock(
            sku: Sku,
            from_warehouse: Warehouse,
            to_warehouse: Warehouse,
            quantity: Annotated[int, Field(description="Units to move (positive).")],
            reference: Annotated[str, Field(description="Transfer number, 1-64 chars.")],
        ) -> dict:
            """Move units of an item from one warehouse to another in one transaction."""
            return await _run(service.transfer_stock, sku, from_warehouse, to_warehouse,
                              quantity, reference)

    return mcp
