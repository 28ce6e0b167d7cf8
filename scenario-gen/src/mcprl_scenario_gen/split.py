"""Train/val split without leakage.

Plain mode shuffles and cuts. Holdout modes keep whole templates and/or whole entities on
one side: with ``holdout_templates`` no template appears in both splits, with
``holdout_entities`` no entity (a department, a year, ...) does. A scenario whose entities
fall on both sides cannot go anywhere without leaking and is dropped; callers oversample.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass, field

from mcprl_common.wire import Scenario


@dataclass
class SplitResult:
    train: list[Scenario]
    val: list[Scenario]
    dropped: int = 0
    val_templates: list[str] = field(default_factory=list)
    val_entities: list[str] = field(default_factory=list)


def _pick_val_share(keys: list[str], weights: dict[str, int], fraction: float,
                    rng: random.Random) -> set[str]:
    """Keys whose summed weight comes closest to ``fraction`` of the total (greedy, seeded).

    Keeps at least one key on each side when there are two or more keys and fraction > 0.
    """

    if fraction <= 0 or len(keys) < 2:
        return set()
    order = sorted(keys)
    rng.shuffle(order)
    total = sum(weights[k] for k in keys)
    goal = fraction * total
    chosen: set[str] = set()
    acc = 0
    for key in order:
        if len(chosen) >= len(keys) - 1:
            break
        if acc + weights[key] <= goal or not chosen:
            chosen.add(key)
            acc += weights[key]
    return chosen


def entity_type(entity: str) -> str:
    return entity.split("=", 1)[0] if "=" in entity else ""


def split_scenarios(
    scenarios: list[Scenario],
    val_fraction: float,
    seed: int,
    *,
    holdout_templates: bool = False,
    holdout_entities: bool = False,
) -> SplitResult:
    """Assign each scenario to train or val (or drop it) deterministically from ``seed``."""

    rng = random.Random(f"split:{seed}")
    pool = sorted(scenarios, key=lambda s: s.id)
    if not holdout_templates and not holdout_entities:
        rng.shuffle(pool)
        n_val = round(len(pool) * val_fraction)
        if val_fraction > 0 and n_val == 0 and len(pool) >= 2:
            n_val = 1
        return SplitResult(train=pool[n_val:], val=pool[:n_val])

    # A val scenario needs a val template AND val entities, so with both holdouts each
    # dimension holds out p with p^2 / (1-p)^2 = f / (1-f): the split keeps the asked ratio.
    share = val_fraction
    if holdout_templates and holdout_entities and 0 < val_fraction < 1:
        root = math.sqrt(val_fraction / (1 - val_fraction))
        share = root / (1 + root)

    val_templates: set[str] = set()
    if holdout_templates:
        # Stratified by difficulty, so val keeps questions of every level.
        by_level: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for s in pool:
            by_level[s.difficulty][s.template or f"free:{s.id}"] += 1
        for level in sorted(by_level):
            weights = by_level[level]
            val_templates |= _pick_val_share(list(weights), weights, share, rng)

    val_entities: set[str] = set()
    if holdout_entities:
        by_type: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for s in pool:
            for e in s.entities:
                by_type[entity_type(e)][e] += 1
        for etype in sorted(by_type):
            counts = by_type[etype]
            val_entities |= _pick_val_share(list(counts), counts, share, rng)

    train: list[Scenario] = []
    val: list[Scenario] = []
    undecided: list[Scenario] = []
    dropped = 0
    for s in pool:
        sides: set[str] = set()
        if holdout_templates:
            sides.add("val" if (s.template or f"free:{s.id}") in val_templates else "train")
        if holdout_entities:
            sides |= {"val" if e in val_entities else "train" for e in s.entities}
        if len(sides) > 1:
            dropped += 1
        elif sides:
            (val if "val" in sides else train).append(s)
        else:
            undecided.append(s)
    # Scenarios without template/entity constraints top up val towards the fraction.
    rng.shuffle(undecided)
    total = len(train) + len(val) + len(undecided)
    want_val = max(0, round(total * val_fraction) - len(val))
    val.extend(undecided[:want_val])
    train.extend(undecided[want_val:])
    rng.shuffle(train)
    rng.shuffle(val)
    return SplitResult(train=train, val=val, dropped=dropped,
                       val_templates=sorted(val_templates), val_entities=sorted(val_entities))


def leaks(train: list[Scenario], val: list[Scenario]) -> dict[str, set[str]]:
    """What the two splits share: ids, templates, entities (empty sets mean no leakage)."""

    def templates(items: list[Scenario]) -> set[str]:
        return {s.template for s in items if s.template}

    def entities(items: list[Scenario]) -> set[str]:
        return {e for s in items for e in s.entities}

    return {
        "ids": {s.id for s in train} & {s.id for s in val},
        "templates": templates(train) & templates(val),
        "entities": entities(train) & entities(val),
    }
