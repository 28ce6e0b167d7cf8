"""Why a shuffled-reward control drifts: GRPO updates replayed on fixed demonstrations.

The learning run's shuffled-reward control (bench/learning_run.py, arm ``shuffled``) should
leave the policy where it started: a uniform permutation of each group's rewards makes the
expected policy gradient zero. On an H200 it did not: SmolLM2's control fell 6 points and
stopped querying (docs/results.md). This bench isolates the update from the rollouts. It
takes the scripted expert's demonstrations (the rows the warm start was fine-tuned on: some
run the query, some answer without looking), builds groups of them with the warm start's
mix (``--query-share``) and success rates (``--p-success``), and runs the trainer's own
update (GRPOUpdater) on them, once with the true rewards and with shuffled ones over several
seeds. After every ``--probe-every`` steps it reads the decision itself on held-out rows: the
log-odds of ``run_query`` over ``complete_task`` at the turn where the expert chose between
them. Variants (optimizer, learning rate, KL to the warm start, batch size, a fresh LoRA on
the merged warm start) run side by side; the JSON says how far each control drifts next to
how far the true reward moves the same decision.

The rows come from the warm-start recipe:
  python -m mcprl_demo.warmstart --config configs/warmstart-smollm2.yaml \
      --stages scenarios,expert --set work_dir=data/drift --set scenarios.n=120
  python bench/control_drift.py --rows data/drift/sft.jsonl --device cuda \
      --variant base: --variant lr3e-5:lr=3e-5 --variant kl0.1:kl=0.1 --variant sgd:opt=sgd,lr=0.3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
for pkg in ("common", "trainer"):
    sys.path.insert(0, str(ROOT / pkg / "src"))

from mcprl_trainer.advantages import group_advantages, shuffle_within_group  # noqa: E402
from mcprl_trainer.config import LoraSettings, TrainConfig  # noqa: E402
from mcprl_trainer.grpo import GRPOUpdater, TrainSample  # noqa: E402
from mcprl_trainer.modeling import (  # noqa: E402
    attach_lora,
    attach_reference,
    load_base_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
)

CALL_PREFIX = '<tool_call>\n{"name": "'  # the Hermes tool call, up to the tool's name


@dataclass(frozen=True)
class Variant:
    name: str
    lr: float = 1e-4
    kl: float = 0.0
    opt: str = "adamw"
    groups: int = 4
    warmup: int = 0
    fresh: bool = False  # merge the warm start into the base, train a new LoRA from B = 0

    @classmethod
    def parse(cls, spec: str) -> Variant:
        name, _, rest = spec.partition(":")
        kwargs: dict[str, Any] = {}
        types = {"lr": float, "kl": float, "opt": str, "groups": int, "warmup": int,
                 "fresh": lambda v: v.lower() in ("1", "true", "yes")}
        for item in filter(None, (x.strip() for x in rest.split(","))):
            key, _, value = item.partition("=")
            if key not in types:
                raise SystemExit(f"--variant {spec!r}: unknown key {key!r} ({sorted(types)})")
            kwargs[key] = types[key](value)
        return cls(name=name or "base", **kwargs)


@dataclass
class Row:
    input_ids: list[int]
    mask: list[int]
    decision: int  # index of the tool name's first token at the query-or-answer turn
    query: bool


def name_tokens(tokenizer) -> tuple[int, int, int]:
    """Tokens of the call prefix, and the first token of each decision's tool name."""

    prefix = tokenizer.encode(CALL_PREFIX, add_special_tokens=False)
    firsts = []
    for name in ("run_query", "complete_task"):
        ids = tokenizer.encode(CALL_PREFIX + name, add_special_tokens=False)
        if ids[: len(prefix)] != prefix:
            raise SystemExit(f"the tokenizer merges {CALL_PREFIX!r} into the tool name")
        firsts.append(ids[len(prefix)])
    if firsts[0] == firsts[1]:
        raise SystemExit("run_query and complete_task start with the same token")
    return len(prefix), firsts[0], firsts[1]


def decision_rows(path: Path, tokenizer) -> list[Row]:
    """The demonstrations that reach the decision: their first tool call named run_query or
    complete_task, and where its name starts."""

    offset, run, complete = name_tokens(tokenizer)
    rows = []
    for line in path.read_text().splitlines():
        data = json.loads(line)
        ids, mask = data["input_ids"], data["mask"]
        i = 0
        while i < len(mask):
            if not mask[i]:
                i += 1
                continue
            pos = i + offset
            if pos < len(ids) and ids[pos] in (run, complete):
                rows.append(Row(ids, mask, pos, ids[pos] == run))
                break
            while i < len(mask) and mask[i]:
                i += 1
    return rows


class Replay:
    """One variant, one reward arm, one seed: the warm start and its updater."""

    def __init__(self, args: argparse.Namespace, variant: Variant, tokenizer) -> None:
        self.args, self.variant, self.tok = args, variant, tokenizer
        device = resolve_device(args.device)
        dtype = resolve_dtype("auto", device)
        base = load_base_model(str(args.base_model), device, dtype)
        lora = LoraSettings(r=8, alpha=16, init_adapter=args.warm_start)
        if variant.fresh and args.warm_start is not None:
            from peft import PeftModel

            merged = PeftModel.from_pretrained(base, str(args.warm_start)).merge_and_unload()
            torch.manual_seed(0)
            model = attach_lora(merged, LoraSettings(r=8, alpha=16))
        else:
            model = attach_lora(base, lora)
            if variant.kl > 0 and args.warm_start is not None:
                attach_reference(model, args.warm_start)
        self.model = model.to(device)
        self.model.train()
        train = TrainConfig(optimizer=variant.opt, lr=variant.lr, loss="reinforce",
                            kl_coef=variant.kl, warmup_steps=variant.warmup,
                            micro_batch_tokens=args.micro_batch_tokens, shared_prefix=True,
                            device=args.device)
        self.updater = GRPOUpdater(self.model, train, tokenizer.pad_token_id)
        _, self.run_id, self.complete_id = name_tokens(tokenizer)

    @torch.no_grad()
    def probe(self, rows: list[Row]) -> list[float]:
        """log p(run_query) - log p(complete_task) at each row's decision."""

        self.model.eval()
        out = []
        device = next(self.model.parameters()).device
        for row in rows:
            ids = torch.tensor([row.input_ids[: row.decision]], device=device)
            with self.updater._autocast():
                logits = self.model(input_ids=ids).logits[0, -1].float()
            lp = torch.log_softmax(logits, -1)
            out.append(float(lp[self.run_id] - lp[self.complete_id]))
        self.model.train()
        return out

    def step(self, pool_q: list[Row], pool_g: list[Row], rng: random.Random, shuffled: bool):
        a = self.args
        samples = []
        for _ in range(self.variant.groups):
            members = [rng.choice(pool_q) if rng.random() < a.query_share else rng.choice(pool_g)
                       for _ in range(a.group_size)]
            p_q, p_g = a.p_success
            rewards = [float(rng.random() < (p_q if m.query else p_g)) for m in members]
            if shuffled:
                rewards = shuffle_within_group(rewards, rng)
            adv = group_advantages(rewards)
            if adv.zero_variance:
                continue
            samples += [TrainSample(m.input_ids, m.mask, [0.0] * len(m.mask), adv_i)
                        for m, adv_i in zip(members, adv.advantages, strict=True)]
        return self.updater.step(samples) if samples else {}


def run_one(args, variant: Variant, tok, rows, arm: str, seed: int) -> dict[str, Any]:
    probe_rows, pool_q, pool_g = rows
    torch.manual_seed(seed)
    replay = Replay(args, variant, tok)
    rng = random.Random(f"{seed}/{arm}")
    start = replay.probe(probe_rows)
    base = statistics.fmean(start)
    curve = [{"step": 0, "logit": base, "greedy_query": _share(start)}]
    t0 = time.perf_counter()
    kls = []
    for step in range(1, args.steps + 1):
        metrics = replay.step(pool_q, pool_g, rng, shuffled=(arm == "shuffled"))
        if "kl" in metrics:
            kls.append(metrics["kl"])
        if step % args.probe_every == 0 or step == args.steps:
            now = replay.probe(probe_rows)
            curve.append({"step": step, "logit": statistics.fmean(now),
                          "greedy_query": _share(now)})
    del replay
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"arm": arm, "seed": seed, "curve": curve,
            "delta_logit": curve[-1]["logit"] - base,
            "delta_greedy_query": curve[-1]["greedy_query"] - curve[0]["greedy_query"],
            "kl_mean": statistics.fmean(kls) if kls else None,
            "seconds": round(time.perf_counter() - t0, 1)}


def _share(logits: list[float]) -> float:
    return sum(1 for x in logits if x > 0) / len(logits)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(arm):
        d = [r["delta_logit"] for r in runs if r["arm"] == arm]
        if not d:
            return None
        return {"delta_logit_mean": statistics.fmean(d),
                "delta_logit_sem": statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else None,
                "delta_logit": d}
    true, shuf = stats("true"), stats("shuffled")
    out = {"true": true, "shuffled": shuf}
    if true and shuf and true["delta_logit_mean"]:
        out["drift_over_signal"] = shuf["delta_logit_mean"] / true["delta_logit_mean"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=Path, required=True, help="the expert's sft.jsonl")
    p.add_argument("--base-model", type=Path, default=ROOT / "models" / "smollm2-135m-instruct")
    p.add_argument("--warm-start", type=lambda v: None if v == "none" else Path(v),
                   default=ROOT / "demo" / "checkpoints" / "smollm2-warm-start",
                   help="the LoRA adapter the policy starts from; 'none': a fresh LoRA")
    p.add_argument("--device", default="auto")
    p.add_argument("--variant", action="append", default=[], type=Variant.parse,
                   metavar="NAME:KEY=VALUE,...", help="lr, kl, opt (adamw|sgd), groups, warmup, "
                   "fresh (new LoRA on the merged warm start); repeat for several")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--probe-every", type=int, default=5)
    p.add_argument("--probe-rows", type=int, default=16, help="held out per kind (query, guess)")
    p.add_argument("--true-seeds", type=int, default=1)
    p.add_argument("--shuffled-seeds", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--query-share", type=float, default=0.36,
                   help="share of a group's members that query (the warm start's, sampled)")
    p.add_argument("--p-success", type=float, nargs=2, default=(0.55, 0.05),
                   metavar=("QUERY", "GUESS"), help="success rate of each kind")
    p.add_argument("--micro-batch-tokens", type=int, default=32768)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    variants = args.variant or [Variant("base")]
    tok = load_tokenizer(str(args.base_model))
    rows = decision_rows(args.rows, tok)
    rng = random.Random(1234)
    rng.shuffle(rows)
    q = [r for r in rows if r.query]
    g = [r for r in rows if not r.query]
    n = args.probe_rows
    if len(q) <= n or len(g) <= n:
        raise SystemExit(f"{len(q)} query / {len(g)} guess rows: too few for {n} probes each")
    split = (q[:n] + g[:n], q[n:], g[n:])
    result: dict[str, Any] = {
        "bench": "control_drift", "device": args.device,
        "setup": {"rows": len(rows), "query_rows": len(q), "probe_rows": 2 * n,
                  "steps": args.steps, "group_size": args.group_size,
                  "query_share": args.query_share, "p_success": list(args.p_success),
                  "base_model": str(args.base_model),
                  "warm_start": str(args.warm_start) if args.warm_start else None},
        "variants": {},
    }
    if torch.cuda.is_available():
        result["device"] = torch.cuda.get_device_name()
    for variant in variants:
        runs = []
        plan = ([("true", s) for s in range(args.true_seeds)]
                + [("shuffled", s) for s in range(args.shuffled_seeds)])
        for arm, seed in plan:
            r = run_one(args, variant, tok, split, arm, seed)
            runs.append(r)
            print(f"[drift] {variant.name} {arm} seed {seed}: delta logit "
                  f"{r['delta_logit']:+.3f}, greedy query {r['curve'][0]['greedy_query']:.2f}"
                  f" -> {r['curve'][-1]['greedy_query']:.2f} ({r['seconds']} s)",
                  file=sys.stderr, flush=True)
        result["variants"][variant.name] = {"config": vars(variant), **summarise(runs),
                                            "runs": runs}
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "runs"}
                      for k, v in result["variants"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
