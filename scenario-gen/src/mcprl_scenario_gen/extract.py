"""Getting a scenario batch out of an LLM's free text, for providers without json_schema.

Models wrap JSON in code fences, put prose (or ``<think>`` blocks) around it, answer a bare
array instead of the object, or name the list ``tasks``. :func:`parse_batch` tries each
plausible JSON block in order and validates it with pydantic; the error it raises is written
so it can go back to the model verbatim as the repair instruction.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator

from mcprl_common.json_text import json_candidates, loads_lenient, strip_reasoning

_LIST_KEYS = ("scenarios", "tasks", "items", "questions", "data", "results")


class ScenarioDraft(BaseModel):
    """One task as the LLM writes it (ART's shape)."""

    task: str = Field(min_length=10, max_length=2000)
    difficulty: int = Field(ge=1, le=5)

    @field_validator("task")
    @classmethod
    def _has_words(cls, value: str) -> str:
        value = value.strip()
        if sum(ch.isalpha() for ch in value) < 5:
            raise ValueError("task must be a sentence, not symbols")
        return value


def batch_json_schema(max_items: int) -> dict[str, Any]:
    """The JSON schema sent as ``response_format`` (and shown in the fallback prompt).

    Bounds on lengths and counts keep constrained decoding from running into max_tokens.
    """

    return {
        "type": "object",
        "properties": {
            "scenarios": {
                "type": "array",
                "minItems": 1,
                "maxItems": max_items,
                "items": {
                    "type": "object",
                    "properties": {
                        "task": {"type": "string", "minLength": 10, "maxLength": 400},
                        "difficulty": {"type": "integer", "enum": [1, 2, 3, 4, 5]},
                    },
                    "required": ["task", "difficulty"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["scenarios"],
        "additionalProperties": False,
    }


class ExtractionError(ValueError):
    """No valid batch in the text; the message says why, for the repair turn."""


def _as_batch_dict(data: Any) -> Any:
    if isinstance(data, list):
        return {"scenarios": data}
    if isinstance(data, dict):
        if "scenarios" in data:
            return data
        for key in _LIST_KEYS:
            if isinstance(data.get(key), list):
                return {"scenarios": data[key]}
        if "task" in data:
            return {"scenarios": [data]}
    return data


class ParsedBatch(BaseModel):
    """The valid drafts of a reply and why the others were dropped."""

    drafts: list[ScenarioDraft]
    dropped: list[str] = Field(default_factory=list)


def parse_batch(text: str) -> ParsedBatch:
    """Valid drafts from the first JSON block of ``text`` that holds any.

    Items that fail validation are dropped one by one (a batch with one bad difficulty is
    still worth keeping); :class:`ExtractionError` when nothing valid is left.
    """

    first_problem: str | None = None
    decoded_any = False
    for candidate in json_candidates(text):
        try:
            data = loads_lenient(candidate)
        except ValueError:
            continue
        decoded_any = True
        items = _as_batch_dict(data)
        if not isinstance(items, dict) or not isinstance(items.get("scenarios"), list):
            first_problem = first_problem or (
                'expected an object {"scenarios": [{"task": ..., "difficulty": ...}]}, got '
                + type(data).__name__)
            continue
        drafts, dropped = [], []
        for i, item in enumerate(items["scenarios"]):
            try:
                drafts.append(ScenarioDraft.model_validate(item))
            except ValidationError as exc:
                dropped.append(f"scenarios.{i}: {_summarise(exc)}")
        if drafts:
            return ParsedBatch(drafts=drafts, dropped=dropped)
        first_problem = first_problem or (
            "; ".join(dropped[:5]) if dropped else "the scenarios list is empty")
    salvaged = _salvage_items(text)
    if salvaged:
        return ParsedBatch(drafts=salvaged, dropped=["salvaged complete items from a reply "
                                                     "that was not valid JSON as a whole"])
    if not decoded_any:
        snippet = " ".join((text or "").split())[:120]
        raise ExtractionError(f"the reply contains no parseable JSON (it starts: {snippet!r})")
    raise ExtractionError(f"the JSON does not match the schema: {first_problem}")


def _salvage_items(text: str, limit_chars: int = 40_000) -> list[ScenarioDraft]:
    """Complete ``{"task": ..., "difficulty": ...}`` objects anywhere in the text.

    Rescues replies cut off at max_tokens: every item written before the cut is kept.
    """

    text = strip_reasoning(text)[:limit_chars]
    decoder = json.JSONDecoder()
    drafts: list[ScenarioDraft] = []
    i = text.find("{")
    while i >= 0:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict) and "task" in obj:
            with contextlib.suppress(ValidationError):
                drafts.append(ScenarioDraft.model_validate(obj))
            i = text.find("{", end)
        else:
            i = text.find("{", i + 1)
    return drafts


def _summarise(exc: ValidationError, limit: int = 5) -> str:
    parts = []
    for err in exc.errors()[:limit]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "root"
        parts.append(f"{where}: {err.get('msg')}")
    more = exc.error_count() - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
