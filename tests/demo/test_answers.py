"""How the scripted expert reads tool results and formats answers (pure functions)."""

from __future__ import annotations

import random

import pytest

from mcprl_common.wire import GroundTruth
from mcprl_demo.answers import (
    corrupt_answer,
    format_answer,
    format_number,
    last_tool_response,
    tables_in_sql,
)
from mcprl_judge.verifiable import check_answer

pytestmark = pytest.mark.timeout(30)


def test_tables_in_sql_in_order_of_mention() -> None:
    sql = ("SELECT d.name FROM employees e JOIN departments d ON e.department_id = d.id "
           "JOIN projects p ON p.lead_id = e.id JOIN employees x ON x.id = p.lead_id")
    assert tables_in_sql(sql) == ["employees", "departments", "projects"]
    assert tables_in_sql("select count(*) from Employees") == ["Employees"]


def test_last_tool_response_reads_the_newest_block() -> None:
    text = ("<tool_response>\n[1]\n</tool_response><|im_end|>\n<|im_start|>user\n"
            "<tool_response>\n{\"a\": 2}\n</tool_response><|im_end|>")
    assert last_tool_response(text) == '{"a": 2}'
    assert last_tool_response("no tools here") is None


@pytest.mark.parametrize(("value", "text"), [(3, "3"), (120000.0, "120000"),
                                              (98765.4321, "98765.43"), (0.5, "0.50")])
def test_format_number(value: float, text: str) -> None:
    assert format_number(value) == text


def _result(column: str, values: list) -> dict:
    return {"columns": [column], "results": [{column: v} for v in values],
            "row_count": len(values), "truncated": False, "elapsed_ms": 0.1}


def test_format_answer_by_kind_passes_the_judge() -> None:
    number = format_answer("number", _result("AVG(salary)", [123456.789]))
    assert check_answer(number, GroundTruth(kind="number", value=123456.79)).correct
    names = format_answer("set", _result("name", ["Ana Lee", "Bo Chen"]))
    assert names == "Ana Lee, Bo Chen"
    assert check_answer(names, GroundTruth(kind="set", value=["Bo Chen", "Ana Lee"])).correct
    top = format_answer("list", _result("name", ["A B", "C D", "E F"]), expected_items=2)
    assert top == "A B, C D"  # top-k queries fetch k + 1 rows to see ties
    assert format_answer("text", _result("location", ["Berlin"])) == "Berlin"


def test_format_answer_refuses_failed_queries() -> None:
    assert format_answer("number", "Error: no such table") is None
    assert format_answer("number", _result("x", [])) is None
    assert format_answer("set", _result("name", [])) == "none"


@pytest.mark.parametrize(("kind", "answer", "truth"), [
    ("number", "42", 42), ("number", "1234.50", 1234.5),
    ("set", "Ana Lee, Bo Chen, Cy Diaz", ["Ana Lee", "Bo Chen", "Cy Diaz"]),
    ("list", "A B, C D", ["A B", "C D"]), ("text", "Berlin", "Berlin")])
def test_corrupted_answers_are_wrong(kind: str, answer: str, truth) -> None:
    rng = random.Random(0)
    for _ in range(5):
        bad = corrupt_answer(answer, kind, rng)
        assert not check_answer(bad, GroundTruth(kind=kind, value=truth)).correct, bad
