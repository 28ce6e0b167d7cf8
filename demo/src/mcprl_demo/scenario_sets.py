"""``sql`` scenario sets for the warm start, made by scenario-gen's own strategy and split.

The warm start wants *many* train scenarios (every template with many entities) and a
val split whose entities were never seen in training, so it skips scenario-gen's selection:
its pipeline's candidate pool (``generate_pool``: the ``sql`` strategy over a live MCP
session), all of it through scenario-gen's leakage-free split. The set is
written in the layout the trainer reads (``<dir>/{train,val}.jsonl``) and is deterministic
for a seed and a database.
"""

from __future__ import annotations

import json
from pathlib import Path

from mcprl_common.wire import Scenario


async def generate_sql_set(
    mcp_url: str,
    out_dir: Path,
    *,
    n: int,
    seed: int,
    val_fraction: float = 0.2,
    holdout_templates: bool = False,
    holdout_entities: bool = True,
    db_seed: int | None = None,
) -> tuple[list[Scenario], list[Scenario]]:
    """Generate, split and write one set; ``db_seed`` is recorded in each scenario's
    metadata (which database the answers hold for)."""

    from mcprl_scenario_gen.pipeline import generate_pool
    from mcprl_scenario_gen.settings import ScenarioGenSettings
    from mcprl_scenario_gen.split import leaks, split_scenarios
    from mcprl_scenario_gen.store import atomic_write_bytes
    from mcprl_scenario_gen.strategies import GenerationParams

    params = GenerationParams(mcp_url=mcp_url, strategy="sql", n=n, seed=seed,
                              val_fraction=val_fraction, holdout_templates=holdout_templates,
                              holdout_entities=holdout_entities)
    pool, server = await generate_pool(params, settings=ScenarioGenSettings(), pool_target=n)
    split = split_scenarios(pool, val_fraction, seed, holdout_templates=holdout_templates,
                            holdout_entities=holdout_entities)
    extra = {} if db_seed is None else {"db_seed": db_seed}
    train = [s.model_copy(update={"split": "train", "metadata": {**s.metadata, **extra}})
             for s in split.train]
    val = [s.model_copy(update={"split": "val", "metadata": {**s.metadata, **extra}})
           for s in split.val]
    shared = leaks(train, val)
    if shared["ids"]:
        raise RuntimeError(f"train and val share scenario ids: {sorted(shared['ids'])[:3]}")
    write_set(out_dir, train, val)
    manifest = {"id": out_dir.name, "strategy": "sql", "seed": seed, "requested": n,
                "pool": len(pool), "counts": {"train": len(train), "val": len(val)},
                "dropped": split.dropped, "val_entities": split.val_entities,
                "val_templates": split.val_templates, "tools_hash": server.tools_hash,
                "params": params.public()}
    atomic_write_bytes(out_dir / "manifest.json", json.dumps(manifest, indent=2).encode())
    return train, val


def write_set(out_dir: Path, train: list[Scenario], val: list[Scenario]) -> None:
    """``train.jsonl`` and ``val.jsonl`` in the layout the trainer reads, atomically."""

    from mcprl_scenario_gen.store import atomic_write_bytes, jsonl_bytes

    atomic_write_bytes(out_dir / "train.jsonl", jsonl_bytes(train))
    atomic_write_bytes(out_dir / "val.jsonl", jsonl_bytes(val))


def drop_entities(scenarios: list[Scenario], held_out: set[str]) -> list[Scenario]:
    """Scenarios that name none of the ``held_out`` entities."""

    return [s for s in scenarios if not set(s.entities) & held_out]
