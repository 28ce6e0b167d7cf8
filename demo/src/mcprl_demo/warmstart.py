"""``make warm-start``: build the demo's small agent from scratch, reproducibly.

    python -m mcprl_demo.warmstart --config configs/warmstart.yaml [--stages ...]

Stages (each writes under ``work_dir`` and can be re-run alone):

1. ``scenarios``: a ``sql`` scenario set (train/val, entities held out) from the real MCP
   server, made by scenario-gen's own strategy, deterministic from the seed.
2. ``expert``: the scripted expert solves every train scenario through the real MCP tools
   inside the trainer's agent loop; its token records become SFT rows (ids + assistant mask).
3. ``sft``: full-parameter SFT of the base model on those rows (CPU or GPU), saved as an HF
   model dir at ``output_dir``. Needs only torch, transformers and PyYAML.
4. ``eval``: held-out success (val split) of the base and of the fine-tuned model, served
   by our engine and run through the trainer's agent loop.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

from mcprl_common.process import sigterm_as_interrupt
from mcprl_demo.warmstart_config import WarmStartConfig, load_warmstart_config

STAGES = ("scenarios", "expert", "sft", "eval")
log = logging.getLogger("mcprl_demo.warmstart")


def _say(msg: str) -> None:
    print(f"[warm-start {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


class Workspace:
    """Where each stage reads and writes; paths only, no I/O at construction."""

    def __init__(self, cfg: WarmStartConfig) -> None:
        self.cfg = cfg
        self.root = cfg.work_dir
        self.scenario_dir = self.root / "scenarios"
        self.set_dir = self.scenario_dir / cfg.set_id
        self.demos = self.root / "demos.jsonl"
        self.sft_rows = self.root / "sft.jsonl"
        self.expert_stats = self.root / "expert.json"
        self.sft_stats = self.root / "sft.json"
        self.eval_stats = self.root / "eval.json"
        self.stack_dir = self.root / "stack"

    @property
    def base_path(self) -> Path:
        spec = self.cfg.base.spec
        if not spec:
            return self.cfg.base.path
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
        return self.root / f"base-{digest}"


# -- shared services -------------------------------------------------------------------------
class Services:
    """The MCP servers (one per database seed) and engines the stages need, started lazily
    as local processes and stopped when the run ends."""

    def __init__(self, ws: Workspace, exits: ExitStack) -> None:
        self.ws = ws
        self.exits = exits
        self._mcp: dict[int, str] = {}

    def _stack(self, services: list[str], name: str, *, model: str | None = None,
               db_seed: int | None = None):
        from mcprl_stack import LocalStack, StackSettings

        sc = self.ws.cfg.scenarios
        config = StackSettings(
            services=services, ports=dict.fromkeys(services, 0),
            runs_dir=self.ws.stack_dir / name, model=model or "models/tiny-learn",
            env={"INFERENCE_LOG_LEVEL": "warning", "MCP_LOG_LEVEL": "warning",
                 # the caller's engine knobs, e.g. INFERENCE_KV_CACHE_MEMORY_GB on a shared GPU
                 **{k: v for k, v in os.environ.items() if k.startswith("INFERENCE_")},
                 "MCP_DB_PRESET": sc.db_preset,
                 "MCP_DB_SEED": str(sc.db_seed if db_seed is None else db_seed)},
            inherit_env=False,
        )
        stack = LocalStack(config)
        stack.start()
        self.exits.callback(stack.stop)
        return stack

    def mcp_url(self, db_seed: int | None = None) -> str:
        seed = self.ws.cfg.scenarios.db_seed if db_seed is None else db_seed
        if seed not in self._mcp:
            stack = self._stack(["mcp-server"], f"mcp-db{seed}", db_seed=seed)
            assert stack.mcp_url is not None
            self._mcp[seed] = stack.mcp_url
            _say(f"MCP server (database seed {seed}) up at {self._mcp[seed]}")
        return self._mcp[seed]

    def engine(self, model: Path, name: str):
        """Our engine serving ``model``; returns (base_url, served model name, stop)."""

        stack = self._stack(["inference"], name, model=str(model.resolve()))
        return f"{stack.urls['inference']}/v1", stack.served_model or str(model), stack.stop


# -- stages ------------------------------------------------------------------------------------
def ensure_base(ws: Workspace) -> Path:
    """The base model dir; built first when the config gives a tiny-model shape."""

    path = ws.base_path
    if (path / "config.json").exists():
        return path
    spec = ws.cfg.base.spec
    if not spec:
        raise FileNotFoundError(f"base model {path} is missing: run `make base-model` "
                                "(SmolLM2) or `make tiny-model`")
    from mcprl_inference.tiny_model import TinySpec, build_model

    path.mkdir(parents=True, exist_ok=True)
    params = build_model(TinySpec(name=path.name, **spec), path, ws.cfg.seed)
    if ws.cfg.sft.init == "random":  # SFT starts from the config: keep the dir small to carry
        for weights in path.glob("*.safetensors"):
            weights.unlink()
    _write_json(path / "mcprl-tiny.json", {"name": path.name, "parameters": params,
                                            "seed": ws.cfg.seed, "spec": spec})
    _say(f"built base model {path} ({params:,} parameters)")
    return path


def _renderer(ws: Workspace):
    from transformers import AutoTokenizer

    from mcprl_trainer.rendering import ChatRenderer

    return ChatRenderer(AutoTokenizer.from_pretrained(ensure_base(ws)))


def _rollout_settings(ws: Workspace, temperature: float | None = None):
    from mcprl_demo.warmstart_config import trainer_rollout_section
    from mcprl_trainer.config import RolloutConfig
    from mcprl_trainer.rollout import RolloutSettings

    ro = RolloutConfig(**trainer_rollout_section(ws.cfg.trainer_config))
    return RolloutSettings.from_config(ro, temperature=temperature)


def stage_scenarios(ws: Workspace, services: Services) -> None:
    """The eval database's set (its val split holds entities out), plus the scenarios of the
    extra databases for training (minus those naming a val entity, if configured)."""

    from mcprl_demo.scenario_sets import drop_entities, generate_sql_set, write_set

    sc = ws.cfg.scenarios

    def make(seed: int, out: Path, val_fraction: float):
        return asyncio.run(generate_sql_set(
            services.mcp_url(seed), out, n=sc.n, seed=sc.seed, val_fraction=val_fraction,
            holdout_templates=sc.holdout_templates, holdout_entities=sc.holdout_entities,
            db_seed=seed))

    train, val = make(sc.db_seed, ws.scenario_dir / f"db{sc.db_seed}", sc.val_fraction)
    if not sc.include_eval_db_train:
        train = []
    held_out = {e for s in val for e in s.entities}
    for seed in sc.train_db_seeds:
        extra, _ = make(seed, ws.scenario_dir / f"db{seed}", 0.0)
        kept = drop_entities(extra, held_out) if sc.exclude_val_entities else extra
        _say(f"  database seed {seed}: {len(kept)} of {len(extra)} scenarios kept for training")
        train += kept
    write_set(ws.set_dir, train, val)
    _say(f"scenario set {ws.cfg.set_id}: {len(train)} train / {len(val)} val "
         f"({len(held_out)} held-out entities)")


def _db_seed(scenario, default: int) -> int:
    return int(scenario.metadata.get("db_seed", default))


def _load_split(ws: Workspace, split: str):
    from mcprl_common.wire import Scenario

    path = ws.set_dir / f"{split}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run the 'scenarios' stage first")
    rows = [Scenario.model_validate_json(line) for line in path.read_text().splitlines()
            if line.strip()]
    return sorted(rows, key=lambda s: s.id)


def stage_expert(ws: Workspace, services: Services) -> dict[str, Any]:
    from mcprl_demo.expert import demonstrate, dumps_rows
    from mcprl_demo.sft_data import describe_rows

    cfg = ws.cfg
    train = [s for s in _load_split(ws, "train") if s.ground_truth and s.ground_truth.sql]
    renderer = _renderer(ws)
    settings = _rollout_settings(ws)
    started = time.perf_counter()
    demos = []
    for seed in sorted({_db_seed(s, cfg.scenarios.db_seed) for s in train}):
        part = [s for s in train if _db_seed(s, cfg.scenarios.db_seed) == seed]
        demos += asyncio.run(demonstrate(
            part, mcp_url=services.mcp_url(seed), renderer=renderer, settings=settings,
            noise=cfg.expert.noise, noise_kind=cfg.expert.noise_kind, seed=cfg.seed,
            concurrency=cfg.expert.concurrency, number_style=cfg.expert.number_style))
    seconds = time.perf_counter() - started
    completed = [d for d in demos if d.result.trajectory.finish_reason == "completed"]
    keep = [d for d in completed if d.correct or d.noisy or cfg.expert.include_wrong]
    rows = [d.sft_row() for d in keep]
    ws.demos.write_text(dumps_rows([d.trajectory_row() for d in demos]))
    ws.sft_rows.write_text(dumps_rows(rows))
    clean = [d for d in demos if not d.noisy]
    stats = {
        "scenarios": len(train), "completed": len(completed), "kept": len(keep),
        "expert_success_rate": sum(d.correct for d in clean) / max(1, len(clean)),
        "noisy": sum(d.noisy for d in demos),
        "failures": [{"task": d.scenario.task, "template": d.scenario.template,
                      "answer": d.result.trajectory.final_answer, "detail": d.detail,
                      "finish": d.result.trajectory.finish_reason}
                     for d in clean if not d.correct][:20],
        "seconds": round(seconds, 2), **describe_rows(rows),
    }
    _write_json(ws.expert_stats, stats)
    _say(f"expert: {stats['expert_success_rate']:.1%} correct on {len(clean)} clean scenarios, "
         f"{len(rows)} SFT rows, mean {stats['mean_tokens']:.0f} tokens "
         f"({stats['mean_trained_tokens']:.0f} trained), prompt {stats['prompt_tokens']} tokens")
    return stats


def stage_sft(ws: Workspace) -> dict[str, Any]:
    from mcprl_demo.sft import load_examples, train

    cfg = ws.cfg
    examples = [e for e in load_examples(ws.sft_rows) if len(e.input_ids) <= cfg.sft.max_len]
    if not examples:
        raise RuntimeError(f"{ws.sft_rows} holds no usable rows: run the 'expert' stage")
    total = sum(len(e.input_ids) for e in examples)
    _say(f"SFT: {len(examples)} rows, {total:,} tokens, {cfg.sft.steps} steps of "
         f"{cfg.sft.batch_size} on {cfg.sft.device}")

    def progress(step: int, loss: float, elapsed: float) -> None:
        _say(f"  sft step {step + 1}/{cfg.sft.steps} loss {loss:.4f} ({elapsed:.0f}s)")

    result = train(examples, ensure_base(ws), cfg.output_dir, cfg.sft, progress=progress)
    stats = {**result.as_dict(), "rows": len(examples), "data_tokens": total,
             "data_sha256": _sha256(ws.sft_rows),
             "epochs": result.tokens_seen / max(1, total)}
    _write_json(ws.sft_stats, stats)
    _write_json(cfg.output_dir / "warmstart.json", {
        "recipe": "python -m mcprl_demo.warmstart", "config": cfg.as_dict(),
        "base": str(ws.base_path), "sft": {k: v for k, v in stats.items() if k != "losses"},
        "expert": _read_json(ws.expert_stats)})
    size = sum(p.stat().st_size for p in cfg.output_dir.iterdir())
    _say(f"SFT done in {result.seconds:.0f}s ({result.tokens_per_s:,.0f} tokens/s on "
         f"{result.device}), final loss {result.final_loss:.4f}; {cfg.output_dir} "
         f"{size / 1e6:.1f} MB")
    return stats


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def is_adapter(path: Path) -> bool:
    """A LoRA adapter folder (served on top of the base) rather than a whole model."""

    return (path / "adapter_config.json").is_file()


async def _load_adapter(base_url: str, name: str, path: str) -> None:
    from mcprl_trainer.policy import PolicyClient

    policy = PolicyClient(base_url)
    try:
        await policy.load_adapter(name, path)
    finally:
        await policy.aclose()


def stage_eval(ws: Workspace, services: Services) -> dict[str, Any]:
    from mcprl_demo.heldout import evaluate_heldout

    cfg = ws.cfg
    val = _load_split(ws, "val")[: cfg.eval.max_scenarios]
    renderer = _renderer(ws)
    settings = _rollout_settings(ws, temperature=cfg.eval.temperature)
    if cfg.eval.max_turns or cfg.eval.max_tokens_per_turn:
        settings = dataclasses.replace(
            settings, max_turns=cfg.eval.max_turns or settings.max_turns,
            max_tokens_per_turn=cfg.eval.max_tokens_per_turn or settings.max_tokens_per_turn,
            min_tokens_per_turn=min(settings.min_tokens_per_turn,
                                    cfg.eval.max_tokens_per_turn or settings.max_tokens_per_turn))
    results: dict[str, Any] = _read_json(ws.eval_stats) or {}
    targets = [("after_sft", cfg.output_dir)]
    if cfg.eval.base_too:
        targets.insert(0, ("base", ensure_base(ws)))
    for label, model in targets:
        adapter = is_adapter(model)
        if not adapter and (not (model / "config.json").exists()
                            or not any(model.glob("*.safetensors"))):
            _say(f"eval: skipping {label}, {model} holds no weights")
            continue
        base_url, served, stop = services.engine(ensure_base(ws) if adapter else model,
                                                 f"engine-{label}")
        try:
            if adapter:
                served = label
                asyncio.run(_load_adapter(base_url, served, str(model.resolve())))
            res = asyncio.run(evaluate_heldout(
                val, base_url=base_url, model=served, mcp_url=services.mcp_url(),
                renderer=renderer, settings=settings, concurrency=cfg.eval.concurrency,
                seed=cfg.seed))
        finally:
            stop()
        results[label] = {**res.as_dict(), "model_path": str(model), "examples": res.examples}
        _say(f"eval {label}: held-out success {res.success_rate:.1%} on {res.n} val scenarios "
             f"(completed {res.completed_rate:.0%}, {res.mean_turns:.1f} turns, "
             f"{res.tool_errors} tool errors, {res.seconds:.0f}s)")
    _write_json(ws.eval_stats, results)
    info = cfg.output_dir / "warmstart.json"
    if info.exists():
        data = json.loads(info.read_text())
        data["heldout"] = {k: {kk: vv for kk, vv in v.items() if kk != "examples"}
                           for k, v in results.items()}
        _write_json(info, data)
    return results


# -- CLI -------------------------------------------------------------------------------------
def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--set expects KEY=VALUE, got {item!r}")
    return key.strip(), yaml.safe_load(raw)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mcprl_demo.warmstart",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/warmstart.yaml"))
    parser.add_argument("--stages", default=",".join(STAGES),
                        help=f"comma-separated subset of {', '.join(STAGES)}")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        type=_parse_override, metavar="KEY=VALUE",
                        help="override a config field, e.g. --set sft.steps=200")
    args = parser.parse_args(argv)
    sigterm_as_interrupt()  # the MCP server and engines it starts are stopped on the way out
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        parser.error(f"unknown stage(s) {unknown}; known: {', '.join(STAGES)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING)
    cfg = load_warmstart_config(args.config, dict(args.overrides))
    ws = Workspace(cfg)
    ws.root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        with ExitStack() as exits:
            services = Services(ws, exits)
            for stage in stages:
                t0 = time.perf_counter()
                if stage == "scenarios":
                    stage_scenarios(ws, services)
                elif stage == "expert":
                    stage_expert(ws, services)
                elif stage == "sft":
                    stage_sft(ws)
                elif stage == "eval":
                    stage_eval(ws, services)
                _say(f"stage {stage} took {time.perf_counter() - t0:.0f}s")
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the services are already stopped
        _say(f"interrupted ({exc or 'SIGINT'}) after {time.perf_counter() - started:.0f}s; "
             "the files of finished stages are kept (--stages runs the rest)")
        return 130
    _say(f"done in {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
