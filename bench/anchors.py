"""The anchors (reference figures measured elsewhere) from ``bench/anchors.json``, with their
provenance, so no bench types a measured number into its code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ANCHORS_FILE = Path(__file__).with_name("anchors.json")


def anchors(name: str | None = None, path: Path = ANCHORS_FILE) -> dict[str, Any]:
    """One set of anchors (the file's default set unless ``name``), its ``measured`` block
    saying where, when and how."""

    data = json.loads(path.read_text(encoding="utf-8"))
    key = name or data["default"]
    try:
        return data["sets"][key]
    except KeyError:
        raise KeyError(f"no anchor set {key!r} in {path} (known: {sorted(data['sets'])})") from None
