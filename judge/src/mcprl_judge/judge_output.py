"""What the judge model must answer, and how its answer is read and checked.

The answer is an object keyed by trajectory id (``{"scores": {"1": {"explanation", "score"},
...}}``), so a json_schema with every id required makes a constrained decoder produce exactly
one score per trajectory. Models without structured output answer in text; we pull the JSON
out of it, also accept ART's list shape (``[{"trajectory_id", "explanation", "score"}]``),
and report what is wrong in words the model can act on when we ask again.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from mcprl_common.json_text import first_json_value


class JudgeOutputError(ValueError):
    """The judge's answer is unusable; the message is sent back to the judge on retry."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind  # "invalid_output" or "wrong_score_count" (a metrics label)


class Judgement(BaseModel):
    """The judge's verdict on one trajectory."""

    explanation: str = ""
    score: float


class _ListItem(Judgement):
    trajectory_id: str | int


def response_schema(ids: list[str], *, bounds: bool, explanation_max_chars: int) -> dict:
    """JSON schema of the answer for these trajectory ids (reasoning first, then the score)."""

    explanation: dict[str, Any] = {"type": "string"}
    score: dict[str, Any] = {"type": "number"}
    if bounds:
        explanation["maxLength"] = explanation_max_chars
        score.update(minimum=0, maximum=1)
    item = {
        "type": "object",
        "properties": {"explanation": explanation, "score": score},
        "required": ["explanation", "score"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {
            "scores": {
                "type": "object",
                "properties": {i: item for i in ids},
                "required": list(ids),
                "additionalProperties": False,
            }
        },
        "required": ["scores"],
        "additionalProperties": False,
    }


def format_instructions(ids: list[str], explanation_max_chars: int) -> str:
    """The answer format in words, with an example (for every mode; models follow examples)."""

    example = {"scores": {i: {"explanation": "...", "score": 0.5} for i in ids[:2]}}
    return (
        "Answer with one JSON object and nothing else, of this form:\n"
        f"{json.dumps(example)}\n"
        f"with exactly one entry for each trajectory id ({', '.join(ids)}), each a short "
        f"explanation (at most {explanation_max_chars} characters) and a score between 0 and 1."
    )


def extract_json(text: str) -> Any:
    """The most likely JSON value in ``text`` (:func:`mcprl_common.json_text.first_json_value`:
    whole, in a ``` fence, or the first balanced {...}), as a judge output error if none."""

    if not text.strip():
        raise JudgeOutputError("the answer was empty", "invalid_output")
    try:
        return first_json_value(text)
    except ValueError:
        raise JudgeOutputError("the answer contains no JSON object", "invalid_output") from None


def _norm_id(key: object) -> str:
    """'1', 1, 'trajectory 1', 'trajectory_1' and '#1' all name trajectory 1."""

    text = str(key).strip()
    m = re.fullmatch(r"\D*?(\d+)", text)
    return str(int(m.group(1))) if m else text


def _clip(score: float) -> float:
    if math.isnan(score):
        raise JudgeOutputError("a score is NaN", "invalid_output")
    return min(1.0, max(0.0, score))


def parse_judgements(text: str, ids: list[str]) -> dict[str, Judgement]:
    """Read the judge's answer; exactly one judgement per id, scores clipped into [0, 1]."""

    data = extract_json(text)
    if isinstance(data, dict) and "scores" in data:
        data = data["scores"]
    items: dict[str, Judgement] = {}
    try:
        if isinstance(data, list):
            for raw in data:
                item = _ListItem.model_validate(raw)
                items[_norm_id(item.trajectory_id)] = Judgement(
                    explanation=item.explanation, score=item.score
                )
            if len(data) != len(items):
                raise JudgeOutputError(
                    f"trajectory ids repeat: got {len(data)} scores for {len(items)} ids, "
                    f"expected one score for each of {', '.join(ids)}", "wrong_score_count")
        elif isinstance(data, dict):
            for key, raw in data.items():
                items[_norm_id(key)] = Judgement.model_validate(raw)
        else:
            raise JudgeOutputError("expected a JSON object with 'scores'", "invalid_output")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise JudgeOutputError(f"invalid score entry ({where}: {first.get('msg')})",
                               "invalid_output") from exc
    missing = [i for i in ids if i not in items]
    unknown = [k for k in items if k not in ids]
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing ids {', '.join(missing)}")
        if unknown:
            parts.append(f"unknown ids {', '.join(unknown[:5])}")
        raise JudgeOutputError(
            f"expected exactly {len(ids)} scores (ids {', '.join(ids)}), got {len(items)}: "
            + "; ".join(parts), "wrong_score_count")
    return {i: Judgement(explanation=items[i].explanation.strip(), score=_clip(items[i].score))
            for i in ids}


class JudgeAnswer(BaseModel):
    """What the cache stores for a group: one judgement per unique trajectory, in order."""

    judgements: list[Judgement] = Field(default_factory=list)
