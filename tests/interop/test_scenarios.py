"""ART's scenario collections <-> our scenario-set store, both ways, on a real store."""

from __future__ import annotations

import pytest

pytest.importorskip("mcprl_art", reason="the ART extra is not installed (make setup-art)")

import json

from art.mcp import GeneratedScenarioCollection

from mcprl_art.scenarios import load_art_scenarios, store_art_scenarios
from mcprl_scenario_gen.store import ScenarioStore

pytestmark = pytest.mark.timeout(60)

TASKS = [
    ("How many employees work in the Engineering department? Summarise the result.", 1),
    ("Which department has the highest total salary? Give a short report.", 3),
    ("List the projects that are on hold, with their leads, and analyse why.", 4),
    ("What is the average salary per location? Write a short analysis.", 3),
    ("Which employees lead more than one project? Report the names.", 5),
    ("Compare the budgets of active and completed projects in a summary.", 2),
]


def _collection() -> GeneratedScenarioCollection:
    return GeneratedScenarioCollection.from_dicts(
        [{"task": t, "difficulty": d} for t, d in TASKS])


def test_tutorial_split_round_trips_through_the_store(tmp_path) -> None:
    train, val = _collection().split(4)  # what the tutorial does with its 16 + 8
    manifest = store_art_scenarios(tmp_path, train=train, val=val)
    assert manifest.status == "succeeded" and manifest.counts == {"train": 4, "val": 2,
                                                                  "total": 6}
    assert manifest.strategy == "import:art" and not manifest.warnings
    assert load_art_scenarios(tmp_path, manifest.id, "train").to_dicts() == train.to_dicts()
    assert load_art_scenarios(tmp_path, manifest.id, "val").to_dicts() == val.to_dicts()
    stored = ScenarioStore(tmp_path).load_split(manifest.id, "train")
    assert [s.split for s in stored] == ["train"] * 4
    on_disk = json.loads((tmp_path / manifest.id / "manifest.json").read_text())
    assert on_disk["difficulty_counts"] == {"1": 1, "2": 1, "3": 2, "4": 1, "5": 1}


def test_flat_list_is_split_and_junk_is_refused(tmp_path) -> None:
    items = [*_collection().to_dicts(), {"task": "': '", "difficulty": 2},
             {"task": TASKS[0][0].upper(), "difficulty": 1}]  # junk, and a duplicate
    manifest = store_art_scenarios(tmp_path, train=items, val_fraction=0.5, seed=3)
    assert manifest.counts["total"] == 6
    assert manifest.warnings[0] == "skipped 2 invalid or duplicate items"
    back = (load_art_scenarios(tmp_path, manifest.id, "train").to_dicts()
            + load_art_scenarios(tmp_path, manifest.id, "val").to_dicts())
    assert sorted(d["task"] for d in back) == sorted(t for t, _ in TASKS)


def test_nothing_valid_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="no valid scenarios"):
        store_art_scenarios(tmp_path, train=[{"task": "?", "difficulty": 1}])
