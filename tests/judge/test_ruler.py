"""RULER's prompt (shared prefix once, numbered suffixes, dedupe, tools) and answer parsing."""

from __future__ import annotations

import json

import pytest

from mcprl_judge.judge_output import (
    JudgeOutputError,
    extract_json,
    parse_judgements,
    response_schema,
)
from mcprl_judge.ruler import DEFAULT_RUBRIC, build_prompt, common_prefix_len
from mcprl_testing.judge import sql_trajectory

TASK = "How many projects are active?"
Q = ("SELECT COUNT(*) FROM projects WHERE status='active'", '{"row_count": 1, "results": [4]}')


def test_common_prefix_len() -> None:
    a, b, c = {"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"x": 1}
    assert common_prefix_len([[a, b, c], [a, b], [a, b, c]]) == 2
    assert common_prefix_len([[a], [b]]) == 0
    assert common_prefix_len([]) == 0


def test_prompt_sends_shared_prefix_once_and_numbers_suffixes() -> None:
    group = [sql_trajectory(TASK, [Q], "4"), sql_trajectory(TASK, [], "I think 3"),
             sql_trajectory(TASK, [Q], "4"), sql_trajectory(TASK, [Q, Q], None)]
    prompt = build_prompt(TASK, group, DEFAULT_RUBRIC, 300)
    system, user = prompt.messages[0]["content"], prompt.messages[1]["content"]
    assert prompt.ids == ["1", "2", "3"]  # trajectories 0 and 2 are identical
    assert prompt.assignment == [0, 1, 0, 2]
    assert prompt.prefix_len == 2  # system prompt + task
    assert user.count("You are a helpful agent") == 1  # the system prompt, in <context> only
    assert '<trajectory id="3">' in user and '<trajectory id="4">' not in user
    assert "<tools>" in user and "run_query" in user and "<task>" in user
    assert "Grading standards" in system and "reaches the goal" in system
    context = user.split("<context>\n", 1)[1].split("\n</context>", 1)[0]
    assert [m["role"] for m in json.loads(context)] == ["system", "user"]
    first = user.split('<trajectory id="1">\n', 1)[1].split("\n</trajectory>", 1)[0]
    assert json.loads(first)[0]["role"] == "assistant"  # only the suffix
    assert prompt.chars == len(system) + len(user)


def test_identical_group_is_judged_as_one_whole_trajectory() -> None:
    group = [sql_trajectory(TASK, [Q], "4") for _ in range(3)]
    prompt = build_prompt(TASK, group, "be strict", 300)
    user = prompt.messages[1]["content"]
    assert prompt.ids == ["1"] and prompt.assignment == [0, 0, 0]
    assert "<context>" not in user and "You are a helpful agent" in user
    assert "be strict" in prompt.messages[0]["content"]


def test_schema_requires_one_entry_per_id() -> None:
    schema = response_schema(["1", "2"], bounds=True, explanation_max_chars=50)
    inner = schema["properties"]["scores"]
    assert inner["required"] == ["1", "2"] and inner["additionalProperties"] is False
    assert inner["properties"]["1"]["properties"]["score"] == {"type": "number", "minimum": 0,
                                                               "maximum": 1}
    loose = response_schema(["1"], bounds=False, explanation_max_chars=50)
    assert "maxLength" not in json.dumps(loose)


def test_parse_accepts_keyed_and_art_list_shapes() -> None:
    keyed = '{"scores": {"1": {"explanation": "good", "score": 0.9}, "2": {"score": 1.7}}}'
    parsed = parse_judgements(f"Here you go:\n```json\n{keyed}\n```", ["1", "2"])
    assert parsed["1"].score == 0.9 and parsed["2"].score == 1.0  # clipped
    listed = ('{"scores": [{"trajectory_id": "2", "explanation": "b", "score": 0.1},'
              ' {"trajectory_id": "trajectory 1", "explanation": "a", "score": 0.6}]}')
    parsed = parse_judgements(listed, ["1", "2"])
    assert parsed["1"].explanation == "a" and parsed["2"].score == 0.1


@pytest.mark.parametrize(
    ("text", "kind", "words"),
    [
        ("no json here", "invalid_output", "no JSON"),
        ("", "invalid_output", "empty"),
        ('{"scores": {"1": {"score": 0.5}}}', "wrong_score_count", "missing ids 2"),
        ('{"scores": {"1": {"score": 0.5}, "2": {"score": 0.5}, "3": {"score": 1}}}',
         "wrong_score_count", "unknown ids 3"),
        ('{"scores": {"1": {"score": "high"}, "2": {"score": 0.5}}}', "invalid_output",
         "invalid score entry"),
        ('{"scores": [{"trajectory_id": 1, "score": 0.5}, {"trajectory_id": 1, "score": 0.2}]}',
         "wrong_score_count", "repeat"),
    ],
)
def test_parse_errors_name_the_problem(text: str, kind: str, words: str) -> None:
    with pytest.raises(JudgeOutputError) as info:
        parse_judgements(text, ["1", "2"])
    assert info.value.kind == kind and words in str(info.value)


def test_extract_json_finds_first_balanced_object() -> None:
    assert extract_json('thinking... {"a": [1, 2]} trailing {"b": 1}') == {"a": [1, 2]}


def test_extract_json_tolerates_raw_control_characters_in_strings() -> None:
    assert extract_json('{"a": "line\nbreak\x04"}') == {"a": "line\nbreak\x04"}
    assert extract_json('{"a": "tab\there"}') == {"a": "tab\there"}
