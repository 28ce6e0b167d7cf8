"""The anchors live in bench/anchors.json with their provenance; no bench types them in."""

from __future__ import annotations

import json
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _figures(node: object) -> list[float]:
    if isinstance(node, dict):
        return [x for k, v in node.items() if k != "measured" for x in _figures(v)]
    return [float(node)] if isinstance(node, int | float) else []


def test_every_set_says_where_when_and_how(bench_module) -> None:
    data = json.loads((BENCH / "anchors.json").read_text())
    assert data["default"] in data["sets"]
    for name, anchor_set in data["sets"].items():
        measured = anchor_set["measured"]
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", measured["date"]), name
        for key in ("where", "software", "model", "source", "commands"):
            assert measured[key], f"{name}: measured.{key} is empty"
        assert _figures(anchor_set), name
    loaded = bench_module("anchors").anchors()
    assert loaded["lora_step_tokens_per_s"]["8x4096"] == 14703


def test_benches_read_the_figures_instead_of_typing_them() -> None:
    data = json.loads((BENCH / "anchors.json").read_text())
    figures = {x for s in data["sets"].values() for x in _figures(s) if x >= 1000}
    for path in sorted(BENCH.glob("*.py")):
        numbers = {float(n.replace("_", "")) for n in
                   re.findall(r"(?<![\w.])\d[\d_]*(?:\.\d+)?(?:e\d+)?", path.read_text())}
        assert not figures & numbers, f"{path.name} types in anchors {sorted(figures & numbers)}"
