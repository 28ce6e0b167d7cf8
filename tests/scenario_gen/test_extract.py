"""The JSON extraction + validation fallback on replies shaped like real model output."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcprl_scenario_gen.extract import ExtractionError, batch_json_schema, parse_batch

pytestmark = pytest.mark.timeout(10)
REPLIES = Path(__file__).parent / "fixtures" / "replies"

# fixture -> (valid drafts, dropped items) or the error it must name
EXPECTED: dict[str, tuple[int, int] | str] = {
    "fenced_json.txt": (3, 0),
    "think_then_json.txt": (2, 0),
    "bare_array.txt": (2, 0),
    "tasks_key_string_difficulty.txt": (2, 0),
    "trailing_commas.txt": (2, 0),
    "braces_in_prose_and_strings.txt": (2, 0),
    "partially_invalid.txt": (2, 2),
    "truncated.txt": (1, 1),
    "gibberish.txt": "no parseable JSON",
    "refusal.txt": "no parseable JSON",
    "wrong_shape.txt": "does not match the schema",
}


def test_every_fixture_has_an_expectation() -> None:
    assert sorted(p.name for p in REPLIES.glob("*.txt")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reply_fixture(name: str) -> None:
    text = (REPLIES / name).read_text(encoding="utf-8")
    expected = EXPECTED[name]
    if isinstance(expected, str):
        with pytest.raises(ExtractionError, match=expected):
            parse_batch(text)
        return
    parsed = parse_batch(text)
    assert (len(parsed.drafts), len(parsed.dropped)) == expected
    for draft in parsed.drafts:
        assert 1 <= draft.difficulty <= 5
        assert len(draft.task) >= 10 and draft.task == draft.task.strip()


def test_strings_keep_braces_and_quotes() -> None:
    parsed = parse_batch((REPLIES / "braces_in_prose_and_strings.txt").read_text())
    assert parsed.drafts[0].task.startswith("For the department named 'Sales {EMEA}'")
    assert '"Data Science"' in parsed.drafts[1].task


def test_string_difficulty_is_coerced_and_think_block_ignored() -> None:
    parsed = parse_batch((REPLIES / "tasks_key_string_difficulty.txt").read_text())
    assert [d.difficulty for d in parsed.drafts] == [2, 4]
    parsed = parse_batch((REPLIES / "think_then_json.txt").read_text())
    assert "draft" not in {d.task for d in parsed.drafts}


def test_error_message_is_usable_as_repair_instruction() -> None:
    with pytest.raises(ExtractionError) as info:
        parse_batch('{"scenarios": [{"task": "x", "difficulty": 9}]}')
    message = str(info.value)
    assert "scenarios.0" in message and "difficulty" in message


def test_schema_bounds_items_and_lengths() -> None:
    schema = batch_json_schema(4)
    items = schema["properties"]["scenarios"]
    assert items["maxItems"] == 4
    assert items["items"]["properties"]["difficulty"]["enum"] == [1, 2, 3, 4, 5]
    assert items["items"]["required"] == ["task", "difficulty"]
