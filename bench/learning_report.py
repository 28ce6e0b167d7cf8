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
# The issue's bar: held-out success this far above the warm start; how soon each arm's runs
# first reach it (in RL minutes) is the per-minute comparison of arms (e.g. overlap vs sync).
GAIN_BAR = 0.20
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


def rl_minutes(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Minutes of RL at the end of each step: the steps' own seconds summed (the trainer's
    start-up and the evals after the run excluded), the clock a per-minute comparison of
    arms needs (an overlapped arm makes its steps shorter, not fewer)."""

    out: dict[int, float] = {}
    total = 0.0
    for r in rows:
        total += float(r.get("step_seconds") or 0.0)
        out[int(r["step"])] = round(total / 60, 3)
    return out


def minutes_to_gain(run: dict[str, Any], before: float, gain: float) -> float | None:
    """RL minutes at the first held-out eval of ``run`` whose greedy success is ``gain`` above
    ``before`` (None: never, or a curve without minutes)."""

    for p in run.get("curve") or []:
        if p.get("minutes") is not None and p["greedy"] - before >= gain - 1e-9:
            return float(p["minutes"])
    return None


def curve_point(res: dict[str, Any]) -> dict[str, Any]:
    """One point of a held-out curve from a ``heldout()`` result."""

    return {"greedy": res["success_rate"], "sampled": res.get("sampled_success_rate"),
            "query_rate": res.get("query_rate"),
            "sampled_query_rate": res.get("sampled_query_rate")}


def mean_curve(runs: list[dict[str, Any]], before: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The seed-mean of each curve quantity at the steps every run has a checkpoint for
    (step 0 = the warm start, shared by every run), then at each run's last step (runs stop
    at different steps when the budget is wall clock): that row has ``step`` = the mean last
    step and ``last_steps`` the per-run ones."""

    curves = [run.get("curve") or [] for run in runs]
    curves = [c for c in curves if c]
    out = [{"step": 0, "minutes": 0.0, **curve_point(before), "n": len(curves)}] if before else []
    if not curves:
        return out
    keys = ("minutes", "greedy", "sampled", "query_rate", "sampled_query_rate")

    def row(step: float, pts: list[dict[str, Any]]) -> dict[str, Any]:
        r: dict[str, Any] = {"step": step, "n": len(pts)}
        for key in keys:
            r[key] = _mean([p[key] for p in pts if p.get(key) is not None])
        return r

    inner = [{int(p["step"]): p for p in c[:-1]} for c in curves]
    for step in sorted(set.intersection(*(set(c) for c in inner))):
        out.append(row(step, [c[step] for c in inner]))
    last = [c[-1] for c in curves]
    final = row(round(statistics.fmean(int(p["step"]) for p in last), 1), last)
    final["last_steps"] = [int(p["step"]) for p in last]
    out.append(final)
    return out


def aggregate(arms: dict[str, list[dict[str, Any]]], before: float,
              before_sampled: float | None = None,
              before_row: dict[str, Any] | None = None) -> dict[str, Any]:
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
            "steps_per_minute": _mean([r["steps_per_minute"] for r in ok
                                       if r.get("steps_per_minute")]),
        }
        if any(r.get("curve") for r in ok):
            out[arm]["curve"] = mean_curve(ok, before_row)
            # Runs saved before curves had minutes give no time (not "never reached").
            timed = [r for r in ok if any(p.get("minutes") is not None for p in r["curve"] or [])]
            if timed:
                reached = [m for r in timed
                           if (m := minutes_to_gain(r, before, GAIN_BAR)) is not None]
                out[arm]["minutes_to_bar"] = {"gain": GAIN_BAR, "runs": len(timed),
                                              **spread(reached)}
        sampled = [r["after"]["sampled_success_rate"] for r in ok
                   if r["after"].get("sampled_success_rate") is not None]
        if sampled and before_sampled is not None:
            out[arm]["after_sampled"] = spread(sampled)
            out[arm]["gain_sampled"] = spread([v - before_sampled for v in sampled])
        out[arm].update(_paired(ok))
    return out


def _paired(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each run's after against its own before (``--paired-before``: the start measured on
    the run's engine right after its after), greedy and sampled, over the runs that have one."""

    out: dict[str, Any] = {}
    for suffix, key in (("", "success_rate"), ("_sampled", "sampled_success_rate")):
        pairs = [(r["before"][key], r["after"][key]) for r in runs if r.get("before")
                 and r["before"].get(key) is not None and r["after"].get(key) is not None]
        if pairs:
            out[f"before_paired{suffix}"] = spread([b for b, _ in pairs])
            out[f"gain_paired{suffix}"] = spread([a - b for b, a in pairs])
    return out


def plot_curves(arms: dict[str, list[dict[str, Any]]], before: dict[str, Any],
                path: Path) -> Path | None:
    """Training reward per step for every run (left), held-out success along the runs when
    curves were measured (middle), and held-out success before/after per arm (right)."""

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # figures are optional; the JSON carries the curves too
        return None
    curves = any(r.get("curve") for runs in arms.values() for r in runs)
    fig, axes = plt.subplots(1, 3 if curves else 2, figsize=(18 if curves else 12, 4.5))
    left, right = axes[0], axes[-1]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if curves:
        _plot_heldout(axes[1], arms, before, colors)
    before_rate = before["success_rate"]
    for i, (arm, runs) in enumerate(arms.items()):
        for j, run in enumerate(runs):
            curve = (run.get("train") or {}).get("curve") or []
            if curve:
                xs, ys = zip(*curve, strict=True)
                left.plot(xs, ys, color=colors[i % len(colors)], alpha=0.8,
                          label=arm if j == 0 else None)
        afters = [r["after"]["success_rate"] for r in runs if r.get("after")]
        if afters:
            right.scatter([i] * len(afters), afters, color=colors[i % len(colors)])
            right.hlines(sum(afters) / len(afters), i - 0.3, i + 0.3,
                         color=colors[i % len(colors)])
    right.axhline(before_rate, color="black", linestyle="--", label="warm start (before)")
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


def _plot_heldout(ax: Any, arms: dict[str, list[dict[str, Any]]], before: dict[str, Any],
                  colors: list[str]) -> None:
    """Held-out success along each run from the warm start (step 0): greedy solid, sampled
    dotted; each seed thin, the seed mean bold."""

    for i, (arm, runs) in enumerate(arms.items()):
        color = colors[i % len(colors)]
        for run in runs:
            pts = run.get("curve") or []
            if pts:
                ax.plot([0] + [p["step"] for p in pts],
                        [before["success_rate"]] + [p["greedy"] for p in pts],
                        color=color, alpha=0.25)
        mean = mean_curve([r for r in runs if r.get("curve")], before)
        if len(mean) > 1:
            steps = [p["step"] for p in mean]
            ax.plot(steps, [p["greedy"] for p in mean], color=color, lw=2,
                    label=f"{arm} greedy")
            if all(p["sampled"] is not None for p in mean):
                ax.plot(steps, [p["sampled"] for p in mean], color=color, lw=2, ls=":",
                        label=f"{arm} sampled")
    ax.set(xlabel="step", ylabel="held-out success", title="held-out success during RL")
    ax.legend(fontsize=8)


def _table_head(caption: str, columns: list[str]) -> list[str]:
    """A Markdown table's caption paragraph, header row and separator."""

    return ["", caption, "", f"| {' | '.join(columns)} |", "|" + "---|" * len(columns)]


def _spread_pts(g: dict[str, Any]) -> str:
    """``mean (min..max)`` of a :func:`spread` of rates, in points."""

    return f"{_pct(g['mean'])} ({_pct(g['min'])}..{_pct(g['max'])})"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def results_section(result: dict[str, Any], command: str, png: str | None) -> str:
    """The Markdown of docs/results.md's learning-run section."""

    s = result["setup"]
    sft_saw = ("SFT saw neither" if s.get("warm_start_sft_excludes_val", "").startswith("yes")
               and len(s.get("sft_excludes") or []) == 2 else
               "SFT saw the val templates, on other databases, but "
               + ("never the val entities" if "entities" in (s.get("sft_excludes") or [])
                  else "possibly the val entities"))
    lines = [
        SECTION_BEGIN,
        f"## RL learning run: {s.get('model', s['warm_start'])}, held-out success before "
        "and after GRPO",
        "",
        f"Measured {result['finished_at']} on {result['device']} by `bench/learning_run.py` "
        f"(raw JSON: `{result['json_path']}`). Warm start `{s['warm_start']}`; `sql` "
        f"scenarios on database seed {s['db_seed']}: {s['train']} train / {s['val']} val, "
        f"the val templates ({', '.join(s['val_templates']) or '-'}) and entities never in "
        f"the RL training split ({sft_saw}). Held-out success = greedy rollouts on "
        f"{s['eval_n']} val scenarios, each answer checked by the verifiable checker. Every "
        f"run has the same budget: {s['budget_s']:.0f} s wall clock or {s['max_steps']} steps "
        f"(G={s['group_size']}, {s['groups_per_step']} scenarios per step, lr {s['lr']}; "
        f"{s['parallel']} runs at once, "
        f"{'each with its own engine' if s.get('engine_per_run') else 'on one engine'}).",
        "",
        "Reproduce:",
        "",
        "```bash",
        command,
        "```",
    ]
    lines += _table_head(
        f"Warm start (before): held-out success **{_pct(result['before']['success_rate'])}%**.",
        ["arm", "runs", "after, mean ± std (%)", "gain, mean (min..max) (pts)", "steps",
         "steps/min", "reward std", "mean abs adv", "zero-var groups", "clip frac", "KL"])
    for arm, a in result["arms"].items():
        t = a["train"]
        g = a["gain"]
        lines.append(
            f"| {arm} | {a['runs'] - a['failed']}/{a['runs']} | {_pct(a['after']['mean'])} ± "
            f"{_pct(a['after']['std'])} | {_spread_pts(g)} | {_num(t['steps'], '.1f')} | "
            f"{_num(a.get('steps_per_minute'), '.1f')} | {_num(t['reward_std'])} | "
            f"{_num(t['adv_abs_mean'])} | {_pct(t['zero_variance_fraction'])}% | "
            f"{_num(t['clip_fraction'])} | {_num(t['kl'], '.4f')} |")
    if "sampled_success_rate" in result["before"]:
        lines += _table_head(
            f"Sampled at the training temperature ({result['before']['sampled_n']} rollouts: "
            f"each val scenario {s.get('sampled_eval')} times), before: "
            f"**{_pct(result['before']['sampled_success_rate'])}%**, query rate "
            f"{_pct(result['before'].get('sampled_query_rate'))}%.",
            ["arm", "after, mean ± std (%)", "gain, mean (min..max) (pts)"])
        for arm, a in result["arms"].items():
            if "after_sampled" in a:
                g = a["gain_sampled"]
                lines.append(f"| {arm} | {_pct(a['after_sampled']['mean'])} ± "
                             f"{_pct(a['after_sampled']['std'])} | {_spread_pts(g)} |")
    paired = {arm: a for arm, a in result["arms"].items() if a.get("gain_paired")}
    if paired:
        lines += _table_head(
            "Paired with each run's own before (the start evaluated again on the run's engine "
            "right after its after; a mean over runs):",
            ["arm", "runs", "before, greedy (%)", "gain, greedy (pts)", "before, sampled (%)",
             "gain, sampled (pts)"])
        for arm, a in paired.items():
            bs, gs = a.get("before_paired_sampled"), a.get("gain_paired_sampled")
            lines.append(
                f"| {arm} | {a['gain_paired']['n']} | {_pct(a['before_paired']['mean'])} | "
                f"{_spread_pts(a['gain_paired'])} | {_pct(bs['mean']) if bs else '-'} | "
                f"{_spread_pts(gs) if gs else '-'} |")
    curves = {arm: a["curve"] for arm, a in result["arms"].items() if a.get("curve")}
    if curves:
        lines += _table_head(
            "Held-out success along the runs (seed means; the last row of an arm is each run's "
            "last step, which the wall-clock budget sets):",
            ["arm", "step", "RL minutes", "runs", "greedy (%)", "sampled (%)",
             "greedy query rate (%)", "sampled query rate (%)"])
        for arm, curve in curves.items():
            for p in curve:
                step = (f"last ({', '.join(map(str, p['last_steps']))})" if "last_steps" in p
                        else str(p["step"]))
                minutes = f"{p['minutes']:.1f}" if p.get("minutes") is not None else "-"
                lines.append(f"| {arm} | {step} | {minutes} | {p['n']} | {_pct(p['greedy'])} | "
                             f"{_pct(p['sampled'])} | {_pct(p['query_rate'])} | "
                             f"{_pct(p['sampled_query_rate'])} |")
        bars = {arm: a["minutes_to_bar"] for arm, a in result["arms"].items()
                if a.get("minutes_to_bar")}
        if bars:
            lines += ["", f"First held-out eval {_pct(GAIN_BAR)} points above the warm start "
                      "(greedy), in RL minutes (the steps' own time):", ""]
        for arm, bar in bars.items():
            when = (f"{bar['mean']:.1f} min ({bar['min']:.1f}..{bar['max']:.1f})"
                    if bar["n"] else "never")
            lines.append(f"- {arm}: {when}, {bar['n']} of {bar['runs']} runs")
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


def rebuild(result: dict[str, Any], runs_dir: Path | None = None) -> dict[str, Any]:
    """Recompute the per-arm curves of a saved learning_run.json (after a change here);
    ``runs_dir`` (the run's ``runs/``, with each run's metrics.jsonl) adds the RL minutes to
    curve points saved without them."""

    by_arm: dict[str, list[dict[str, Any]]] = {}
    for run in result["runs"]:
        by_arm.setdefault(run["arm"], []).append(run)
        if runs_dir is not None and run.get("curve"):
            minutes = rl_minutes(read_jsonl(runs_dir / run["name"] / "metrics.jsonl"))
            for p in run["curve"]:
                p.setdefault("minutes", minutes.get(int(p["step"])))
    for arm, runs in by_arm.items():
        ok = [r for r in runs if r.get("after") is not None]
        if arm in result["arms"] and any(r.get("curve") for r in ok):
            fresh = aggregate({arm: ok}, result["before"]["success_rate"],
                              before_row=result["before"])[arm]
            result["arms"][arm]["curve"] = fresh["curve"]
            if "minutes_to_bar" in fresh:
                result["arms"][arm]["minutes_to_bar"] = fresh["minutes_to_bar"]
    return result


def main(argv: list[str] | None = None) -> int:
    """Figures and the docs section again from a saved run, without re-running it:
    ``python bench/learning_report.py RUN.json --png FILE [--docs docs/results.md]``."""

    import argparse

    p = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    p.add_argument("json", type=Path)
    p.add_argument("--png", type=Path, help="write the curves here")
    p.add_argument("--docs", type=Path, help="replace the learning-run section of this file")
    p.add_argument("--png-link", help="the figure's path as the docs link it")
    p.add_argument("--command", default="", help="the command that made the run")
    p.add_argument("--runs-dir", type=Path, help="the run's runs/ folder (each run's "
                   "metrics.jsonl): adds RL minutes to curves saved without them")
    args = p.parse_args(argv)
    result = rebuild(json.loads(args.json.read_text()), args.runs_dir)
    args.json.write_text(json.dumps(result, indent=2, default=str))
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for run in result["runs"]:
        by_arm.setdefault(run["arm"], []).append(run)
    if args.png:
        plot_curves(by_arm, result["before"], args.png)
    if args.docs:
        write_results_section(args.docs, results_section(result, args.command, args.png_link))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
