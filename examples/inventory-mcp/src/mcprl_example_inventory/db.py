"""The inventory database: schema and a deterministic seeded generator.

Four tables: ``warehouses``, ``items`` (the catalogue), ``stock`` (quantity of each item in
each warehouse) and ``movements`` (the ledger of receipts, shipments, transfers and
adjustments that produced the stock). The generator replays its movements into ``stock``, so
the ledger and the stock always agree; the same seed gives the same file.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

SCHEMA = """
CREATE TABLE warehouses (
    id INTEGER PRIMARY KEY,
    code TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    city TEXT NOT NULL,
    country TEXT NOT NULL,
    capacity_units INTEGER NOT NULL CHECK (capacity_units > 0)
);
CREATE TABLE items (
    sku TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    category TEXT NOT NULL,
    unit_price REAL NOT NULL CHECK (unit_price >= 0),
    unit_weight_kg REAL NOT NULL CHECK (unit_weight_kg >= 0),
    reorder_level INTEGER NOT NULL CHECK (reorder_level >= 0),
    supplier TEXT NOT NULL
);
CREATE TABLE stock (
    warehouse_id INTEGER NOT NULL REFERENCES warehouses(id),
    sku TEXT NOT NULL REFERENCES items(sku),
    quantity INTEGER NOT NULL CHECK (quantity >= 0),
    PRIMARY KEY (warehouse_id, sku)
);
CREATE TABLE movements (
    id INTEGER PRIMARY KEY,
    sku TEXT NOT NULL REFERENCES items(sku),
    warehouse_id INTEGER NOT NULL REFERENCES warehouses(id),
    kind TEXT NOT NULL
        CHECK (kind IN ('receipt', 'shipment', 'transfer_in', 'transfer_out', 'adjustment')),
    quantity INTEGER NOT NULL CHECK (quantity != 0),
    reference TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX movements_by_item ON movements (sku, created_at);
CREATE INDEX movements_by_warehouse ON movements (warehouse_id, created_at);
"""

MOVEMENT_KINDS = ("receipt", "shipment", "transfer_in", "transfer_out", "adjustment")

_WAREHOUSES = [
    ("Rotterdam", "Netherlands"), ("Lyon", "France"), ("Leipzig", "Germany"),
    ("Milan", "Italy"), ("Gdansk", "Poland"), ("Valencia", "Spain"), ("Porto", "Portugal"),
    ("Brno", "Czechia"), ("Aarhus", "Denmark"), ("Tampere", "Finland"),
]  # fmt: skip
_CATEGORIES = {
    "fasteners": (["Hex Bolt", "Wood Screw", "Wing Nut", "Rivet", "Anchor Plug"], (0.05, 2.0)),
    "tools": (["Cordless Drill", "Torque Wrench", "Hammer", "Spirit Level", "Pliers"], (9, 240)),
    "electrical": (["Cable Reel", "Wall Socket", "LED Panel", "Circuit Breaker", "Junction Box"],
                   (2, 90)),
    "plumbing": (["Ball Valve", "PVC Pipe", "Pipe Elbow", "Tap Cartridge", "Drain Trap"], (1, 60)),
    "safety": (["Safety Helmet", "Work Gloves", "Ear Defenders", "Hi-Vis Vest", "Goggles"],
               (2, 45)),
    "paint": (["Primer", "Gloss Paint", "Masking Tape", "Paint Roller", "Wood Stain"], (3, 55)),
}
_VARIANTS = ["S", "M", "L", "XL", "Pro", "Lite", "Eco", "Max", "Mini", "Plus"]
_SUPPLIERS = ["Nordfix", "Baltic Supply", "Iberia Tools", "Alpen Hardware", "Rhein Industrial",
              "Adria Trade"]  # fmt: skip
_START = datetime(2024, 1, 1)


def generate(path: Path, *, seed: int = 7, warehouses: int = 6, items: int = 120,
             movements: int = 1500) -> None:
    """Write a new inventory DB to ``path`` atomically (a temp file renamed into place)."""

    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    conn = sqlite3.connect(tmp)
    try:
        conn.executescript(SCHEMA)
        places = _WAREHOUSES * (warehouses // len(_WAREHOUSES) + 1)
        wh_rows = []
        for i in range(warehouses):
            city, country = places[i]
            suffix = "" if i < len(_WAREHOUSES) else f"-{i // len(_WAREHOUSES) + 1}"
            code = f"{city[:3].upper()}{i + 1}{suffix}"
            capacity = rng.randrange(20_000, 120_000, 1000)
            wh_rows.append((i + 1, code, f"{city} Distribution Centre{suffix}", city, country,
                            capacity))
        conn.executemany("INSERT INTO warehouses VALUES (?, ?, ?, ?, ?, ?)", wh_rows)

        item_rows = []
        names: set[str] = set()
        categories = sorted(_CATEGORIES)
        per_category: dict[str, int] = {}
        while len(item_rows) < items:
            category = categories[len(item_rows) % len(categories)]
            per_category[category] = per_category.get(category, 0) + 1
            bases, (lo, hi) = _CATEGORIES[category]
            name = f"{rng.choice(bases)} {rng.choice(_VARIANTS)}"
            if name in names:
                name = f"{name} {len(item_rows)}"
            names.add(name)
            sku = f"{category[:3].upper()}-{per_category[category]:04d}"
            price = round(rng.uniform(lo, hi), 2)
            item_rows.append((sku, name, category, price, round(rng.uniform(0.01, 12.0), 2),
                              rng.randrange(50, 1500, 10), rng.choice(_SUPPLIERS)))
        conn.executemany("INSERT INTO items VALUES (?, ?, ?, ?, ?, ?, ?)", item_rows)

        stock: dict[tuple[int, str], int] = {}
        moves: list[tuple[str, int, str, int, str, datetime]] = []

        def move(sku: str, wid: int, kind: str, qty: int, ref: str, when: datetime) -> None:
            moves.append((sku, wid, kind, qty, ref, when))
            stock[(wid, sku)] = stock.get((wid, sku), 0) + qty

        for n in range(movements):
            when = _START + timedelta(minutes=n * 523 + rng.randrange(0, 500))
            sku = rng.choice(item_rows)[0]
            wid = rng.randrange(1, warehouses + 1)
            have = stock.get((wid, sku), 0)
            roll = rng.random()
            ref = f"{n + 1:06d}"
            if have == 0 or roll < 0.45:
                move(sku, wid, "receipt", rng.randrange(20, 400, 10), f"PO-{ref}", when)
            elif roll < 0.85:
                move(sku, wid, "shipment", -rng.randint(1, have), f"SO-{ref}", when)
            elif roll < 0.95 and warehouses > 1:
                other = rng.choice([w for w in range(1, warehouses + 1) if w != wid])
                qty = rng.randint(1, have)
                move(sku, wid, "transfer_out", -qty, f"TR-{ref}", when)
                move(sku, other, "transfer_in", qty, f"TR-{ref}", when)
            else:
                move(sku, wid, "adjustment", -rng.randint(1, min(have, 5)), f"ADJ-{ref}", when)
        conn.executemany(
            "INSERT INTO movements (sku, warehouse_id, kind, quantity, reference, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [(s, w, k, q, r, t.strftime("%Y-%m-%dT%H:%M:%S")) for s, w, k, q, r, t in moves],
        )
        conn.executemany(
            "INSERT INTO stock VALUES (?, ?, ?)",
            sorted((w, s, q) for (w, s), q in stock.items()),
        )
        conn.commit()
    finally:
        conn.close()
    os.replace(tmp, path)


def ensure_db(path: Path, **kwargs: int) -> bool:
    """Create the DB if missing; returns True when it was created now."""

    if path.exists():
        return False
    generate(path, **kwargs)
    return True


def connect(path: Path, *, read_only: bool, busy_timeout_s: float = 5.0) -> sqlite3.Connection:
    """A fresh connection per call: no cursor shared between sessions or threads."""

    uri = f"file:{path.resolve()}?mode={'ro' if read_only else 'rw'}"
    conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout_s, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA foreign_keys = ON")
    return conn
