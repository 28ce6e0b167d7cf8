"""Figures of bench/learning_run.py: per-run summaries from the trainer's metrics.jsonl, per-arm
mean and spread, the curves as a PNG, and the docs/results.md section (pure functions + files).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

# Trainer metrics (metrics.jsonl, one row per step) summarised per run: the diagnostics the
# issue asks for when RL does not lift success (reward variance, advantages, clipping, KL).
STEP_METRICS = ("reward_mean", "reward_std", "success_rate", "adv_mean", "adv_std",
                "adv_abs_mean", "clip_fraction", "kl", "loss", "grad_norm", "step_seconds")
SECTION_BEGIN = "<!-- learning-run:begin (bench/learning_run.py --write-docs) -->"
SECTION_END = "<!-- learning-run:end -->"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def spread(values: list[float]) -> dict[str, Any]:
    """Mean, sample std, min and max of a few numbers (one per seed)."""

    if not values:
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None}
    return {"n": len(values), "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def summarize_steps(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over the run's steps, the share of zero-variance groups, and the reward curve."""

    out: dict[str, Any] = {"steps": len(rows)}
    for key in STEP_METRICS:
        out[key] = _mean([float(r[key]) for r in rows if isinstance(r.get(key), int | float)])
    groups = sum(float(r.get("groups_total", 0)) for r in rows)
    out["zero_variance_fraction"] = (
        sum(float(r.get("groups_zero_variance", 0)) for r in rows) / groups if groups else None)
    out["groups_trained"] = sum(float(r.get("groups_trained", 0)) for r in rows)
    out["curve"] = [[int(r["step"]), round(float(r.get("reward_mean", 0.0)), 4)] for r in rows]
    return out


def aggregate(arms: dict[str, list[dict[str, Any]]], before: float,
              before_sampled: float | None = None) -> dict[str, Any]:
    """Per arm: held-out success after (and gain over ``before``) across seeds, plus the
    seed-averaged trainer diagnostics; the sampled success too when it was measured."""

    out: dict[str, Any] = {}
    for arm, runs in arms.items():
        ok = [r for r in runs if r.get("after") is not None]
        metrics: dict[str, Any] = {}
        for key in (*STEP_METRICS, "zero_variance_fraction", "steps"):
            vals = [r["train"][key] for r in ok if r["train"].get(key) is not None]
            metrics[key] = _mean(vals)
        out[arm] = {
            "runs": len(runs), "failed": len(runs) - len(ok), "before": before,
            "after": spread([r["after"]["success_rate"] for r in ok]),
            "gain": spread([r["after"]["success_rate"] - before for r in ok]),
            "train": metrics,
        }
        sampled = [r["after"]["sampled_success_rate"] for r in ok
                   if r["after"].get("sampled_success_rate") is not None]
        if sampled and before_sampled is not None:
            out[arm]["after_sampled"] = spread(sampled)
            out[arm]["gain_sampled"] = spread([v - before_sampled for v in sampled])
    return out


def plot_curves(arms: dict[str, list[dict[str, Any]]], before: float, path: Path) -> Path | None:
    """Training reward per step for every run (left) and held-out success before/after per
    arm (right)."""

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # figures are optional; the JSON carries the curves too
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (arm, runs) in enumerate(arms.items()):
        for j, run in enumerate(runs):
            curve = run["train"].get("curve") or []
            if curve:
                xs, ys = zip(*curve, strict=True)
                left.plot(xs, ys, color=colors[i % len(colors)], alpha=0.8,
                          label=arm if j == 0 else None)
        afters = [r["after"]["success_rate"] for r in runs if r.get("after")]
        if afters:
            right.scatter([i] * len(afters), afters, color=colors[i % len(colors)])
            right.hlines(sum(afters) / len(afters), i - 0.3, i + 0.3,
                         color=colors[i % len(colors)])
    right.axhline(before, color="black", linestyle="--", label="warm start (before)")
    right.set_xticks(range(len(arms)), list(arms), rotation=20)
    left.set(xlabel="step", ylabel="train reward (mean of the step)", title="training reward")
    right.set(ylabel="held-out success", title="held-out success after the budget")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def results_section(result: dict[str, Any], command: str, png: str | None) -> str:
    """The Markdown of docs/results.md's learning-run section."""

    s = result["setup"]
    lines = [
        SECTION_BEGIN,
        "## RL learning run (issue 9): held-out success before and after GRPO",
        "",
        f"Measured {result['finished_at']} on {result['device']} by `bench/learning_run.py` "
        f"(raw JSON: `{result['json_path']}`). Warm start `{s['warm_start']}`; `sql` "
        f"scenarios on database seed {s['db_seed']}: {s['train']} train / {s['val']} val, "
        f"the val templates ({', '.join(s['val_templates']) or '-'}) and entities never in "
        f"the RL training split. Held-out success = greedy rollouts on {s['eval_n']} val "
        f"scenarios, each answer checked by the verifiable checker. Every run has the same "
        f"budget: {s['budget_s']:.0f} s wall clock or {s['max_steps']} steps "
        f"(G={s['group_size']}, {s['groups_per_step']} scenarios per step, lr {s['lr']}).",
        "",
        "Reproduce:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Warm start (before): held-out success **{_pct(result['before']['success_rate'])}%**.",
        "",
        "| arm | runs | after, mean ± std (%) | gain, mean (min..max) (pts) | steps | "
        "reward std | mean abs adv | zero-var groups | clip frac | KL |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, a in result["arms"].items():
        t = a["train"]
        g = a["gain"]
        lines.append(
            f"| {arm} | {a['runs'] - a['failed']}/{a['runs']} | {_pct(a['after']['mean'])} ± "
            f"{_pct(a['after']['std'])} | {_pct(g['mean'])} ({_pct(g['min'])}..{_pct(g['max'])})"
            f" | {_num(t['steps'], '.1f')} | {_num(t['reward_std'])} | "
            f"{_num(t['adv_abs_mean'])} | {_pct(t['zero_variance_fraction'])}% | "
            f"{_num(t['clip_fraction'])} | {_num(t['kl'], '.4f')} |")
    if "sampled_success_rate" in result["before"]:
        lines += ["", f"Sampled at the training temperature ({result['before']['sampled_n']} "
                  f"rollouts: each val scenario {s.get('sampled_eval')} times), before: "
                  f"**{_pct(result['before']['sampled_success_rate'])}%**, query rate "
                  f"{_pct(result['before'].get('sampled_query_rate'))}%.", "",
                  "| arm | after, mean ± std (%) | gain, mean (min..max) (pts) |", "|---|---|---|"]
        for arm, a in result["arms"].items():
            if "after_sampled" in a:
                g = a["gain_sampled"]
                lines.append(f"| {arm} | {_pct(a['after_sampled']['mean'])} ± "
                             f"{_pct(a['after_sampled']['std'])} | {_pct(g['mean'])} "
                             f"({_pct(g['min'])}..{_pct(g['max'])}) |")
    lines += ["", "Comparisons (difference of mean held-out success, points):", ""]
    for name, value in result["comparisons"].items():
        lines.append(f"- {name}: {_pct(value)}")
    if png:
        lines += ["", f"![training reward and held-out success]({png})"]
    lines += ["", SECTION_END, ""]
    return "\n".join(lines)


def write_results_section(doc: Path, section: str) -> None:
    """Replace the learning-run section of ``doc`` (or append it), keeping everything else."""

    text = doc.read_text() if doc.exists() else "# Results\n"
    if SECTION_BEGIN in text and SECTION_END in text:
        head, rest = text.split(SECTION_BEGIN, 1)
        tail = rest.split(SECTION_END, 1)[1].lstrip("\n")
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    tmp = doc.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(doc)
