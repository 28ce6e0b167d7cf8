"""Dedup, validation, difficulty mix and the leakage-free split."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcprl_common.wire import Scenario
from mcprl_scenario_gen.quality import (
    Deduplicator,
    dedupe,
    mix_targets,
    normalise,
    select_by_mix,
    validate,
)
from mcprl_scenario_gen.split import leaks, split_scenarios

pytestmark = pytest.mark.timeout(30)


def sc(task: str, difficulty: int = 3, template: str | None = None,
       entities: list[str] | None = None, key: str | None = None) -> Scenario:
    meta = {"key": key} if key else {}
    return Scenario(id=Scenario.content_id(task), task=task, difficulty=difficulty,
                    template=template, entities=entities or [], metadata=meta)


def test_exact_duplicates_after_normalisation() -> None:
    a = sc("How many employees work in Sales? Answer with the number only.")
    b = sc("  how many EMPLOYEES work in sales ?? answer with the number only")
    assert normalise(a.task) == normalise(b.task)
    assert a.id == Scenario.content_id(a.task.upper())  # content id ignores case/space
    assert dedupe([a, b]) == [a]


def test_near_duplicates_caught_but_different_numbers_kept() -> None:
    base = "Which employees in the Engineering department were hired in 2019? List names."
    reworded = "Which employees of the Engineering department were hired in 2019? List names."
    other_year = "Which employees in the Engineering department were hired in 2020? List names."
    unrelated = "What is the total budget of completed projects? Answer with the number only."
    d = Deduplicator(0.85)
    assert [d.add(sc(t)) for t in (base, reworded, other_year, unrelated)] == [
        True, False, True, True]
    assert d.rejected == {"near duplicate": 1}


def test_same_template_and_params_is_a_duplicate_whatever_the_wording() -> None:
    d = Deduplicator()
    assert d.add(sc("How many people work as Staff Engineer?", 1, "count_role", key="k|x"))
    assert not d.add(sc("How many employees have the role Staff Engineer?", 1, "count_role",
                        key="k|x"))
    # Template scenarios differing in one entity are never near-duplicates of each other.
    assert d.add(sc("How many employees have the role Data Analyst?", 1, "count_role",
                    key="k|y"))


def test_validate_rejects_invented_tables_and_junk() -> None:
    tables = ["departments", "employees", "projects"]
    assert validate(sc("List every row of the customers table."), tables) is not None
    assert validate(sc("Count rows in the employees table. Number only."), tables) is None
    assert validate(sc("How many employee records exist in the employee table?"), tables) is None
    assert validate(sc("?!?!?!?!?!?! 12345"), tables) == "task has no words"


@given(n=st.integers(0, 500), weights=st.dictionaries(st.integers(1, 5),
                                                      st.floats(0.01, 10), min_size=1))
@settings(max_examples=200, deadline=None)
def test_mix_targets_sum_to_n_and_follow_weights(n: int, weights: dict[int, float]) -> None:
    counts = mix_targets(n, weights)
    assert sum(counts.values()) == n
    total = sum(weights.values())
    for level in range(1, 6):
        assert abs(counts[level] - n * weights.get(level, 0) / total) < 1.0 + 1e-9


def test_select_by_mix_borrows_from_nearest_and_warns() -> None:
    pool = [sc(f"task number {i} about things", difficulty=1 + i % 3) for i in range(30)]
    chosen, warnings = select_by_mix(pool, 20, {5: 1.0}, random.Random(0))
    assert len(chosen) == 20
    assert warnings and "difficulty 5: 0 of 20" in warnings[0]
    assert sum(s.difficulty == 3 for s in chosen) == 10  # nearest level to 5 first


def _pool() -> list[Scenario]:
    out = []
    for t in range(8):
        for dept in ("Sales", "Design", "Product", "Operations", "Marketing"):
            for year in ("2019", "2020"):
                out.append(sc(f"Template {t} question about {dept} in {year}?", 1 + t % 5,
                              f"tpl{t}", [f"department={dept}", f"year={year}"]))
    return out


def test_plain_split_fraction_and_determinism() -> None:
    pool = _pool()
    a = split_scenarios(pool, 0.25, seed=1)
    b = split_scenarios(list(reversed(pool)), 0.25, seed=1)
    assert len(a.val) == 20 and len(a.train) == 60
    assert [s.id for s in a.val] == [s.id for s in b.val]
    assert not leaks(a.train, a.val)["ids"]


@pytest.mark.parametrize("templates,entities", [(True, False), (False, True), (True, True)])
def test_holdout_split_never_leaks(templates: bool, entities: bool) -> None:
    result = split_scenarios(_pool(), 0.2, seed=5, holdout_templates=templates,
                             holdout_entities=entities)
    assert result.val and result.train
    shared = leaks(result.train, result.val)
    assert not shared["ids"]
    assert not shared["templates"] or not templates
    assert not shared["entities"] or not entities
    assert len(result.train) + len(result.val) + result.dropped == len(_pool())
    ratio = len(result.val) / (len(result.val) + len(result.train))
    assert 0.05 <= ratio <= 0.45
