"""A small run config (as YAML data) wired to a stack on loopback, for the trainer's
integration and fault tests: one place for its defaults; overrides merge per section."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def merge_sections(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``overrides``: a dict merges into the section of that name, else replaces."""

    out = dict(data)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def run_config_data(tmp_path: Path, *, model: str, engine_url: str, mcp_url: str,
                    judge_url: str, scenario_gen_url: str, set_id: str,
                    **overrides: Any) -> dict[str, Any]:
    """Two steps of G=4 on two scenarios, verifiable rewards (the judge calls no LLM), CPU."""

    data: dict[str, Any] = {
        "name": "it", "seed": 0, "output_dir": str(tmp_path / "runs"),
        "model": model, "steps": 2, "group_size": 4, "groups_per_step": 2,
        "policy": {"base_url": engine_url},
        "mcp": {"url": mcp_url},
        "judge": {"url": judge_url},
        "scenarios": {"url": scenario_gen_url, "set_id": set_id,
                      "max_train": 4, "max_val": 2},
        "reward": {"mode": "verifiable"},
        "rollout": {"max_turns": 2, "max_tokens_per_turn": 24, "max_context": 2048,
                    "min_tokens_per_turn": 8, "concurrency": 8},
        "train": {"lr": 1e-3, "device": "cpu"},
        "eval": {"every": 0},
        "status": {"enabled": False},
    }
    return merge_sections(data, overrides)
