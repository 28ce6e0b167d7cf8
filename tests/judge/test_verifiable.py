"""Checkers on hand-written answers (the sql-scenario versions are in test_sql_scenarios.py)."""

from __future__ import annotations

import pytest

from mcprl_common.wire import GroundTruth
from mcprl_judge.verifiable import CHECKERS, check_answer


def gt(kind: str, value: object, **kw: object) -> GroundTruth:
    return GroundTruth(kind=kind, value=value, **kw)  # type: ignore[arg-type]


def test_every_answer_kind_has_a_checker() -> None:
    assert set(CHECKERS) == {"number", "text", "set", "list"}


@pytest.mark.parametrize(
    ("answer", "correct"),
    [
        ("The average salary in Engineering is $120,500.", True),
        ("Average: 120.5k", True),
        ("about 121,000", True),  # within 1%
        ("It is 125,000", False),
        ("I could not find out.", False),
        ("", False),
    ],
)
def test_number_with_tolerance(answer: str, correct: bool) -> None:
    result = check_answer(answer, gt("number", 120500.0, rel_tol=0.01, abs_tol=0.01))
    assert result.correct is correct
    assert 0.0 <= result.partial <= 1.0
    if correct:
        assert result.partial == 1.0


def test_number_partial_credit_shrinks_with_error() -> None:
    truth = gt("number", 100.0, rel_tol=0.0, abs_tol=0.0)
    near, far = check_answer("110", truth), check_answer("140", truth)
    assert not near.correct and not far.correct
    assert 0.0 < far.partial < near.partial < 1.0


def test_number_dump_is_not_an_answer() -> None:
    dump = ", ".join(str(i) for i in range(1, 30))
    result = check_answer(dump, gt("number", 5))
    assert not result.correct and "dump" in result.detail


def test_percent_answer_matches_fraction_truth() -> None:
    assert check_answer("Roughly 40% are active.", gt("number", 0.4)).correct


def test_text_normalised() -> None:
    truth = gt("text", "Data Science")
    assert check_answer("The biggest budget belongs to data-science.", truth).correct
    result = check_answer("It is Engineering.", truth)
    assert not result.correct and result.partial == 0.0
    assert check_answer("Science dept", truth).partial == 0.5


def test_text_truth_that_is_a_number_uses_tolerance() -> None:
    assert check_answer("There are 15 of them", gt("text", "15")).correct


def test_set_any_order_and_extras() -> None:
    truth = gt("set", ["Alice Smith", "Bob Jones", "Carol White"])
    exact = check_answer("Carol White, Alice Smith and Bob Jones.", truth)
    assert exact.correct and exact.partial == 1.0
    prose = check_answer("The employees in Engineering, which is in SF, are Bob Jones, "
                         "Alice Smith and Carol White.", truth)
    assert prose.correct
    missing = check_answer("Alice Smith and Bob Jones", truth)
    assert not missing.correct and missing.partial == pytest.approx(0.8)
    extra = check_answer("- Alice Smith\n- Bob Jones\n- Carol White\n- Dan Brown", truth)
    assert not extra.correct and "Dan Brown" in extra.detail
    assert extra.partial == pytest.approx(2 * 0.75 / 1.75)
    assert check_answer("Nobody I know", truth).partial == 0.0


def test_empty_set_wants_none() -> None:
    truth = gt("set", [])
    assert check_answer("There are no such employees.", truth).correct
    assert not check_answer("Alice Smith", truth).correct


def test_list_order_counts() -> None:
    truth = gt("list", ["Engineering", "Data Science", "Sales"])
    assert check_answer("1. Engineering 2. Data Science 3. Sales", truth).correct
    swapped = check_answer("Sales, Data Science, Engineering", truth)
    assert not swapped.correct
    assert 0.0 < swapped.partial < 1.0


def test_numeric_list_in_order_with_tolerance() -> None:
    truth = gt("list", [175000, 160000, 150000])
    assert check_answer("Top salaries: $175,000, $160k and 150,000.", truth).correct
    assert not check_answer("150,000, 160,000, 175,000", truth).correct
