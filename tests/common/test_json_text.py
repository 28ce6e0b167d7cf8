"""JSON out of model text: fences, prose, reasoning blocks, raw control characters, trailing
commas; and a clear error when there is none."""

from __future__ import annotations

import pytest

from mcprl_common.json_text import first_json_value, json_candidates, loads_lenient


def test_fenced_json_comes_first() -> None:
    text = 'Here:\n```json\n{"a": 1}\n```\nand {"b": 2}'
    assert first_json_value(text) == {"a": 1}


def test_reasoning_blocks_are_not_the_answer() -> None:
    assert first_json_value('<think>maybe {"x": 0}</think> {"x": 1}') == {"x": 1}


def test_first_balanced_block_in_prose() -> None:
    assert first_json_value('thinking... {"a": [1, "}"]} trailing {"b": 1}') == {"a": [1, "}"]}
    assert json_candidates('x {"a": 1} y [2]')[1:] == ['{"a": 1}', "[2]"]


def test_near_misses_are_repaired() -> None:
    assert loads_lenient('{"a": [1, 2,], }') == {"a": [1, 2]}
    assert loads_lenient('{"a": "line\nbreak"}') == {"a": "line\nbreak"}
    with pytest.raises(ValueError):
        loads_lenient('{"a": }')


def test_no_json_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="no JSON"):
        first_json_value("no braces at all")
