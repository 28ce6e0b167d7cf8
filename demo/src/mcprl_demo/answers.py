"""How the scripted expert reads tool results and writes its final answer.

The expert answers from what the tools returned in *its own* session (never from the stored
ground truth), formatted the way the scenarios ask: the number only, a name, or names
separated by commas. Optional noise corrupts some answers on purpose, so a warm-started
agent can be made imperfect in a controlled way.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

_TABLE_REF = re.compile(r"\b(?:FROM|JOIN)\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)
_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def tables_in_sql(sql: str) -> list[str]:
    """Tables a query reads, in order of first mention (CTE names included; callers
    intersect with ``list_tables``)."""

    seen: list[str] = []
    for name in _TABLE_REF.findall(sql):
        if name.lower() not in (s.lower() for s in seen):
            seen.append(name)
    return seen


def last_tool_response(text: str) -> str | None:
    """The content of the last ``<tool_response>`` block of rendered text, if any."""

    found = _RESPONSE.findall(text)
    return found[-1] if found else None


def parse_json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def format_number(value: Any) -> str:
    """Integers without decimals, other numbers rounded to two (what the tasks ask)."""

    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.2f}"


def _first_column(result: dict[str, Any]) -> list[Any]:
    rows = result.get("results") or []
    columns = result.get("columns") or []
    out = []
    for row in rows:
        if isinstance(row, dict):
            key = columns[0] if columns and columns[0] in row else next(iter(row), None)
            out.append(row.get(key) if key is not None else None)
        elif isinstance(row, list | tuple) and row:
            out.append(row[0])
    return out


def format_answer(kind: str, result: Any, expected_items: int | None = None,
                  number_style: str = "raw") -> str | None:
    """The answer a careful analyst would give from a ``run_query`` result, or None when the
    result holds no usable rows (a failed query).

    ``expected_items`` caps list/set answers (top-k queries fetch k + 1 rows to see ties).
    ``number_style`` ``raw`` copies a number exactly as the result shows it (what a small
    model can learn: a copy, no arithmetic; the judge compares with a tolerance), ``rounded``
    writes integers bare and other numbers with two decimals.
    """

    if not isinstance(result, dict) or "results" not in result:
        return None
    values = _first_column(result)
    if kind in ("set", "list"):
        if expected_items is not None:
            values = values[:expected_items]
        return ", ".join(str(v) for v in values) if values else "none"
    if not values or values[0] is None:
        return None
    if kind == "number":
        if number_style == "raw" and isinstance(values[0], int | float):
            return json.dumps(values[0])
        return format_number(values[0])
    return str(values[0])


def corrupt_answer(answer: str, kind: str, rng: random.Random) -> str:
    """A plausible wrong answer of the same shape (noise in the demonstrations)."""

    if kind == "number":
        try:
            value = float(answer)
        except ValueError:
            return answer + "0"
        factor = rng.choice([0.5, 0.7, 1.3, 2.0])
        return format_number(round(value * factor, 2) if not value.is_integer()
                             else int(value * factor) + rng.randint(1, 3))
    if kind in ("set", "list"):
        items = [s for s in answer.split(", ") if s]
        if len(items) > 1:
            items.pop(rng.randrange(len(items)))
            if kind == "list":
                items.reverse()
            return ", ".join(items)
        return "none"
    return answer[::-1].title()


def guess_answer(kind: str, truth: Any, rng: random.Random) -> str:
    """What an agent that skipped the query might answer: a number of the right magnitude
    class but far off (partial credit stays near zero), or no names at all."""

    if kind == "number" and isinstance(truth, int | float):
        value = float(truth) * rng.choice([0.2, 0.3, 3.0, 5.0])
        if abs(value) >= 10:
            digits = len(str(int(abs(value)))) - 2
            value = round(value, -digits)
        return format_number(round(value, 2))
    return "unknown"
