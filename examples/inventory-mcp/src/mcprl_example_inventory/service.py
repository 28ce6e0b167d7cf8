"""What the inventory tools do (no MCP or web framework here, so it is testable alone).

Every method opens its own SQLite connection (reads read-only), so concurrent sessions never
share a cursor, and raises :class:`InventoryError` with a message that tells an agent how
to correct itself (an unknown SKU points to ``search_items``, an unknown warehouse lists the
valid codes). Writes run in one ``BEGIN IMMEDIATE`` transaction: the ledger row and the
stock change land together or not at all.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from mcprl_example_inventory.db import connect, ensure_db

WRITE_KINDS = ("receipt", "shipment", "adjustment")


class InventoryError(Exception):
    """A tool call that cannot be done as asked; the message is shown to the agent."""


class InventoryService:
    def __init__(self, db_path: Path, *, max_results: int = 100, busy_timeout_s: float = 5.0,
                 seed: int = 7, warehouses: int = 6, items: int = 120,
                 movements: int = 1500) -> None:
        self.db_path = db_path
        self.max_results = max_results
        self.busy_timeout_s = busy_timeout_s
        self.created = ensure_db(db_path, seed=seed, warehouses=warehouses, items=items,
                                 movements=movements)

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        conn = connect(self.db_path, read_only=True, busy_timeout_s=self.busy_timeout_s)
        try:
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = connect(self.db_path, read_only=False, busy_timeout_s=self.busy_timeout_s)
        conn.isolation_level = None
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    # -- lookups -------------------------------------------------------------------------

    def _limit(self, limit: int) -> int:
        if limit < 1:
            raise InventoryError("limit must be at least 1")
        return min(limit, self.max_results)

    def _warehouse(self, conn: sqlite3.Connection, ref: str) -> sqlite3.Row:
        key = ref.strip()
        row = conn.execute(
            "SELECT * FROM warehouses WHERE upper(code) = upper(?) OR lower(city) = lower(?)",
            (key, key),
        ).fetchone()
        if row is None:
            codes = [r["code"] for r in conn.execute("SELECT code FROM warehouses ORDER BY id")]
            raise InventoryError(
                f"Unknown warehouse {ref!r}. Valid warehouse codes: {', '.join(codes)} "
                "(a city name works too; see list_warehouses)."
            )
        return row

    def _item(self, conn: sqlite3.Connection, sku: str) -> sqlite3.Row:
        row = conn.execute("SELECT * FROM items WHERE upper(sku) = upper(?)", (sku.strip(),)
                           ).fetchone()
        if row is None:
            raise InventoryError(
                f"Unknown SKU {sku!r}. SKUs look like 'TOO-0002'; find them with search_items."
            )
        return row

    # -- read tools ----------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        with self._read() as conn:
            items = conn.execute("SELECT count(*) FROM items").fetchone()[0]
        return {"db_path": str(self.db_path), "items": items}

    def list_warehouses(self) -> dict[str, Any]:
        with self._read() as conn:
            rows = conn.execute(
                "SELECT w.code, w.name, w.city, w.country, w.capacity_units, "
                "COALESCE(SUM(s.quantity), 0) AS units_in_stock, "
                "COUNT(CASE WHEN s.quantity > 0 THEN 1 END) AS distinct_items "
                "FROM warehouses w LEFT JOIN stock s ON s.warehouse_id = w.id "
                "GROUP BY w.id ORDER BY w.id"
            ).fetchall()
        out = []
        for r in rows:
            row = dict(r)
            row["utilisation"] = round(r["units_in_stock"] / r["capacity_units"], 4)
            out.append(row)
        return {"warehouses": out}

    def list_categories(self) -> dict[str, Any]:
        with self._read() as conn:
            rows = conn.execute(
                "SELECT i.category, COUNT(DISTINCT i.sku) AS items, "
                "COALESCE(SUM(s.quantity), 0) AS units_in_stock "
                "FROM items i LEFT JOIN stock s ON s.sku = i.sku "
                "GROUP BY i.category ORDER BY i.category"
            ).fetchall()
        return {"categories": [dict(r) for r in rows]}

    def search_items(self, query: str = "", category: str | None = None,
                     supplier: str | None = None, min_price: float | None = None,
                     max_price: float | None = None, limit: int = 20,
                     offset: int = 0) -> dict[str, Any]:
        limit = self._limit(limit)
        if offset < 0:
            raise InventoryError("offset must be 0 or more")
        where, args = ["1 = 1"], []
        if query.strip():
            where.append("(lower(i.name) LIKE ? OR lower(i.sku) LIKE ?)")
            needle = f"%{query.strip().lower()}%"
            args += [needle, needle]
        if category:
            where.append("lower(i.category) = lower(?)")
            args.append(category.strip())
        if supplier:
            where.append("lower(i.supplier) = lower(?)")
            args.append(supplier.strip())
        if min_price is not None:
            where.append("i.unit_price >= ?")
            args.append(min_price)
        if max_price is not None:
            where.append("i.unit_price <= ?")
            args.append(max_price)
        cond = " AND ".join(where)
        with self._read() as conn:
            total = conn.execute(f"SELECT count(*) FROM items i WHERE {cond}", args).fetchone()[0]
            rows = conn.execute(
                "SELECT i.sku, i.name, i.category, i.unit_price, i.supplier, "
                "COALESCE((SELECT SUM(quantity) FROM stock s WHERE s.sku = i.sku), 0) "
                f"AS units_in_stock FROM items i WHERE {cond} ORDER BY i.sku LIMIT ? OFFSET ?",
                [*args, limit, offset],
            ).fetchall()
            if total == 0 and category:
                known = [r[0] for r in conn.execute(
                    "SELECT DISTINCT category FROM items ORDER BY 1")]
                if category.strip().lower() not in known:
                    raise InventoryError(
                        f"Unknown category {category!r}. Categories: {', '.join(known)}."
                    )
        return {"total": total, "offset": offset, "items": [dict(r) for r in rows],
                "truncated": offset + len(rows) < total}

    def get_item(self, sku: str) -> dict[str, Any]:
        with self._read() as conn:
            item = dict(self._item(conn, sku))
            rows = conn.execute(
                "SELECT w.code AS warehouse, s.quantity FROM stock s "
                "JOIN warehouses w ON w.id = s.warehouse_id WHERE s.sku = ? ORDER BY w.id",
                (item["sku"],),
            ).fetchall()
        item["stock"] = [dict(r) for r in rows]
        item["units_in_stock"] = sum(r["quantity"] for r in rows)
        item["below_reorder_level"] = item["units_in_stock"] < item["reorder_level"]
        return item

    def stock_level(self, sku: str, warehouse: str | None = None) -> dict[str, Any]:
        with self._read() as conn:
            item = self._item(conn, sku)
            if warehouse is None:
                qty = conn.execute("SELECT COALESCE(SUM(quantity), 0) FROM stock WHERE sku = ?",
                                   (item["sku"],)).fetchone()[0]
                return {"sku": item["sku"], "warehouse": None, "quantity": qty,
                        "reorder_level": item["reorder_level"]}
            wh = self._warehouse(conn, warehouse)
            row = conn.execute("SELECT quantity FROM stock WHERE sku = ? AND warehouse_id = ?",
                               (item["sku"], wh["id"])).fetchone()
        return {"sku": item["sku"], "warehouse": wh["code"], "quantity": row[0] if row else 0,
                "reorder_level": item["reorder_level"]}

    def low_stock(self, warehouse: str | None = None, limit: int = 20) -> dict[str, Any]:
        limit = self._limit(limit)
        with self._read() as conn:
            if warehouse is None:
                rows = conn.execute(
                    "SELECT i.sku, i.name, i.reorder_level, COALESCE(SUM(s.quantity), 0) AS qty "
                    "FROM items i LEFT JOIN stock s ON s.sku = i.sku GROUP BY i.sku "
                    "HAVING qty < i.reorder_level ORDER BY qty - i.reorder_level, i.sku"
                ).fetchall()
                code = None
            else:
                wh = self._warehouse(conn, warehouse)
                code = wh["code"]
                rows = conn.execute(
                    "SELECT i.sku, i.name, i.reorder_level, COALESCE(s.quantity, 0) AS qty "
                    "FROM items i LEFT JOIN stock s ON s.sku = i.sku AND s.warehouse_id = ? "
                    "WHERE COALESCE(s.quantity, 0) < i.reorder_level "
                    "ORDER BY qty - i.reorder_level, i.sku", (wh["id"],)
                ).fetchall()
        items = [{"sku": r["sku"], "name": r["name"], "quantity": r["qty"],
                  "reorder_level": r["reorder_level"]} for r in rows]
        return {"warehouse": code, "total": len(items), "items": items[:limit],
                "truncated": len(items) > limit}

    def list_movements(self, sku: str | None = None, warehouse: str | None = None,
                       kind: str | None = None, since: str | None = None,
                       until: str | None = None, limit: int = 50) -> dict[str, Any]:
        limit = self._limit(limit)
        where, args = ["1 = 1"], []
        if kind is not None:
            if kind not in ("receipt", "shipment", "transfer_in", "transfer_out", "adjustment"):
                raise InventoryError(
                    f"Unknown kind {kind!r}: use receipt, shipment, transfer_in, transfer_out "
                    "or adjustment."
                )
            where.append("m.kind = ?")
            args.append(kind)
        for name, value, op in (("since", since, ">="), ("until", until, "<")):
            if value is not None:
                where.append(f"m.created_at {op} ?")
                args.append(_iso(name, value))
        with self._read() as conn:
            if sku is not None:
                where.append("m.sku = ?")
                args.append(self._item(conn, sku)["sku"])
            if warehouse is not None:
                where.append("m.warehouse_id = ?")
                args.append(self._warehouse(conn, warehouse)["id"])
            cond = " AND ".join(where)
            total = conn.execute(f"SELECT count(*) FROM movements m WHERE {cond}", args
                                 ).fetchone()[0]
            rows = conn.execute(
                "SELECT m.id, m.created_at, m.sku, w.code AS warehouse, m.kind, m.quantity, "
                "m.reference FROM movements m JOIN warehouses w ON w.id = m.warehouse_id "
                f"WHERE {cond} ORDER BY m.created_at DESC, m.id DESC LIMIT ?", [*args, limit]
            ).fetchall()
        return {"total": total, "movements": [dict(r) for r in rows], "truncated": total > limit}

    # -- write tools ---------------------------------------------------------------------

    def record_movement(self, sku: str, warehouse: str, kind: str, quantity: int,
                        reference: str) -> dict[str, Any]:
        if kind not in WRITE_KINDS:
            raise InventoryError(
                f"kind must be one of {', '.join(WRITE_KINDS)} (use transfer_stock to move "
                "stock between warehouses)."
            )
        if kind in ("receipt", "shipment") and quantity <= 0:
            raise InventoryError(f"quantity of a {kind} must be a positive number of units.")
        if kind == "adjustment" and quantity == 0:
            raise InventoryError("an adjustment needs a non-zero quantity (negative removes).")
        delta = -quantity if kind == "shipment" else quantity
        ref = _reference(reference)
        with self._write() as conn:
            item = self._item(conn, sku)
            wh = self._warehouse(conn, warehouse)
            after = self._apply(conn, item["sku"], wh, kind, delta, ref)
        return {"sku": item["sku"], "warehouse": wh["code"], "kind": kind, "quantity": delta,
                "reference": ref, "stock_after": after}

    def transfer_stock(self, sku: str, from_warehouse: str, to_warehouse: str, quantity: int,
                       reference: str) -> dict[str, Any]:
        if quantity <= 0:
            raise InventoryError("quantity of a transfer must be a positive number of units.")
        ref = _reference(reference)
        with self._write() as conn:
            item = self._item(conn, sku)
            src = self._warehouse(conn, from_warehouse)
            dst = self._warehouse(conn, to_warehouse)
            if src["id"] == dst["id"]:
                raise InventoryError("from_warehouse and to_warehouse must differ.")
            src_after = self._apply(conn, item["sku"], src, "transfer_out", -quantity, ref)
            dst_after = self._apply(conn, item["sku"], dst, "transfer_in", quantity, ref)
        return {"sku": item["sku"], "from_warehouse": src["code"], "to_warehouse": dst["code"],
                "quantity": quantity, "reference": ref,
                "stock_after": {src["code"]: src_after, dst["code"]: dst_after}}

    def _apply(self, conn: sqlite3.Connection, sku: str, wh: sqlite3.Row, kind: str,
               delta: int, ref: str) -> int:
        row = conn.execute("SELECT quantity FROM stock WHERE sku = ? AND warehouse_id = ?",
                           (sku, wh["id"])).fetchone()
        have = row[0] if row else 0
        if have + delta < 0:
            raise InventoryError(
                f"Not enough stock: {wh['code']} holds {have} units of {sku}, "
                f"the {kind} needs {-delta}."
            )
        capacity_left = conn.execute(
            "SELECT w.capacity_units - COALESCE(SUM(s.quantity), 0) FROM warehouses w "
            "LEFT JOIN stock s ON s.warehouse_id = w.id WHERE w.id = ?", (wh["id"],)
        ).fetchone()[0]
        if delta > capacity_left:
            raise InventoryError(
                f"{wh['code']} has room for {capacity_left} more units, not {delta}."
            )
        if row is None:
            conn.execute("INSERT INTO stock (warehouse_id, sku, quantity) VALUES (?, ?, ?)",
                         (wh["id"], sku, delta))
        else:
            conn.execute("UPDATE stock SET quantity = ? WHERE warehouse_id = ? AND sku = ?",
                         (have + delta, wh["id"], sku))
        conn.execute(
            "INSERT INTO movements (sku, warehouse_id, kind, quantity, reference, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (sku, wh["id"], kind, delta, ref, datetime.now().strftime("%Y-%m-%dT%H:%M:%S")),
        )
        return have + delta


def _iso(name: str, value: str) -> str:
    try:
        return datetime.fromisoformat(value.strip()).strftime("%Y-%m-%dT%H:%M:%S")
    except ValueError:
        raise InventoryError(
            f"{name} must be an ISO date or date-time such as 2024-03-01 or 2024-03-01T12:00"
        ) from None


def _reference(reference: str) -> str:
    ref = reference.strip()
    if not 1 <= len(ref) <= 64:
        raise InventoryError("reference must be 1-64 characters (e.g. a purchase order number).")
    return ref
