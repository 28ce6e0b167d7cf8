"""``mcprl-scenario-gen``: ``serve`` (the HTTP service), ``generate`` (one set, with a
progress bar), ``export`` / ``import`` (ART's ``[{"task", "difficulty"}]`` shape)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from mcprl_common.errors import ServiceError
from mcprl_common.settings import upstream_settings
from mcprl_scenario_gen.art_import import NothingToImportError, import_art, load_art
from mcprl_scenario_gen.pipeline import run_generation
from mcprl_scenario_gen.service import preflight
from mcprl_scenario_gen.settings import ScenarioGenSettings
from mcprl_scenario_gen.store import ScenarioStore, StoredManifest, dumps_art
from mcprl_scenario_gen.strategies import GenerationParams
from mcprl_scenario_gen.strategies import Progress as GenProgress
from mcprl_scenario_gen.strategies.registry import strategy_names

err = Console(stderr=True)


def parse_mix(text: str | None) -> dict[int, float] | None:
    """``"1=1,3=2,5=1"`` -> ``{1: 1.0, 3: 2.0, 5: 1.0}``."""

    if not text:
        return None
    mix: dict[int, float] = {}
    for part in text.split(","):
        level, _, weight = part.partition("=")
        if not level.strip().isdigit() or int(level) not in range(1, 6) or not weight:
            raise SystemExit(f"--difficulty-mix: expected like 1=1,3=2, got {part!r}")
        mix[int(level)] = float(weight)
    return mix


def _settings(args: argparse.Namespace) -> ScenarioGenSettings:
    overrides: dict[str, Any] = {}
    for name in ("host", "port", "data_dir"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    return ScenarioGenSettings(**overrides)


def cmd_serve(args: argparse.Namespace) -> int:
    from mcprl_common.service_app import run_service
    from mcprl_scenario_gen.app import SERVICE, create_app

    settings = _settings(args)
    run_service(create_app(settings), settings, SERVICE)
    return 0


def _summary(manifest: StoredManifest, store: ScenarioStore) -> None:
    table = Table(title=f"scenario set {manifest.id}: {manifest.status}")
    for col in ("split", "count", *(f"d{d}" for d in range(1, 6))):
        table.add_column(col, justify="right")
    for split in ("train", "val"):
        items = store.load_split(manifest.id, split)  # type: ignore[arg-type]
        levels = [sum(s.difficulty == d for s in items) for d in range(1, 6)]
        table.add_row(split, str(len(items)), *map(str, levels))
    err.print(table)
    for warning in manifest.warnings:
        err.print(f"[yellow]warning:[/] {warning}")
    if manifest.error:
        err.print(f"[red]error:[/] {manifest.error}")
    err.print(f"stored in {store.set_dir(manifest.id)}")


def cmd_generate(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if not args.mcp_url:
        err.print("[red]--mcp-url (or MCP_URL) is required[/]")
        return 2
    if args.n > settings.max_scenarios:
        err.print(f"[red]--n {args.n} is above the maximum {settings.max_scenarios} "
                  "(SCENARIO_GEN_MAX_SCENARIOS)[/]")
        return 2
    holdout = args.holdout
    params = GenerationParams(
        mcp_url=args.mcp_url, strategy=args.strategy, n=args.n, seed=args.seed,
        val_fraction=args.val_fraction, difficulty_mix=parse_mix(args.difficulty_mix),
        holdout_templates=holdout in ("templates", "both"),
        holdout_entities=holdout in ("entities", "both"), model=args.model,
        json_schema=args.json_schema, auth_token=args.auth_token or None,
        transport=args.transport,
    )
    store = ScenarioStore(settings.data_dir)
    upstream = upstream_settings("GENERATOR_")

    async def run() -> StoredManifest:
        await preflight(params, settings)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[extra]}"), TimeElapsedColumn(),
                      console=err) as bar:
            task = bar.add_task("connecting", total=params.n, extra="")

            def on_progress(p: GenProgress) -> None:
                extra = f"candidates {p.candidates}"
                if p.llm_calls:
                    extra += f" | llm calls {p.llm_calls}, tokens " \
                             f"{p.prompt_tokens + p.completion_tokens}"
                bar.update(task, description=p.phase, completed=min(p.accepted, params.n),
                           extra=extra)

            return await run_generation(params, settings=settings, store=store,
                                        upstream=upstream, on_progress=on_progress)

    try:
        manifest = asyncio.run(run())
    except ServiceError as exc:
        err.print(f"[red]error:[/] {exc.message}")
        return 2
    _summary(manifest, store)
    print(json.dumps({"id": manifest.id, "status": manifest.status,
                      "path": str(store.set_dir(manifest.id)), "counts": manifest.counts}))
    return 0 if manifest.status == "succeeded" else 1


def cmd_export(args: argparse.Namespace) -> int:
    store = ScenarioStore(_settings(args).data_dir)
    try:
        items = store.load_split(args.set_id, args.split)
    except ServiceError as exc:
        err.print(f"[red]error:[/] {exc.message}")
        return 2
    text = dumps_art(items) if args.format == "art" else "".join(
        s.model_dump_json() + "\n" for s in items)
    if args.output and args.output != "-":
        Path(args.output).write_text(text, encoding="utf-8")
        err.print(f"wrote {len(items)} scenarios to {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    settings = _settings(args)
    store = ScenarioStore(settings.data_dir)
    path = Path(args.file)
    try:
        groups = load_art(path)
    except (OSError, ValueError) as exc:
        err.print(f"[red]error:[/] cannot read {path}: {exc}")
        return 2
    try:
        manifest = import_art(store, groups, source=path.resolve().as_uri(), seed=args.seed,
                              val_fraction=args.val_fraction,
                              near_duplicate_threshold=settings.near_duplicate_threshold)
    except NothingToImportError:
        err.print(f"[red]error:[/] no valid scenarios in {path}")
        return 2
    _summary(manifest, store)
    print(json.dumps({"id": manifest.id, "status": manifest.status,
                      "path": str(store.set_dir(manifest.id)), "counts": manifest.counts}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcprl-scenario-gen", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def data_dir(p: argparse.ArgumentParser, *names: str) -> None:
        p.add_argument(*names, dest="data_dir", type=Path, default=None,
                       help="data directory of scenario sets (default SCENARIO_GEN_DATA_DIR "
                            "or ./data/scenarios)")

    serve = sub.add_parser("serve", help="run the HTTP service")
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    data_dir(serve, "--data-dir")
    serve.set_defaults(func=cmd_serve)

    gen = sub.add_parser("generate", help="generate one scenario set")
    gen.add_argument("--mcp-url", default=os.environ.get("MCP_URL"))
    gen.add_argument("--auth-token", default=os.environ.get("MCP_AUTH_TOKEN"),
                     help="bearer token of the MCP server (default MCP_AUTH_TOKEN)")
    gen.add_argument("--transport", choices=("auto", "http", "sse"), default="auto")
    gen.add_argument("--strategy", choices=strategy_names(), default="sql")
    gen.add_argument("--n", type=int, default=50)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--val-fraction", type=float, default=0.2)
    gen.add_argument("--difficulty-mix", default=None, help="e.g. 1=1,2=2,3=2,4=1,5=1")
    gen.add_argument("--holdout", choices=("none", "templates", "entities", "both"),
                     default="none", help="keep templates and/or entities out of both splits")
    gen.add_argument("--model", default=None, help="generator model (llm; default "
                                                   "GENERATOR_MODEL)")
    gen.add_argument("--json-schema", choices=("auto", "on", "off"), default=None)
    data_dir(gen, "--out", "--data-dir")
    gen.set_defaults(func=cmd_generate)

    exp = sub.add_parser("export", help="write a stored split in ART's shape")
    exp.add_argument("set_id")
    exp.add_argument("--format", choices=("art", "jsonl"), default="art")
    exp.add_argument("--split", choices=("train", "val"), default="train")
    exp.add_argument("-o", "--output", default="-")
    data_dir(exp, "--data-dir")
    exp.set_defaults(func=cmd_export)

    imp = sub.add_parser("import", help="store ART scenarios as a scenario set")
    imp.add_argument("file")
    imp.add_argument("--format", choices=("art",), default="art")
    imp.add_argument("--val-fraction", type=float, default=0.2)
    imp.add_argument("--seed", type=int, default=0)
    data_dir(imp, "--data-dir", "--out")
    imp.set_defaults(func=cmd_import)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sys.exit(args.func(args))
