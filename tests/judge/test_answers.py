from __future__ import annotations

import pytest

from mcprl_common.wire import Trajectory
from mcprl_judge.answers import (
    as_number,
    final_answer,
    find_phrase,
    normalise,
    parse_numbers,
    split_items,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The average salary is $120,500.50.", [120500.5]),
        ("about 120.5k per year", [120500.0]),
        ("a budget of 1.2 million dollars", [1200000.0]),
        ("budget 5M, spent 300K", [5e6, 3e5]),
        ("x = -3 and then 4", [-3.0, 4.0]),
        ("five employees", [5.0]),
        ("No idea, none of them", [0.0]),
        ("about 1.23457e+06 in total", [1234570.0]),
        ("3 employees in Marketing", [3.0]),
        ("hired on 2021-03-15", [2021.0]),
        ("€ 1,000 and £2", [1000.0, 2.0]),
    ],
)
def test_parse_numbers_reads_prose(text: str, expected: list[float]) -> None:
    assert [n.value for n in parse_numbers(text)] == expected


def test_percent_reads_both_ways() -> None:
    (n,) = parse_numbers("The share is 15%.")
    assert n.readings() == (15.0, 0.15)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("120,000", 120000.0), ("$5k", 5000.0), (7, 7.0), ("15%", 15.0), ("2021-03-15", None),
     ("Engineering", None), (True, None)],
)
def test_as_number_only_for_whole_numbers(value: object, expected: float | None) -> None:
    assert as_number(value) == expected


def test_normalise_and_find_phrase_respect_word_boundaries() -> None:
    text = normalise("Team: Café R&D, Alice O'Neil; Bob")
    assert text == "team cafe r and d alice o neil bob"
    assert find_phrase(text, "alice o'neil") is not None
    assert find_phrase(text, "Ali") is None
    assert find_phrase(text, "BOB") is not None


def test_split_items_handles_bullets_commas_and_and() -> None:
    items = split_items("The team:\n- Alice Smith\n2. Bob Jones, Carol White and Dan Brown.")
    assert items == ["The team", "Alice Smith", "Bob Jones", "Carol White", "Dan Brown"]


def test_final_answer_prefers_complete_task_then_last_assistant_text() -> None:
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "text", "text": "It is 5."}]},
            {"role": "assistant", "content": None, "tool_calls": []}]
    assert final_answer(Trajectory(messages=msgs)) == "It is 5."
    assert final_answer(Trajectory(messages=msgs, final_answer=" 6 ")) == "6"
    assert final_answer(Trajectory(messages=[{"role": "user", "content": "q"}])) == ""
