"""The run's final report: ``report.json``, ``report.md``, ``reward_curve.png`` and the page
people look at, ``report.html`` (see :mod:`mcprl_trainer.html_report`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcprl_trainer.html_report import update_report

EVAL_COLUMNS = ("success_rate", "mean_reward", "mean_turns", "tool_error_rate")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def plot_curves(history: list[dict[str, Any]], evals: list[dict[str, Any]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    steps = [h["step"] for h in history]
    if steps:
        mean = [h.get("reward_mean", 0.0) for h in history]
        std = [h.get("reward_std", 0.0) for h in history]
        ax.plot(steps, mean, marker="o", label="train reward (mean)")
        ax.fill_between(steps, [max(0.0, m - s) for m, s in zip(mean, std, strict=True)],
                        [min(1.0, m + s) for m, s in zip(mean, std, strict=True)], alpha=0.2,
                        label="± std")
    if evals:
        ax.plot([e["step"] for e in evals], [e["success_rate"] for e in evals], marker="s",
                label="val success rate")
        ax.plot([e["step"] for e in evals], [e["mean_reward"] for e in evals], marker="^",
                linestyle="--", label="val reward (mean)")
    ax.set_xlabel("step")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    ax.set_title("mcp-rl: reward and success")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def write_report(run_dir: Path, *, config: dict[str, Any], history: list[dict[str, Any]],
                 evals: list[dict[str, Any]], stopped_early: bool = False) -> dict[str, Path]:
    first, last = (evals[0], evals[-1]) if evals else (None, None)
    report = {
        "run": config.get("name"),
        "model": config.get("model"),
        "steps_done": history[-1]["step"] if history else 0,
        "steps_planned": config.get("steps"),
        "stopped_early": stopped_early,
        "eval_before": first,
        "eval_after": last,
        "evals": evals,
        "history": history,
        "config": config,
    }
    paths = {"json": run_dir / "report.json", "md": run_dir / "report.md",
             "png": run_dir / "reward_curve.png"}
    paths["json"].write_text(json.dumps(report, indent=1, default=str))
    plot_curves(history, evals, paths["png"])
    lines = [f"# Run `{report['run']}`", "",
             f"Model `{report['model']}`, {report['steps_done']}/{report['steps_planned']} steps"
             + (" (stopped early)" if stopped_early else "") + ".", ""]
    if first and last:
        lines += [f"| metric | before (step {first['step']}) | after (step {last['step']}) |",
                  "|---|---|---|"]
        lines += [f"| {c} | {_fmt(first.get(c))} | {_fmt(last.get(c))} |" for c in EVAL_COLUMNS]
        lines.append("")
    if history:
        lines += ["| step | reward | std | success | trained groups | loss | clip | "
                  "rollout s | judge s | train s |", "|---|---|---|---|---|---|---|---|---|---|"]
        for h in history:
            lines.append("| {step} | {r} | {s} | {sr} | {g} | {loss} | {clip} | {ro} | {j} | {t} |"
                         .format(step=h["step"], r=_fmt(h.get("reward_mean", 0.0)),
                                 s=_fmt(h.get("reward_std", 0.0)),
                                 sr=_fmt(h.get("success_rate", 0.0)),
                                 g=int(h.get("groups_trained", 0)),
                                 loss=_fmt(h.get("loss", 0.0)),
                                 clip=_fmt(h.get("clip_fraction", 0.0)),
                                 ro=_fmt(h.get("rollout_seconds", 0.0)),
                                 j=_fmt(h.get("judge_seconds", 0.0)),
                                 t=_fmt(h.get("train_seconds", 0.0))))
        lines.append("")
    lines.append("![reward curve](reward_curve.png)")
    paths["md"].write_text("\n".join(lines) + "\n")
    paths["html"] = update_report(run_dir)
    return paths
