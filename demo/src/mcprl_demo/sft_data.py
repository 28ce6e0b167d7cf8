"""SFT rows (token ids + assistant mask) and what they cost: lengths and where tokens go.

The rows themselves come from the trainer's token records (``TokenRecord.flatten``), so the
mask is the trainer's own: 1 exactly on the tokens a model has to sample (tool calls and the
closing ``<|im_end|>``), 0 on the system prompt, tool schemas, tool results and template glue.
"""

from __future__ import annotations

from statistics import mean
from typing import Any


def assistant_spans(mask: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of every run of 1s in ``mask`` (one per assistant turn)."""

    spans: list[tuple[int, int]] = []
    start = None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


def describe_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Token budget of a set of SFT rows (for the report and for sizing SFT and RL)."""

    if not rows:
        return {"rows": 0, "mean_tokens": 0.0, "max_tokens": 0, "mean_trained_tokens": 0.0,
                "prompt_tokens": 0, "total_tokens": 0}
    lengths = [len(r["input_ids"]) for r in rows]
    trained = [sum(r["mask"]) for r in rows]
    prompt = [r["mask"].index(1) if 1 in r["mask"] else len(r["mask"]) for r in rows]
    return {
        "rows": len(rows),
        "mean_tokens": mean(lengths),
        "max_tokens": max(lengths),
        "mean_trained_tokens": mean(trained),
        "prompt_tokens": min(prompt),  # system prompt + tool schemas + shortest task
        "total_tokens": sum(lengths),
        "turns_per_row": mean(len(assistant_spans(r["mask"])) for r in rows),
    }
