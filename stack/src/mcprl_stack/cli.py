"""``mcprl-stack``: run the services as local processes.

    mcprl-stack up [--services a,b] [--mcp inventory-mcp] [--model PATH] [--train-config F]
    mcprl-stack env [SERVICE]      # the environment each service would get
    mcprl-stack env-example        # render .env.example from the services' settings

``up`` starts everything in dependency order, prints where each service answers and runs
until Ctrl-C or SIGTERM (or until a service dies), then stops every process it started.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from mcprl_common.logging import configure_logging
from mcprl_common.process import raise_open_files_limit, sigterm_as_interrupt
from mcprl_stack.config import StackSettings
from mcprl_stack.envfile import render
from mcprl_stack.local_stack import LocalStack, StackError, log_tail
from mcprl_stack.services import SERVICES

_SECRET_HINTS = ("KEY", "TOKEN", "PASSWORD", "SECRET")


def _config(args: argparse.Namespace) -> StackSettings:
    overrides: dict[str, object] = {}
    if args.services:
        overrides["services"] = args.services
    if args.mcp:
        overrides["mcp"] = args.mcp
    if args.model:
        overrides["model"] = args.model
    if args.train_config:
        overrides["train_config"] = Path(args.train_config)
        if not args.services:
            overrides["services"] = [*StackSettings().services, "trainer"]
    if args.runs_dir:
        overrides["runs_dir"] = Path(args.runs_dir)
    return StackSettings.from_env(**overrides)


def _up(config: StackSettings) -> int:
    sigterm_as_interrupt()  # teardown runs in ``finally``
    stack = LocalStack(config)
    print(f"starting {', '.join(config.services)} (logs in {stack.log_dir}) ...", flush=True)
    code = 0
    try:
        stack.start()
        width = max(len(n) for n in stack.urls)
        for name, url in stack.urls.items():
            spec = SERVICES[name]
            proc = stack.processes[name].proc
            pid = proc.pid if proc is not None else "-"
            print(f"  {name:<{width}}  {url}  pid {pid}  (health {spec.health_path}, "
                  f"metrics {spec.metrics_path}, log {stack.log_dir / (name + '.log')})")
        for key, value in stack.client_env().items():
            print(f"  export {key}={value}")
        print("up; Ctrl-C stops everything", flush=True)
        while True:
            for name, rc in stack.exited().items():
                if SERVICES[name].job and rc == 0:
                    print(f"{name} finished", flush=True)
                    stack.processes.pop(name)
                    continue
                print(f"{name} exited with {rc}; end of its log:\n"
                      f"{log_tail(stack.log_dir / (name + '.log'))}", file=sys.stderr)
                return 1
            time.sleep(0.5)
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
    finally:
        codes = stack.stop()
        if codes:
            print("stopped: " + ", ".join(f"{n} ({c})" for n, c in codes.items()), flush=True)
    return code


def _env(config: StackSettings, service: str | None) -> int:
    stack = LocalStack(config)
    for name in stack.config.services:  # static view: configured ports, no process started
        stack.ports[name] = stack.config.port_of(name)
        stack.urls[name] = f"http://{stack.config.host}:{stack.ports[name]}"
    stack.served_model = config.model
    for name in config.services:
        if service and name != service:
            continue
        print(f"# {name}")
        for key, value in sorted(stack.env_for(name).items()):
            if any(h in key for h in _SECRET_HINTS):
                value = "***"
            print(f"{key}={value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcprl-stack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("up", "run the services until interrupted"),
                       ("env", "print the environment each service gets")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--services", help=f"comma-separated, from: {', '.join(SERVICES)}")
        p.add_argument("--mcp", choices=["mcp-server", "inventory-mcp"],
                       help="local MCP server the pipeline uses (default mcp-server)")
        p.add_argument("--model", help="model the engine serves (default models/tiny-learn)")
        p.add_argument("--train-config", help="also run `mcprl-train --config FILE`")
        p.add_argument("--runs-dir", help="logs and data directory (default runs/stack)")
        if name == "env":
            p.add_argument("service", nargs="?", help="only this service")
    sub.add_parser("env-example", help="print .env.example generated from the settings")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "env-example":
        sys.stdout.write(render())
        return 0
    configure_logging("stack", "warning", json_lines=False)
    raise_open_files_limit()
    try:
        config = _config(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "env":
        return _env(config, args.service)
    return _up(config)


if __name__ == "__main__":
    sys.exit(main())
