"""Scenario sets for a run (scenario-gen over HTTP or a local directory) and the
deterministic schedule of which scenarios each step trains on.

The schedule is a pure function of ``(seed, step)``: a resumed run picks exactly the
scenarios the crashed run would have, so no step is lost or repeated.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from mcprl_common.http import request_json
from mcprl_common.wire import Scenario
from mcprl_trainer.config import ScenarioSourceConfig


@dataclass(frozen=True)
class ScenarioSplits:
    train: list[Scenario]
    val: list[Scenario]


def _read_jsonl(path: Path) -> list[Scenario]:
    if not path.exists():
        return []
    return [Scenario.model_validate_json(line) for line in path.read_text().splitlines()
            if line.strip()]


def _items(data: Any) -> list[dict[str, Any]]:
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        for key in ("scenarios", "data", "items"):
            if isinstance(data.get(key), list):
                return data[key]
    raise ValueError("scenario-gen answered neither a list nor {'scenarios': [...]}")


async def _fetch_split(client: httpx.AsyncClient, url: str, set_id: str,
                       split: str) -> list[Scenario]:
    data = await request_json(client, "GET",
                              f"{url.rstrip('/')}/v1/scenario-sets/{set_id}/scenarios",
                              params={"split": split})
    return [Scenario.model_validate(item) for item in _items(data)]


async def load_scenarios(source: ScenarioSourceConfig) -> ScenarioSplits:
    """Both splits; local directory first when both are configured."""

    if source.dir is not None:
        base = Path(source.dir) / source.set_id
        if not base.is_dir():
            raise FileNotFoundError(f"scenario set directory {base} does not exist")
        train, val = _read_jsonl(base / "train.jsonl"), _read_jsonl(base / "val.jsonl")
    else:
        assert source.url is not None
        async with httpx.AsyncClient(timeout=60.0) as client:
            train = await _fetch_split(client, source.url, source.set_id, "train")
            val = await _fetch_split(client, source.url, source.set_id, "val")
    if not train:
        raise ValueError(f"scenario set {source.set_id!r} has no train scenarios")
    train.sort(key=lambda s: s.id)  # file order must not change the schedule
    val.sort(key=lambda s: s.id)
    if source.max_train:
        train = train[: source.max_train]
    if source.max_val:
        val = val[: source.max_val]
    return ScenarioSplits(train, val)


def step_scenarios(train: list[Scenario], step: int, per_step: int, seed: int) -> list[Scenario]:
    """The scenarios of ``step`` (1-based): epochs over a per-epoch seeded permutation."""

    n = len(train)
    out: list[Scenario] = []
    for k in range((step - 1) * per_step, step * per_step):
        epoch, pos = divmod(k, n)
        order = list(range(n))
        random.Random(f"{seed}/epoch/{epoch}").shuffle(order)
        out.append(train[order[pos]])
    return out
