"""ART's scenarios (``[{"task", "difficulty"}]``) into a stored scenario set.

One function for the CLI's ``import`` and for the optional ART bridge (``interop/art``):
every item is validated and deduplicated like generated scenarios; a file that brings its
own train/val split keeps it, a flat list is split by ``val_fraction``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from mcprl_common.wire import Scenario
from mcprl_scenario_gen.pipeline import finish, new_manifest
from mcprl_scenario_gen.quality import Deduplicator, difficulty_counts, validate
from mcprl_scenario_gen.store import ScenarioStore, StoredManifest
from mcprl_scenario_gen.strategies import GenerationParams

STRATEGY = "import:art"


class NothingToImportError(ValueError):
    """No item of the ART scenarios was valid (and not a duplicate)."""


def load_art(path: Path) -> dict[str, list[dict[str, Any]]]:
    """ART scenarios: a JSON array, JSONL, or ``{"train": [...], "val"/"test": [...]}``."""

    raw = path.read_text(encoding="utf-8")
    try:
        data = json.loads(raw)
    except ValueError:
        data = [json.loads(line) for line in raw.splitlines() if line.strip()]
    if isinstance(data, dict):
        return {"train": list(data.get("train", [])),
                "val": list(data.get("val", data.get("test", [])))}
    if not isinstance(data, list):
        raise ValueError("expected a JSON array of {task, difficulty} objects")
    return {"all": data}


def import_art(store: ScenarioStore, groups: dict[str, list[dict[str, Any]]], *, source: str,
               seed: int = 0, val_fraction: float = 0.2,
               near_duplicate_threshold: float = 0.85) -> StoredManifest:
    """Store ``groups`` (``{"all": [...]}`` or ``{"train": [...], "val": [...]}``) as a set.

    Raises :class:`NothingToImportError` when no item survives validation and dedup; the
    manifest's warnings count the items that were skipped.
    """

    dedup = Deduplicator(near_duplicate_threshold)
    kept: dict[str, list[Scenario]] = {}
    skipped = 0
    for split, items in groups.items():
        kept[split] = []
        for item in items:
            try:
                scenario = Scenario.from_art(item, strategy=STRATEGY)
            except (KeyError, TypeError, ValueError):
                skipped += 1
                continue
            if validate(scenario) is None and dedup.add(scenario):
                kept[split].append(scenario)
            else:
                skipped += 1
    total = sum(len(v) for v in kept.values())
    if total == 0:
        raise NothingToImportError(f"no valid scenarios in {source} ({skipped} skipped)")
    given_val = len(kept.get("val", []))
    params = GenerationParams(
        mcp_url=source, strategy=STRATEGY, n=total, seed=seed,
        val_fraction=given_val / total if "all" not in kept else val_fraction)
    manifest = new_manifest(store.new_set_id(), params)
    warnings = [f"skipped {skipped} invalid or duplicate items"] if skipped else []
    if "all" in kept:
        return finish(store, manifest, kept["all"], params, status="succeeded", error=None,
                      warnings=warnings)
    # The caller's own split is kept as it is.
    train = [s.model_copy(update={"split": "train"}) for s in kept.get("train", [])]
    val = [s.model_copy(update={"split": "val"}) for s in kept.get("val", [])]
    manifest.status, manifest.finished_at, manifest.warnings = "succeeded", time.time(), warnings
    manifest.counts = {"train": len(train), "val": len(val), "total": total}
    manifest.difficulty_counts = difficulty_counts([*train, *val])
    store.write_set(manifest, train, val)
    return manifest
