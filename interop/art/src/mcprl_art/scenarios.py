"""ART's scenarios (``art.mcp.generate_scenarios``' ``GeneratedScenarioCollection``) <-> our
scenario-set store (``<data_dir>/<set_id>/{train,val}.jsonl`` + ``manifest.json``).

Storing goes through scenario-gen's own import: every task is validated and deduplicated
like generated ones (a task the store refuses is counted in the manifest's warnings), and a
split given by the caller (the tutorial's ``collection.split(n)``) is kept as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from art.mcp import GeneratedScenario, GeneratedScenarioCollection

from mcprl_common.wire import Scenario
from mcprl_scenario_gen.art_import import import_art
from mcprl_scenario_gen.store import ScenarioStore, SplitName, StoredManifest

ART_SOURCE = "art:generate_scenarios"

Items = GeneratedScenarioCollection | list[GeneratedScenario] | list[dict[str, Any]]


def _dicts(items: Items) -> list[dict[str, Any]]:
    return [s.to_dict() if isinstance(s, GeneratedScenario) else dict(s) for s in items]


def store_art_scenarios(data_dir: Path | str, *, train: Items, val: Items | None = None,
                        source: str = ART_SOURCE, seed: int = 0,
                        val_fraction: float = 0.2) -> StoredManifest:
    """Store ART scenarios as a scenario set; returns its manifest (``manifest.id``).

    With ``val`` the two splits are kept as given; without it ``train`` is split by
    ``val_fraction`` (seeded), as ``mcprl-scenario-gen import`` does with a flat file.
    """

    groups = ({"train": _dicts(train), "val": _dicts(val)} if val is not None
              else {"all": _dicts(train)})
    return import_art(ScenarioStore(data_dir), groups, source=source, seed=seed,
                      val_fraction=val_fraction)


def to_art(scenarios: list[Scenario]) -> GeneratedScenarioCollection:
    return GeneratedScenarioCollection.from_dicts([s.to_art() for s in scenarios])


def load_art_scenarios(data_dir: Path | str, set_id: str,
                       split: SplitName = "train") -> GeneratedScenarioCollection:
    """A stored split (ours or imported) as ART's collection."""

    return to_art(ScenarioStore(data_dir).load_split(set_id, split))
