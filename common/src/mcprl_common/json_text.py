"""JSON out of a model's free text, in one place (the judge's answers, scenario-gen's batches).

Models wrap JSON in code fences, put prose or ``<think>`` blocks around it, write raw control
characters inside strings, or leave a trailing comma. :func:`json_candidates` lists the
plausible snippets, most likely first; :func:`loads_lenient` decodes one, repairing the
commonest near-misses; :func:`first_json_value` is the first snippet that decodes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

_FENCE = re.compile(r"```[ \t]*(?:json[c5]?|javascript|js)?[ \t]*\n?(.*?)```", re.S | re.I)
THINK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.S | re.I)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
# strict=False: raw newlines or control characters inside strings are common in model output
# (and constrained decoders allow them); they do not change the meaning.
_DECODER = json.JSONDecoder(strict=False)


def strip_reasoning(text: str) -> str:
    """``text`` without ``<think>``/``<reasoning>`` blocks (their braces are not the answer)."""

    return THINK.sub("", text or "")


def json_candidates(text: str) -> list[str]:
    """Plausible JSON snippets of ``text``, most likely first, without duplicates: fenced
    blocks, the whole text, then top-level balanced ``{...}``/``[...]`` blocks."""

    text = strip_reasoning(text).strip()
    found: list[str] = []
    found.extend(m.group(1).strip() for m in _FENCE.finditer(text))
    found.append(text)
    found.extend(balanced_blocks(text))
    seen: set[str] = set()
    return [c for c in found if c and not (c in seen or seen.add(c))]


def balanced_blocks(text: str, limit: int = 8) -> list[str]:
    """Top-level ``{...}`` / ``[...]`` blocks, string- and escape-aware."""

    blocks: list[str] = []
    start = None
    stack: list[str] = []
    in_str = escaped = False
    for i, ch in enumerate(text):
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"' and stack:
            in_str = True
        elif ch in "{[":
            if not stack:
                start = i
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            if ch != stack[-1]:
                stack.clear()
                start = None
                continue
            stack.pop()
            if not stack and start is not None:
                blocks.append(text[start:i + 1])
                if len(blocks) >= limit:
                    break
                start = None
    return blocks


def loads_lenient(candidate: str) -> Any:
    """``json.loads`` that allows control characters in strings and trailing commas;
    ``ValueError`` when the snippet is not JSON even so."""

    try:
        return _DECODER.decode(candidate)
    except ValueError:
        repaired = _TRAILING_COMMA.sub(r"\1", candidate)
        if repaired == candidate:
            raise
        return _DECODER.decode(repaired)


def json_values(text: str) -> Iterator[Any]:
    """Every candidate of ``text`` that decodes, in :func:`json_candidates`' order."""

    for candidate in json_candidates(text):
        try:
            yield loads_lenient(candidate)
        except ValueError:
            continue


def first_json_value(text: str) -> Any:
    """The most likely JSON value in ``text``; ``ValueError`` when there is none."""

    for value in json_values(text):
        return value
    raise ValueError("the text contains no JSON value")
