"""Does the RL loop teach tool use? Held-out success before and after GRPO, against a
shuffled-reward control and three ablations, in one command on one machine (issue 9).

Everything runs here, on loopback: the company MCP server, our engine (CUDA when present),
the judge (verifiable rewards) and one ``mcprl-train`` process per run. Steps:

1. warm start: ``--warm-start PATH`` reuses a checkpoint (e.g. demo/checkpoints/warm-start);
   without it the demo's recipe (``mcprl_demo.warmstart``, ``--warmstart-config``) builds one
   under ``--out``, its SFT data minus the RL set's val templates and entities;
2. a ``sql`` scenario set (scenario-gen's strategy against the MCP server) split with
   templates AND entities held out: val asks questions RL training never saw;
3. held-out success of the warm start (greedy, verifiable checker), once;
4. the arms, each run with the same budget (``--budget-s`` wall clock, then SIGTERM: the
   trainer stops after its current step; ``--max-steps`` at most): ``grpo`` (3 seeds),
   ``shuffled`` (rewards permuted within each group: same distribution, no signal), ``g8``
   (group size 8 vs grpo's 4), ``no-skip`` (zero-variance groups trained), ``kl`` (KL on);
   up to ``--parallel`` runs at once against the one engine (a LoRA each), or with
   ``--engine-per-run`` one engine each on the same device (the engine batches one LoRA
   at a time, so runs that share it wait for each other's turns);
5. held-out success of each run's last adapter, then (``--paired-before``, the default) of
   its start again on the same engine, for a gain paired run by run; JSON on stdout (per
   arm: mean and spread over seeds, reward variance, advantage stats, clip fraction, KL),
   files under ``--out``, and with ``--write-docs`` the learning-run section of
   docs/results.md.

CPU smoke (tiny-test model, 2 steps, a few scenarios, one seed per arm; ~2 min on 2 cores)::

    .venv/bin/python bench/learning_run.py --smoke --arms grpo,shuffled

On one H200 (the GPU image lacks some wheels: ``make gpu-wheels`` fills .whl/ first; the
device command carries [".whl"] and must fit one 10-minute command. All 9 runs at once share
the engine (same contention for every arm): ~30 s services and scenarios, ~20 s
before-eval, 240 s budget + the step in flight, ~30 s after-evals; ~6-7 min in all)::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && \
    export PYTHONPATH=/tmp/site:$(printf "$PWD/%s/src:" common inference mcp-server \
      scenario-gen judge trainer demo stack) HF_HUB_OFFLINE=1 && \
    python3 bench/learning_run.py --device cuda --warm-start demo/checkpoints/warm-start \
      --budget-s 240 --parallel 9 --out $OUT/learning --write-docs

(``$OUT`` comes back: the JSON, the curves PNG, every run's metrics and logs, and the docs
section, which ``--write-docs`` writes into docs/results.md of the device's copy and also as
``$OUT/learning/results-section.md`` to paste here. Building the warm start in the same
command instead of ``--warm-start`` adds the recipe: ~3 min of CPU stages + ~4 min of SFT.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC_DIRS = [ROOT / d / "src" for d in ("common", "inference", "mcp-server", "scenario-gen",
                                       "judge", "trainer", "demo", "stack")]
for _src in SRC_DIRS:  # no install needed (the GPU box has the wheels on PYTHONPATH only)
    if str(_src) not in sys.path:
        sys.path.insert(1, str(_src))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import learning_report as report  # noqa: E402
import yaml  # noqa: E402

from mcprl_common.process import raise_open_files_limit  # noqa: E402
from mcprl_stack import LocalStack, StackSettings  # noqa: E402
from mcprl_trainer.config import set_path  # noqa: E402

DB_SEED = 42


@dataclass
class Arm:
    """One experimental condition: trainer config overrides, run once per seed."""

    name: str
    seeds: int
    overrides: dict[str, Any] = field(default_factory=dict)
    why: str = ""


def default_arms(control_seeds: int) -> dict[str, Arm]:
    return {a.name: a for a in (
        Arm("grpo", 3, {}, "GRPO as configured (the trainer config's G, lr, skipping, no KL)"),
        Arm("shuffled", control_seeds, {"train": {"shuffle_rewards": True}},
            "control: rewards permuted within each group"),
        Arm("g8", 1, {"group_size": 8}, "group size 8 (vs grpo's 4)"),
        Arm("no-skip", 1, {"train": {"skip_zero_variance": False}},
            "zero-variance groups not skipped"),
        Arm("kl", 1, {"train": {"kl_coef": 0.05}}, "KL(policy || warm start), k3, coef 0.05"),
    )}


COMPARISONS = {  # name -> (arm a, arm b): mean success after of a minus b
    "grpo - shuffled (signal)": ("grpo", "shuffled"),
    "g8 - g4": ("g8", "grpo"),
    "skip on - off": ("grpo", "no-skip"),
    "kl on - off": ("kl", "grpo"),
}


def say(msg: str) -> None:
    print(f"[learning-run {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# -- services ---------------------------------------------------------------------------------
class Services:
    """The loopback services, each a ``mcprl_stack.LocalStack`` on free ports (the stack's
    launcher: console scripts, else ``python -m``; a process group each) stopped when the
    run ends. Also the demo recipe's service provider (``mcp_url(db_seed)``) when the warm
    start is built here."""

    def __init__(self, out: Path, exits: ExitStack, env: dict[str, str]) -> None:
        self.out = out
        self.exits = exits
        self.env = env  # what every service gets on top of this process's environment
        self._mcp: dict[int, str] = {}

    def start(self, services: list[str], runs_dir: Path, env: dict[str, str], *,
              model: str = "models/tiny-learn", timeout_s: float = 300.0) -> LocalStack:
        """One stack: logs in ``runs_dir/logs/<service>.log``; ``env`` wins over the stack's
        wiring defaults and the caller's environment."""

        stack = LocalStack(StackSettings(
            services=services, ports=dict.fromkeys(services, 0), runs_dir=runs_dir,
            model=model, env={**self.env, **env}, inherit_env=False,
            health_timeout_s=timeout_s))
        stack.start()
        self.exits.callback(stack.stop)
        return stack

    def mcp_url(self, db_seed: int | None = None) -> str:
        seed = DB_SEED if db_seed is None else db_seed
        if seed not in self._mcp:
            data = self.out / "data"
            data.mkdir(parents=True, exist_ok=True)
            stack = self.start(["mcp-server"], self.out / "stack" / f"mcp-db{seed}",
                               {"MCP_DB_PRESET": "default", "MCP_DB_SEED": str(seed),
                                "MCP_DB_PATH": str(data / f"company-{seed}.db"),
                                "MCP_LOG_LEVEL": "warning"})
            assert stack.mcp_url is not None
            self._mcp[seed] = stack.mcp_url
        return self._mcp[seed]

    def engine(self, model: Path, device: str, max_loras: int,
               runs_dir: Path | None = None) -> tuple[str, str, LocalStack]:
        """An inference engine serving ``model``: (its /v1 URL, served name, its stack)."""

        stack = self.start(["inference"], runs_dir or self.out,
                           {"INFERENCE_DEVICE": device, "INFERENCE_MAX_LORAS": str(max_loras),
                            "INFERENCE_LOG_LEVEL": "warning"}, model=str(model), timeout_s=600)
        return stack.urls["inference"] + "/v1", stack.served_model or str(model), stack

    def judge(self, engine_url: str, served: str) -> str:
        stack = self.start(["judge"], self.out,
                           {"JUDGE_BASE_URL": engine_url, "JUDGE_MODEL": served,
                            "JUDGE_CACHE_PATH": str(self.out / "data" / "judge-cache.sqlite3"),
                            "JUDGE_LOG_LEVEL": "warning"})
        return stack.urls["judge"]


# -- scenarios and warm start ---------------------------------------------------------------
def make_scenarios(services: Services, out: Path, n: int, seed: int, val_fraction: float):
    from mcprl_demo.scenario_sets import generate_sql_set

    set_id = f"sql-db{DB_SEED}-n{n}-s{seed}-hte"
    train, val = asyncio.run(generate_sql_set(
        services.mcp_url(), out / "scenarios" / set_id, n=n, seed=seed,
        val_fraction=val_fraction, holdout_templates=True, holdout_entities=True,
        db_seed=DB_SEED))
    if not train or not val:
        raise SystemExit(f"scenario set {set_id}: {len(train)} train / {len(val)} val; "
                         "raise --scenarios")
    return set_id, train, val


def build_warm_start(services: Services, args: argparse.Namespace, val: list) -> Path | None:
    """The demo's recipe (scenarios -> scripted expert -> SFT), minus anything the RL val
    split holds out, so held-out really means never seen, in SFT or RL."""

    from mcprl_demo import warmstart as ws_mod
    from mcprl_demo.scenario_sets import write_set
    from mcprl_demo.warmstart_config import load_warmstart_config

    over: dict[str, Any] = {"work_dir": str(args.out / "warmstart"),
                            "output_dir": str(args.out / "warmstart" / "model"),
                            "sft.device": "cpu" if args.device == "cpu" else "auto"}
    if args.base_model:  # a pretrained base: the recipe trains a LoRA adapter on it
        over.update({"base.path": str(args.base_model), "base.spec": None})
    if args.smoke:
        over.update({"base.path": str(ROOT / "models" / "tiny-test"), "base.spec": None,
                     "scenarios.n": 40, "scenarios.train_db_seeds": [1], "sft.steps": 2,
                     "sft.batch_size": 4, "sft.log_every": 1})
    over.update(dict(args.warmstart_set))
    cfg = load_warmstart_config(args.warmstart_config, over)
    ws = ws_mod.Workspace(cfg)
    ws.root.mkdir(parents=True, exist_ok=True)
    if args.reuse_warmstart_data and ws.sft_rows.exists():
        say(f"warm start: reusing the demonstrations in {ws.sft_rows}")
    else:
        ws_mod.stage_scenarios(ws, services)
        templates = {s.template for s in val} if "templates" in args.sft_excludes else set()
        entities = ({e for s in val for e in s.entities} if "entities" in args.sft_excludes
                    else set())
        train = ws_mod._load_split(ws, "train")
        kept = [s for s in train
                if s.template not in templates and not set(s.entities) & entities]
        write_set(ws.set_dir, kept, ws_mod._load_split(ws, "val"))
        say(f"warm start: {len(kept)} of {len(train)} SFT scenarios kept (RL val "
            f"{' and '.join(sorted(args.sft_excludes)) or 'nothing'} removed)")
        ws_mod.stage_expert(ws, services)
    if args.prepare_only:
        return None
    ws_mod.stage_sft(ws)
    return cfg.output_dir.resolve()


async def _load_warm(engine_url: str, warm: Path) -> str:
    """Serve the warm-start adapter (for the before eval); returns its served name."""

    from mcprl_trainer.policy import PolicyClient

    policy = PolicyClient(engine_url)
    try:
        await policy.load_adapter("warm-start", str(warm))
    finally:
        await policy.aclose()
    return "warm-start"


# -- runs -------------------------------------------------------------------------------------
@dataclass
class Ctx:
    args: argparse.Namespace
    base_trainer: dict[str, Any]
    warm: Path
    engine_url: str
    served: str
    mcp_url: str
    judge_url: str
    set_id: str
    val: list
    renderer: Any
    eval_settings: Any
    child_env: dict[str, str]
    sample_settings: Any = None
    base: Path | None = None  # the served base when the warm start is a LoRA adapter
    services: Services | None = None  # starts a run's own engine (--engine-per-run)


async def heldout(ctx: Ctx, model: str, engine_url: str | None = None) -> dict[str, Any]:
    """Greedy held-out success; with ``--sampled-eval K`` also the success rate of K sampled
    rollouts per val scenario at the training temperature (the quantity GRPO optimises:
    a behaviour it makes rarer, such as answering without a query, can change it while the
    greedy path stays the same)."""

    from mcprl_demo.heldout import evaluate_heldout

    k = ctx.args.sampled_eval
    engine_url = engine_url or ctx.engine_url
    greedy = evaluate_heldout(ctx.val, base_url=engine_url, model=model,
                              mcp_url=ctx.mcp_url, renderer=ctx.renderer,
                              settings=ctx.eval_settings, concurrency=ctx.args.eval_concurrency,
                              seed=0)
    if k <= 0:
        return (await greedy).as_dict()
    res, sampled = await asyncio.gather(greedy, evaluate_heldout(
        [s for s in ctx.val for _ in range(k)], base_url=engine_url, model=model,
        mcp_url=ctx.mcp_url, renderer=ctx.renderer, settings=ctx.sample_settings,
        concurrency=ctx.args.eval_concurrency, seed=1))
    out = res.as_dict()
    if k > 0:
        out["sampled_success_rate"] = sampled.success_rate
        out["sampled_n"] = sampled.n
        out["sampled_query_rate"] = sampled.query_rate
    return out


def trainer_config(ctx: Ctx, arm: Arm, seed: int, engine_url: str) -> dict[str, Any]:
    a = ctx.args
    cfg = _merge(ctx.base_trainer, {
        "name": f"{arm.name}-s{seed}", "seed": seed,
        "output_dir": str(a.out / "runs"), "steps": a.max_steps, "keep_checkpoints": 1,
        "save_rollouts": a.save_rollouts,
        "model": str(ctx.base or ctx.warm), "keep_checkpoints_every": a.curve_every,
        "policy": {"base_url": engine_url, "model": ctx.served},
        "mcp": {"url": ctx.mcp_url}, "judge": {"url": ctx.judge_url},
        "scenarios": {"dir": str(a.out / "scenarios"), "set_id": ctx.set_id, "url": None},
        "reward": {"mode": "verifiable"}, "eval": {"every": 0},
        "status": {"enabled": False},
        "train": {"device": "cpu" if a.device == "cpu" else "auto"},
    })
    # An adapter warm start is trained further; a full-weight one gets a fresh LoRA (whatever
    # adapter the trainer config names belongs to its own model, e.g. the demo's careless one).
    adapter = str(ctx.warm) if ctx.base is not None else None
    cfg = _merge(cfg, {"lora": {"init_adapter": adapter}})
    return _merge(cfg, arm.overrides)


def pick_evenly(items: list[Any], n: int) -> list[Any]:
    """At most ``n`` of ``items``, evenly spaced, the last one included."""

    if n <= 0 or len(items) <= n:
        return items
    return [items[round((i + 1) * len(items) / n) - 1] for i in range(n)]


def run_one(ctx: Ctx, arm: Arm, seed: int) -> dict[str, Any]:
    """One trainer process under the budget, then held-out success of its last adapter."""

    a = ctx.args
    name = f"{arm.name}-s{seed}"
    engine_url, own_engine = ctx.engine_url, None
    try:
        if a.engine_per_run and ctx.services is not None:
            # The engine batches one LoRA at a time: runs sharing it wait for each other's
            # turns. One engine per run (same device, same settings for every arm) removes it.
            engine_url, _, own_engine = ctx.services.engine(
                ctx.base or ctx.warm, a.device, max_loras=4,
                runs_dir=a.out / "stack" / f"engine-{name}")
        return _run_one(ctx, arm, seed, engine_url)
    except Exception as exc:  # one run's failure (an engine that cannot start) is reported
        say(f"{name}: failed: {exc!r}")  # in the JSON; the other runs' results are kept
        return {"arm": arm.name, "seed": seed, "name": name, "after": None,
                "error": f"{type(exc).__name__}: {exc}"}
    finally:
        if own_engine is not None:
            own_engine.stop()  # frees its GPU memory for the runs still queued


def _run_one(ctx: Ctx, arm: Arm, seed: int, engine_url: str) -> dict[str, Any]:
    from mcprl_trainer.checkpoint import latest_checkpoint, list_checkpoints
    from mcprl_trainer.policy import PolicyClient

    a = ctx.args
    cfg = trainer_config(ctx, arm, seed, engine_url)
    run_dir = a.out / "runs" / cfg["name"]
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cfg_path = a.out / "configs" / f"{cfg['name']}.yaml"
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    log_path = a.out / "logs" / f"train-{cfg['name']}.log"
    started = time.monotonic()
    with log_path.open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mcprl_trainer.cli", "--config",
                                 str(cfg_path), "--no-progress"], cwd=ROOT, env=ctx.child_env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        stopped = False
        try:
            proc.wait(a.budget_s)
        except subprocess.TimeoutExpired:  # budget spent: stop after the current step
            stopped = True
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(a.stop_grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    seconds = time.monotonic() - started
    rows = report.read_jsonl(run_dir / "metrics.jsonl")
    run: dict[str, Any] = {"arm": arm.name, "seed": seed, "name": cfg["name"],
                           "exit_code": proc.returncode, "budget_stopped": stopped,
                           "seconds": round(seconds, 1), "train": report.summarize_steps(rows),
                           "after": None}
    latest = latest_checkpoint(run_dir)
    if latest is None:
        run["error"] = f"no checkpoint (see {log_path})"
        say(f"{cfg['name']}: no step finished in {seconds:.0f}s; see {log_path}")
        return run

    async def evaluate(step: int, adapter: str | None) -> dict[str, Any]:
        """Held-out success on this run's engine of an adapter (an absolute path), or (None)
        of the model the engine serves."""

        if adapter is None:
            return await heldout(ctx, ctx.served, engine_url)
        policy = PolicyClient(engine_url)
        name = f"{cfg['name']}-step{step}"
        try:
            await policy.load_adapter(name, adapter)
            res = await heldout(ctx, name, engine_url)
            await policy.unload_adapter(name)
            return res
        finally:
            await policy.aclose()

    run["checkpoint_step"] = latest.step
    run["steps_per_minute"] = round(len(rows) / (seconds / 60), 2) if seconds else None
    try:
        run["after"] = asyncio.run(evaluate(latest.step, str(latest.path.resolve())))
    except Exception as exc:  # the eval's own retries gave up: keep the run's training record
        run["error"] = f"held-out eval of step {latest.step} failed: {exc!r}"
        say(f"{cfg['name']}: {run['error']}")
        return run
    if a.paired_before:
        # The start again, on this run's engine right after its after: greedy decoding in
        # bf16 is not bit-stable across batch compositions (the same warm start read 6.2-12.5%
        # on 32 scenarios in four runs), so a gain is also read against a before measured
        # under the same engine and load, and averaged over seeds.
        start = str(ctx.warm) if ctx.base is not None else None  # an adapter, or the base
        try:
            run["before"] = asyncio.run(evaluate(0, start))
        except Exception as exc:
            run["before_error"] = repr(exc)
    if a.curve_every:  # held-out success along the run, from the checkpoints kept for it
        points = pick_evenly([c for c in list_checkpoints(run_dir) if c.step % a.curve_every == 0
                              and c.step != latest.step], a.curve_points)
        run["curve"] = []
        minutes = report.rl_minutes(rows)

        def point(step: int, res: dict[str, Any]) -> dict[str, Any]:
            return {"step": step, "minutes": minutes.get(step), **report.curve_point(res)}

        for c in points:  # a point that cannot be evaluated is named, not fatal to the run
            try:
                run["curve"].append(point(c.step, asyncio.run(
                    evaluate(c.step, str(c.path.resolve())))))
            except Exception as exc:
                run.setdefault("curve_errors", []).append(f"step {c.step}: {exc!r}")
        run["curve"].append(point(latest.step, run["after"]))
    say(f"{cfg['name']}: {len(rows)} steps in {seconds:.0f}s, held-out success "
        f"{run['after']['success_rate']:.3f}")
    return run


# -- main -------------------------------------------------------------------------------------
def _extra_arm(spec: str) -> Arm:
    """``NAME:KEY=VALUE[;KEY=VALUE]:SEEDS`` -> an arm (dotted trainer keys, YAML values)."""

    try:
        name, sets, seeds = spec.split(":")
        overrides: dict[str, Any] = {}
        for item in filter(None, sets.split(";")):
            key, _, raw = item.partition("=")
            overrides = _merge(overrides, _nested(key.strip(), yaml.safe_load(raw)))
        return Arm(name, int(seeds), overrides, f"extra arm: {sets}")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"--extra-arm expects NAME:KEY=VALUE[;KEY=VALUE]:SEEDS, got {spec!r}") from exc


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    node: dict[str, Any] = {}
    set_path(node, tuple(dotted.split(".")), value)
    return node


def _model_name(path: Path) -> str:
    """What a model folder is: the hub id a base records (make base-model), else its name."""

    marker = path / "mcprl-base.json"
    if marker.exists():
        return json.loads(marker.read_text()).get("hub_id", path.name)
    return path.name


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--smoke", action="store_true",
                   help="tiny-test model, 2 steps, few scenarios, 1 seed per arm (CPU, minutes)")
    p.add_argument("--arms", default="", help="comma-separated subset of "
                   "grpo,shuffled,g8,no-skip,kl (default all)")
    p.add_argument("--extra-arm", dest="extra_arms", action="append", default=[],
                   type=_extra_arm, metavar="NAME:KEY=VALUE[;KEY=VALUE]:SEEDS",
                   help="one more arm: trainer overrides and its seed count, e.g. "
                   "'lr1e-3:train.lr=1e-3:1' (compared with grpo)")
    p.add_argument("--seeds", type=int, help="seeds of every arm (default: 3 for grpo, "
                   "--control-seeds for shuffled, 1 for the ablations)")
    p.add_argument("--control-seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0,
                   help="trainer seed of each arm's first run (a re-run with other seeds)")
    p.add_argument("--budget-s", type=float, default=120.0, help="wall clock per run")
    p.add_argument("--max-steps", type=int, default=200, help="steps per run at most")
    p.add_argument("--stop-grace-s", type=float, default=90.0,
                   help="after the budget, time to finish the current step before SIGKILL")
    p.add_argument("--parallel", type=int, default=0,
                   help="runs at once (default: 3 on CUDA, 1 on CPU)")
    p.add_argument("--engine-per-run", action="store_true",
                   help="give every run its own engine on the same device (the engine runs "
                   "one LoRA per batch, so runs sharing one wait on each other's turns)")
    p.add_argument("--scenarios", type=int, default=400, help="sql scenarios generated")
    p.add_argument("--val-fraction", type=float, default=0.25)
    p.add_argument("--eval-max", type=int, default=64, help="val scenarios evaluated at most")
    p.add_argument("--eval-concurrency", type=int, default=8)
    p.add_argument("--sampled-eval", type=int, default=0, metavar="K",
                   help="also score K rollouts per val scenario sampled at the training "
                        "temperature (0: greedy only)")
    p.add_argument("--seed", type=int, default=0, help="scenario set seed")
    p.add_argument("--warm-start", type=Path, help="reuse this checkpoint: an HF model dir, "
                   "or a LoRA adapter on --base-model")
    p.add_argument("--base-model", type=Path, help="a pretrained base (e.g. "
                   "models/smollm2-135m-instruct): the engine serves it, the warm start is a "
                   "LoRA adapter on it, and each run trains that adapter further")
    p.add_argument("--sft-excludes", default="templates,entities",
                   type=lambda v: {x.strip() for x in v.split(",") if x.strip()},
                   help="what of the RL val split the warm start's SFT never sees: "
                   "templates,entities (default) or entities")
    p.add_argument("--prepare-only", action="store_true",
                   help="stop once the warm start's demonstrations are written (CPU work, to "
                   "carry to a GPU box with --reuse-warmstart-data)")
    p.add_argument("--reuse-warmstart-data", action="store_true",
                   help="use the demonstrations already under OUT/warmstart (from "
                   "--prepare-only with the same arguments) and only run SFT")
    p.add_argument("--paired-before", action=argparse.BooleanOptionalAction, default=True,
                   help="evaluate the start again on each run's engine after its run, for a "
                        "gain paired run by run (default on)")
    p.add_argument("--curve-every", type=int, default=0, metavar="K",
                   help="keep every K-th step's adapter and evaluate it after the run: "
                   "held-out success along the run (0: before and after only)")
    p.add_argument("--curve-points", type=int, default=5, metavar="N",
                   help="of those, evaluate at most N evenly spaced ones (plus the last)")
    p.add_argument("--build-warm-start", action="store_true",
                   help="with --smoke: run the demo's recipe at toy size instead of using "
                   "models/tiny-test as the warm start")
    p.add_argument("--warmstart-config", type=Path, default=ROOT / "configs" / "warmstart.yaml")
    p.add_argument("--warmstart-set", action="append", default=[], metavar="KEY=VALUE",
                   type=lambda s: (s.partition("=")[0], yaml.safe_load(s.partition("=")[2])),
                   help="override a warm-start recipe field, e.g. sft.steps=300")
    p.add_argument("--trainer-config", type=Path, default=ROOT / "configs" / "demo.yaml",
                   help="run config whose `trainer:` section (or whole file) is the base")
    p.add_argument("--set", dest="trainer_set", action="append", default=[], metavar="KEY=VALUE",
                   type=lambda s: (s.partition("=")[0], yaml.safe_load(s.partition("=")[2])),
                   help="override a trainer field for every arm, e.g. train.lr=2e-4")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "learning")
    p.add_argument("--save-rollouts", action="store_true",
                   help="keep every step's trajectories (runs/*/rollouts/; large)")
    p.add_argument("--write-docs", action="store_true", help="update docs/results.md")
    args = p.parse_args(argv)
    args.out = args.out.resolve()
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.smoke:
        args.max_steps = min(args.max_steps, 2)
        args.scenarios = min(args.scenarios, 40)
        args.eval_max = min(args.eval_max, 4)
        args.seeds = 1
    if not args.parallel:
        args.parallel = 3 if args.device == "cuda" else 1
    return args


def base_trainer_config(args: argparse.Namespace) -> dict[str, Any]:
    data = yaml.safe_load(args.trainer_config.read_text()) or {}
    base = dict(data.get("trainer", data))
    if args.smoke:  # the tiny-test model babbles: short turns keep the smoke in minutes
        base = _merge(base, {"group_size": 2, "groups_per_step": 2,
                             "rollout": {"max_turns": 2, "max_tokens_per_turn": 24,
                                         "min_tokens_per_turn": 8, "concurrency": 4},
                             "train": {"micro_batch_tokens": 4096}})
    for key, value in args.trainer_set:
        base = _merge(base, _nested(key, value))
    return base


def select_arms(args: argparse.Namespace) -> dict[str, Arm]:
    """The arms to run: ``--arms`` picks among the built-in ones, and every ``--extra-arm``
    runs as well (naming it in ``--arms`` is not needed: a subset that left out an arm asked
    for on the same line would drop it without a word)."""

    arms = default_arms(args.control_seeds)
    if args.arms:
        wanted = [x.strip() for x in args.arms.split(",") if x.strip()]
        known = [*arms, *(e.name for e in args.extra_arms)]
        unknown = [x for x in wanted if x not in known]
        if unknown:
            raise SystemExit(f"unknown arm(s) {unknown}; known: {', '.join(known)}")
        arms = {k: arms[k] for k in wanted if k in arms}
    for extra in args.extra_arms:
        arms[extra.name] = extra
    if args.seeds:
        for arm in arms.values():
            arm.seeds = args.seeds
    return arms


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_open_files_limit()  # the held-out evals of every run share this process
    t0 = time.monotonic()
    arms = select_arms(args)
    args.out.mkdir(parents=True, exist_ok=True)
    base_trainer = base_trainer_config(args)
    threads = max(1, (os.cpu_count() or 2) // (args.parallel + 1)) if args.device == "cpu" else 2
    extra = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
             "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads),
             "PYTHONPATH": os.pathsep.join([*map(str, SRC_DIRS),
                                            os.environ.get("PYTHONPATH", "")])}
    env = {**os.environ, **extra}  # the trainers' environment
    for var in ("POLICY_BASE_URL", "POLICY_MODEL", "MCP_URL", "JUDGE_URL", "SCENARIO_GEN_URL"):
        env.pop(var, None)  # the trainer is wired by its YAML only
    env = {k: v for k, v in env.items() if not k.startswith("TRAINER_")}
    seconds: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = time.monotonic()
        seconds[name] = round(now - since, 1)
        return now

    with ExitStack() as exits:
        services = Services(args.out, exits, extra)
        mark = time.monotonic()
        set_id, train, val = make_scenarios(services, args.out, args.scenarios, args.seed,
                                            args.val_fraction)
        say(f"scenarios {set_id}: {len(train)} train / {len(val)} val")
        mark = lap("scenarios", mark)
        if args.warm_start:
            warm = args.warm_start.resolve()
        elif args.smoke and not args.build_warm_start:
            warm = (ROOT / "models" / "tiny-test").resolve()  # smoke: skip the recipe
        else:  # the recipe reports on stdout: keep stdout for the JSON alone
            with contextlib.redirect_stdout(sys.stderr):
                built = build_warm_start(services, args, val)
            if built is None:  # --prepare-only
                say(f"warm-start data ready under {args.out / 'warmstart'}")
                return 0
            warm = built
        mark = lap("warm_start", mark)
        adapter = (warm / "adapter_config.json").is_file()
        if adapter and args.base_model is None:
            raise SystemExit(f"{warm} is a LoRA adapter: pass --base-model (its base)")
        base = args.base_model.resolve() if adapter else None
        engine_url, served, _ = services.engine(base or warm, args.device,
                                                max_loras=2 * args.parallel + 4)
        judge_url = services.judge(engine_url, served)
        mark = lap("services", mark)
        from transformers import AutoTokenizer

        from mcprl_trainer.config import RolloutConfig
        from mcprl_trainer.rendering import ChatRenderer
        from mcprl_trainer.rollout import RolloutSettings

        ro = RolloutConfig(**(base_trainer.get("rollout") or {}))
        ctx = Ctx(args, base_trainer, warm, engine_url, served, services.mcp_url(), judge_url,
                  set_id, sorted(val, key=lambda s: s.id)[: args.eval_max],
                  ChatRenderer(AutoTokenizer.from_pretrained(base or warm)),
                  RolloutSettings.from_config(ro, temperature=0.0), env,
                  RolloutSettings.from_config(ro), base, services)
        before_model = served if base is None else asyncio.run(_load_warm(engine_url, warm))
        before = asyncio.run(heldout(ctx, before_model))
        say(f"warm start: held-out success {before['success_rate']:.3f} on {before['n']}")
        mark = lap("before_eval", mark)
        first = args.first_seed
        jobs = [(arm, seed) for arm in arms.values() for seed in range(first, first + arm.seeds)]
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            done = list(pool.map(lambda job: run_one(ctx, *job), jobs))
        lap("runs", mark)
    by_arm: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    for run in done:
        by_arm[run["arm"]].append(run)
    summary = report.aggregate(by_arm, before["success_rate"],
                               before.get("sampled_success_rate"), before)
    means = {k: v["after"]["mean"] for k, v in summary.items()}
    pairs = {**COMPARISONS, **{f"{a.name} - grpo": (a.name, "grpo") for a in args.extra_arms}}
    comparisons = {name: means[x] - means[y] for name, (x, y) in pairs.items()
                   if means.get(x) is not None and means.get(y) is not None}
    png = report.plot_curves(by_arm, before, args.out / "curves.png")
    seconds["total"] = round(time.monotonic() - t0, 1)
    import torch

    result = {
        "bench": "learning_run", "finished_at": time.strftime("%Y-%m-%d %H:%M"),
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "json_path": str(args.out / "learning_run.json"),
        "setup": {"warm_start": str(warm), "set_id": set_id,
                  "model": _model_name(base or warm), "base_model": str(base) if base else None,
                  "sft_excludes": sorted(args.sft_excludes), "curve_every": args.curve_every,
                  "warm_start_sft_excludes_val": (
                      f"yes: built here without the val {' and '.join(sorted(args.sft_excludes))}"
                      if not args.warm_start and warm.name != "tiny-test" else
                      "unknown: a reused checkpoint may have seen the val templates in SFT"),
                  "db_seed": DB_SEED,
                  "train": len(train), "val": len(val), "eval_n": len(ctx.val),
                  "val_templates": sorted({s.template or "?" for s in val}),
                  "train_templates": sorted({s.template or "?" for s in train}),
                  "budget_s": args.budget_s, "max_steps": args.max_steps,
                  "parallel": args.parallel, "engine_per_run": args.engine_per_run,
                  "smoke": args.smoke, "first_seed": args.first_seed,
                  "sampled_eval": args.sampled_eval, "paired_before": args.paired_before,
                  "group_size": base_trainer.get("group_size"),
                  "groups_per_step": base_trainer.get("groups_per_step"),
                  "lr": (base_trainer.get("train") or {}).get("lr"),
                  "arms": {k: {"seeds": v.seeds, "overrides": v.overrides, "why": v.why}
                           for k, v in arms.items()}},
        "before": before, "arms": summary, "comparisons": comparisons,
        "runs": done, "curves_png": str(png) if png else None, "seconds": seconds,
    }
    (args.out / "learning_run.json").write_text(json.dumps(result, indent=2, default=str))
    if args.write_docs:
        command = "python3 bench/learning_run.py " + " ".join(
            a for a in (argv if argv is not None else sys.argv[1:]))
        doc_png = None
        if png:
            doc_png = ROOT / "docs" / "img" / "learning-run.png"
            doc_png.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(png, doc_png)
        section = report.results_section(result, command,
                                         "img/learning-run.png" if doc_png else None)
        (args.out / "results-section.md").write_text(section)
        report.write_results_section(ROOT / "docs" / "results.md", section)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
