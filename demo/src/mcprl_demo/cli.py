"""``python -m mcprl_demo`` (``make demo``): the whole MCP-RL loop on this machine.

Starts the MCP server, our engine (serving the warm-started agent), scenario-gen (``sql``)
and the judge (``verifiable``) as local processes, generates a scenario set, runs the
trainer (eval, N GRPO steps on a LoRA adapter, eval again), prints the before/after table,
writes the report and reward curve, and stops everything.

With ``JUDGE_BASE_URL`` and ``JUDGE_API_KEY`` set, the judge uses RULER on that endpoint and
scenarios come from the ``llm`` strategy; ``--model`` trains another model (GPU: device auto).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from mcprl_common.process import sigterm_as_interrupt
from mcprl_demo.config import default_config, load_demo_config


def _override(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--set expects KEY=VALUE, got {item!r}")
    return key.strip(), yaml.safe_load(raw)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mcprl_demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=None,
                        help="demo config (default: configs/smollm2.yaml with a CUDA GPU, "
                        "else configs/demo.yaml)")
    parser.add_argument("--steps", type=int, help="GRPO steps (default: the config's)")
    parser.add_argument("--scenarios", type=int, help="scenarios to generate (train + val)")
    parser.add_argument("--quick", action="store_true",
                        help="a short run (the config's demo.quick overrides)")
    parser.add_argument("--model", help="train this model (path or HF id), with a fresh LoRA, "
                                        "instead of the shipped warm-start agent")
    parser.add_argument("--out", type=Path, help="output directory (default runs/demo)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], type=_override,
                        metavar="KEY=VALUE", help="override a config value, e.g. "
                                                  "--set trainer.group_size=8")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be >= 1")
    if args.scenarios is not None and args.scenarios < 4:
        parser.error("--scenarios must be >= 4")
    return args


def ensure_base_model(model: str, console: Console) -> None:
    """Build ``make base-model``'s SmolLM2 checkpoint when the demo serves it and it is
    missing (a fresh clone on a GPU box)."""

    from mcprl_inference.base_model import SOURCES, build

    path = Path(model)
    source = SOURCES.get(path.name)
    if source is None or (path / "config.json").exists():
        return
    console.print(f"building {path} (make base-model) ...")
    build(source, path.parent)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sigterm_as_interrupt()  # the stack's teardown runs before the process exits
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    overrides: dict[str, Any] = dict(args.overrides)
    if args.steps is not None:
        overrides["trainer.steps"] = args.steps
    if args.scenarios is not None:
        overrides["demo.scenarios"] = args.scenarios
    if args.model:  # the shipped agent's adapter belongs to the shipped base: a fresh LoRA
        overrides["demo.model"] = args.model
        overrides.setdefault("trainer.lora.init_adapter", None)
    if args.out:
        overrides["demo.output_dir"] = str(args.out)
    console = Console()
    args.config = args.config or default_config()
    try:
        config = load_demo_config(args.config, quick=args.quick, overrides=overrides)
        ensure_base_model(config.demo.model, console)
    except Exception as exc:
        console.print(f"[red]invalid demo config {args.config}: {exc}[/]")
        return 2
    from mcprl_demo.demo_run import DemoError, DemoRun
    from mcprl_demo.display import RichEvents, print_summary

    mode = ("hosted judge (RULER) + llm scenarios" if config.hosted
            else "local: sql scenarios + verifiable judge")
    console.print(f"[bold]mcp-rl demo[/] ({mode}), model {config.demo.model}, "
                  f"{config.trainer.get('steps')} GRPO steps, {config.demo.scenarios} scenarios")
    events = RichEvents(console)
    started = time.perf_counter()
    try:
        outcome = DemoRun(config, events).run()
    except DemoError as exc:
        events.close()
        console.print(f"[red]demo failed: {exc}[/]")
        return 1
    except KeyboardInterrupt:
        events.close()
        console.print("[yellow]interrupted: every service was stopped[/]")
        return 130
    events.close()
    print_summary(console, outcome, time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
