"""The MCP-RL tutorial's steps with ART's client API, against the mcp-rl stack, on a CPU.

1. our stack: the company-db MCP server (the tutorial's 5/15/8 rows), our engine, our judge
   (local processes; or running ones: --mcp-url, --engine-url, --judge-url, --model);
2. the server's tools, with run_query's description enriched by each table's schema and
   3 sample rows (the tutorial's tip);
3. ``art.mcp.generate_scenarios`` against our engine, stored in our scenario-set store
   (validated and deduplicated; topped up with ``sql`` scenarios when it keeps too few);
4. rollouts: the tutorial's rollout function with ``art.Model`` pointed at our engine, in
   ``art.gather_trajectory_groups``; one change: ``logprobs=True`` and the sampled token ids;
5. RULER: ``art.rewards.ruler_score_group`` (the tutorial's call) against our engine, and our
   judge in its place (``mcprl_art.judge_score_group``);
6. where ``await model.train(groups)`` would start ART's GPU backend: the groups go to our
   trainer (a GRPO step on LoRA), the adapter is published to the engine, and one more
   rollout samples from it through ART's client.

``make art-tutorial`` (``ART_ARGS=--quick`` for the short run the tests use). What to change
in a tutorial notebook: README.md beside this file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import art
import torch
from art.mcp import generate_scenarios
from art.rewards import ruler_score_group
from fastmcp import Client
from openai import AsyncOpenAI

import mcprl_art  # noqa: F401 - before art: the .env / litellm / transformers fixes
from mcprl_art.judge import judge_score_group
from mcprl_art.records import scored_group
from mcprl_art.scenarios import load_art_scenarios, store_art_scenarios
from mcprl_common.wire import Scenario
from mcprl_scenario_gen.store import ScenarioStore
from mcprl_stack.config import StackSettings
from mcprl_stack.local_stack import LocalStack, script_command
from mcprl_trainer.batch import build_step_batch
from mcprl_trainer.checkpoint import save_checkpoint
from mcprl_trainer.config import RunConfig
from mcprl_trainer.groups import GroupBatch
from mcprl_trainer.grpo import GRPOUpdater
from mcprl_trainer.modeling import load_policy, load_tokenizer
from mcprl_trainer.policy import PolicyClient
from mcprl_trainer.publish import publish_adapter
from mcprl_trainer.rendering import ChatRenderer

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PROMPT = (
    "You are an MCP agent with tools to query a company database. The database works and the "
    "tools always answer: first list the tables, then describe the ones you need, then run "
    "SELECT queries. When you have the answer, call complete_task with a summary of it.")
COMPLETE_TASK = {"type": "function", "function": {
    "name": "complete_task", "description": "Complete the task with a summary",
    "parameters": {"type": "object", "required": ["summary"], "properties": {
        "summary": {"type": "string", "description": "Summary of accomplishments"}}}}}


# -- step 1: our stack ---------------------------------------------------------------------------
def long_context_view(model_dir: Path, out_dir: Path, positions: int = 16384) -> Path:
    """The model with a config that allows ``positions`` tokens (the weights are linked).

    ``generate_scenarios`` always asks for ``max_completion_tokens=8000``; the demo model's
    config says 8192 positions, and an engine (vLLM too) answers 400 when prompt + 8000
    exceeds the context. RoPE runs at any length; a real generator needs no such view."""

    out_dir.mkdir(parents=True, exist_ok=True)
    for src in model_dir.iterdir():
        dst = out_dir / src.name
        if src.name == "config.json":
            config = json.loads(src.read_text())
            config["max_position_embeddings"] = max(positions,
                                                    config.get("max_position_embeddings", 0))
            dst.write_text(json.dumps(config, indent=2))
        elif not dst.exists():
            dst.symlink_to(src.resolve())
    return out_dir


@dataclass
class Urls:
    mcp: str
    engine: str  # with /v1
    judge: str
    model: str  # served name of the base model
    model_path: Path


@contextlib.contextmanager
def our_stack(args: argparse.Namespace) -> Any:
    if args.engine_url:
        yield Urls(args.mcp_url, args.engine_url, args.judge_url, args.model,
                   Path(args.model_path))
        return
    view = long_context_view(Path(args.model_path), args.out / "model")
    config = StackSettings(
        services=["mcp-server", "inference", "judge"], ports=dict.fromkeys(
            ["mcp-server", "inference", "judge"], 0), model=str(view),
        runs_dir=args.out / "stack", inherit_env=False, health_timeout_s=300,
        env={"MCP_DB_PRESET": "tutorial", "INFERENCE_MAX_MODEL_LEN": "16384",
             "INFERENCE_KV_CACHE_MEMORY_GB": "0.5", "INFERENCE_MAX_BATCH_SIZE": "16",
             "INFERENCE_SEED": "0", "JUDGE_MAX_OUTPUT_TOKENS": str(args.ruler_max_tokens),
             "JUDGE_EXPLANATION_MAX_CHARS": "40", "JUDGE_CACHE_ENABLED": "false",
             "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    with LocalStack(config) as stack:
        yield Urls(f"{stack.urls['mcp-server']}/mcp", f"{stack.urls['inference']}/v1",
                   stack.urls["judge"], stack.served_model or str(view), view)


# -- step 2: the server's tools, enriched --------------------------------------------------------
def content_text(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") or str(block)
                     for block in getattr(result, "content", None) or [])


async def enriched_tools(mcp_url: str) -> list[dict[str, Any]]:
    """The tools as ``generate_scenarios`` takes them, run_query's description with each
    table's columns and 3 sample rows, so the generator names real tables."""

    async with Client(mcp_url, timeout=30) as client:
        tools = await client.list_tools()
        tables = json.loads(content_text(await client.call_tool("list_tables", {})))
        notes = []
        for table in tables:
            schema = content_text(await client.call_tool("describe_table",
                                                         {"table_name": table}))
            rows = content_text(await client.call_tool(
                "run_query", {"sql": f"SELECT * FROM {table} LIMIT 3"}))
            notes.append(f"Table {table}: {schema}\nSample rows: {rows}")
    out = []
    for tool in tools:
        description = tool.description or ""
        if tool.name == "run_query":
            description += "\n\n" + "\n\n".join(notes)
        out.append({"name": tool.name, "description": description,
                    "parameters": tool.inputSchema})
    return out


# -- step 3: scenarios ---------------------------------------------------------------------------
async def make_scenarios(args: argparse.Namespace, urls: Urls, tools: list[dict[str, Any]],
                         data_dir: Path) -> tuple[list[Scenario], list[Scenario], dict[str, Any]]:
    info: dict[str, Any] = {"requested": args.scenarios}
    train: list[Scenario] = []
    val: list[Scenario] = []
    t0 = time.perf_counter()
    try:
        collection = await generate_scenarios(
            tools, num_scenarios=args.scenarios, show_preview=False,
            generator_model=args.generator_model or urls.model,
            generator_api_key=os.environ.get("GENERATOR_API_KEY", "EMPTY"),
            generator_base_url=args.generator_url or urls.engine)
        info["generated"] = len(collection)
        train_art, val_art = collection.split(max(1, len(collection) * 2 // 3))
        manifest = store_art_scenarios(data_dir, train=train_art, val=val_art)
        store = ScenarioStore(data_dir)
        train, val = store.load_split(manifest.id, "train"), store.load_split(manifest.id, "val")
        info.update(set_id=manifest.id, kept=manifest.counts.get("total", 0),
                    warnings=manifest.warnings,
                    round_trip=load_art_scenarios(data_dir, manifest.id).to_dicts()
                    == [s.to_art() for s in train])
    except Exception as exc:  # a tiny generator model: bad JSON, a wrong count, all junk
        info["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    info["seconds"] = round(time.perf_counter() - t0, 1)
    need = args.groups_per_step
    if len(train) < need or not val:
        # Top up with verifiable `sql` scenarios from the same server (our strategy).
        proc = await asyncio.create_subprocess_exec(
            *script_command("mcprl-scenario-gen"), "generate", "--mcp-url", urls.mcp,
            "--strategy", "sql", "--n", str(2 * need + 2), "--seed", "0", "--out",
            str(data_dir), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        stdout, _ = await asyncio.wait_for(proc.communicate(), timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"mcprl-scenario-gen generate failed ({proc.returncode})")
        set_id = json.loads(stdout.decode().strip().splitlines()[-1])["id"]
        store = ScenarioStore(data_dir)
        train += store.load_split(set_id, "train")
        val += store.load_split(set_id, "val")
        info["topped_up_with_sql"] = set_id
    return train, val, info


# -- step 4: the tutorial's rollout, ART's client --------------------------------------------------
@dataclass
class McpScenario:
    task: str
    mcp_url: str
    max_turns: int
    max_tokens: int


async def rollout(model: art.Model, scenario: McpScenario) -> art.Trajectory:
    traj = art.Trajectory(messages_and_choices=[], reward=0.0,
                          metadata={"task": scenario.task},
                          metrics={"task_completed": False, "ran_out_of_turns": False})
    # As the notebook does: its own client per rollout. (``model.openai_client()`` fails with
    # the openai SDK this stack pins, 3.x: ART hands an httpx.Timeout to its httpx2 client.)
    llm = AsyncOpenAI(api_key=model.inference_api_key, base_url=model.inference_base_url,
                      timeout=120.0, max_retries=2)
    async with llm, Client(scenario.mcp_url, timeout=30) as client:
        tools = [{"type": "function", "function": {
            "name": t.name, "description": t.description or f"MCP tool: {t.name}",
            "parameters": t.inputSchema or {"type": "object", "properties": {}}}}
            for t in await client.list_tools()] + [COMPLETE_TASK]
        traj.tools = tools
        traj.messages_and_choices = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": scenario.task}]
        for _ in range(scenario.max_turns):
            response = await llm.chat.completions.create(
                model=model.get_inference_name(), messages=traj.messages(), tools=tools,
                max_completion_tokens=scenario.max_tokens,
                # The one change for our trainer: the sampled ids and their log-probs.
                logprobs=True, extra_body={"return_token_ids": True})
            choice = response.choices[0]
            traj.messages_and_choices.append(choice)
            if not choice.message.tool_calls:
                break
            done = False
            for call in choice.message.tool_calls:
                if call.function.name == "complete_task":
                    traj.metrics["task_completed"] = done = True
                    break
                try:
                    result = await client.call_tool(call.function.name,
                                                    json.loads(call.function.arguments),
                                                    raise_on_error=False)
                    text = content_text(result)
                except Exception as exc:  # unknown tool, bad arguments: the agent sees it
                    text = f"Error: {exc}"
                traj.messages_and_choices.append(
                    {"role": "tool", "tool_call_id": call.id, "content": text[:2000]})
            if done:
                break
        else:
            traj.metrics["ran_out_of_turns"] = True
    return traj.finish()


def _scenario_for(group: art.TrajectoryGroup, by_task: dict[str, Scenario]) -> Scenario:
    return by_task[str(group.trajectories[0].metadata["task"])]


async def tutorial(args: argparse.Namespace) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    started = time.perf_counter()
    with our_stack(args) as urls:
        summary["stack_seconds"] = round(time.perf_counter() - started, 1)
        print(f"[1] stack: MCP {urls.mcp}, engine {urls.engine} ({urls.model}), "
              f"judge {urls.judge}", flush=True)
        tools = await enriched_tools(urls.mcp)
        enriched = next(t for t in tools if t["name"] == "run_query")
        print(f"[2] {len(tools)} tools; run_query's description has "
              f"{len(enriched['description'])} characters of schema and rows", flush=True)
        train, val, info = await make_scenarios(args, urls, tools, args.out / "scenarios")
        summary["scenarios"] = {**info, "train": len(train), "val": len(val)}
        print(f"[3] scenarios: {json.dumps(summary['scenarios'])}", flush=True)

        model = art.Model(name="mcp-agent", project="mcp-rl", inference_base_url=urls.engine,
                          inference_api_key="EMPTY", inference_model_name=urls.model)
        batch = train[: args.groups_per_step]
        by_task = {s.task: s for s in batch}
        t0 = time.perf_counter()
        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(
                rollout(model, McpScenario(s.task, urls.mcp, args.max_turns, args.max_tokens))
                for _ in range(args.rollouts_per_group)) for s in batch),
            pbar_desc="rollouts", max_exceptions=0)
        summary["rollouts"] = {
            "groups": len(groups), "trajectories": sum(len(g) for g in groups),
            "seconds": round(time.perf_counter() - t0, 1),
            "task_completed": sum(bool(t.metrics.get("task_completed")) for g in groups
                                  for t in g.trajectories)}
        print(f"[4] rollouts: {json.dumps(summary['rollouts'])}", flush=True)

        # The tutorial's call, with the judge at our engine (a litellm "openai/" model with
        # api_base) and max_tokens set: without it a small model may write until its context
        # is full. (RULER parity at temperature 0 is `make art-parity`, docs/art.md.)
        ruler_params = {"api_base": urls.engine, "api_key": "EMPTY",
                        "max_tokens": args.ruler_max_tokens, "timeout": 300}
        t0 = time.perf_counter()
        art_scored = [await ruler_score_group(g, f"openai/{urls.model}",
                                              extra_litellm_params=ruler_params,
                                              swallow_exceptions=True) for g in groups]
        t1 = time.perf_counter()
        ours = [await judge_score_group(g, urls.judge, scenario=_scenario_for(g, by_task),
                                        swallow_exceptions=True) for g in groups]
        summary["ruler"] = {
            "art_ruler_score_group": [[t.reward for t in g.trajectories] if g else None
                                      for g in art_scored],
            "art_seconds": round(t1 - t0, 1),
            "our_judge": [[t.reward for t in g.trajectories] if g else None for g in ours],
            "our_seconds": round(time.perf_counter() - t1, 1)}
        print(f"[5] RULER: {json.dumps(summary['ruler'])}", flush=True)

        # -- step 6: ART's GPU backend would start here (`await model.train(groups)`) --------
        judged = [g for g in ours if g is not None]
        cfg = RunConfig(name="art-tutorial", output_dir=args.out / "runs",
                        model=str(urls.model_path), policy={"base_url": urls.engine,
                                                            "model": urls.model},
                        train={"lr": args.lr, "device": "cpu"},
                        scenarios={"dir": args.out / "scenarios",
                                   "set_id": summary["scenarios"].get("set_id")
                                   or summary["scenarios"]["topped_up_with_sql"]})
        tokenizer = load_tokenizer(cfg.model)
        renderer = ChatRenderer(tokenizer)
        scored = [scored_group(g, _scenario_for(g, by_task), renderer, model=urls.model)
                  for g in judged]
        step = build_step_batch(GroupBatch(groups=scored), cfg.train, seed=0, step=1,
                                success_threshold=0.5)
        torch.manual_seed(0)
        policy_model = load_policy(cfg.model, cfg.lora, cfg.train)
        updater = GRPOUpdater(policy_model, cfg.train, tokenizer.pad_token_id)
        metrics = updater.step(step.samples)
        checkpoint = save_checkpoint(cfg.run_dir, 1, policy_model, updater.state_dict(),
                                     {"history": [metrics]})
        policy = PolicyClient(urls.engine, timeout_s=120)
        try:
            adapter = await publish_adapter(policy, cfg, checkpoint.path)
        finally:
            await policy.aclose()
        summary["train"] = {
            "groups": len(scored), "samples": len(step.samples),
            "zero_variance_groups": int(step.metrics["groups_zero_variance"]),
            **{k: round(float(metrics[k]), 6) for k in ("train_tokens", "loss", "grad_norm")
               if k in metrics},
            "checkpoint": str(checkpoint.path), "adapter": adapter}
        print(f"[6] our GRPO step: {json.dumps(summary['train'])}", flush=True)

        trained = art.Model(name="mcp-agent", project="mcp-rl", inference_base_url=urls.engine,
                            inference_api_key="EMPTY", inference_model_name=adapter)
        after = await rollout(trained, McpScenario(val[0].task, urls.mcp, args.max_turns,
                                                   args.max_tokens))
        summary["after"] = {"model": adapter, "turns": sum(
            1 for m in after.messages_and_choices if not isinstance(m, dict)),
            "task_completed": bool(after.metrics["task_completed"])}
        print(f"    one rollout with {adapter}: {json.dumps(summary['after'])}", flush=True)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    return summary


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the short run the tests use")
    p.add_argument("--model-path", default=str(REPO / "demo/checkpoints/warm-start"),
                   help="model the local engine serves (agent, generator and judge)")
    p.add_argument("--mcp-url", help="a running MCP server instead of starting one")
    p.add_argument("--engine-url", help="a running engine (with /v1): use running services")
    p.add_argument("--judge-url", help="our running judge (with --engine-url)")
    p.add_argument("--model", help="the engine's served model name (with --engine-url)")
    p.add_argument("--generator-url", help="OpenAI-compatible URL for generate_scenarios "
                   "(default: the engine); its key from GENERATOR_API_KEY")
    p.add_argument("--generator-model", help="generator model name (default: the engine's)")
    p.add_argument("--scenarios", type=int, default=8)
    p.add_argument("--groups-per-step", type=int, default=2)
    p.add_argument("--rollouts-per-group", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96, help="per turn")
    p.add_argument("--ruler-max-tokens", type=int, default=384)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--out", type=Path, default=REPO / "runs/art-tutorial")
    args = p.parse_args(argv)
    if args.quick:
        args.scenarios, args.rollouts_per_group, args.max_turns = 3, 3, 2
        args.max_tokens, args.ruler_max_tokens = 64, 256
    if args.engine_url and not (args.mcp_url and args.judge_url and args.model):
        p.error("--engine-url needs --mcp-url, --judge-url and --model")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    summary = asyncio.run(tutorial(args))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
