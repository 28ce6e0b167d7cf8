"""What a person sees: a live progress line per stage and the before/after table (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from mcprl_demo.demo_run import DemoOutcome, Events

# Rates shown with a 95% interval: (rate key, the count it is a share of).
RATE_DENOMINATORS = {"success_rate": "n", "tool_error_rate": "tool_calls"}
ROWS = (
    ("success rate", "success_rate", "{:.1%}"),
    ("mean reward", "mean_reward", "{:.3f}"),
    ("mean turns", "mean_turns", "{:.2f}"),
    ("tool errors", "tool_errors", "{:d}"),
    ("tool error rate", "tool_error_rate", "{:.1%}"),
    ("val rollouts", "n", "{:d}"),
)


class RichEvents(Events):
    """Stage headers, a progress bar over GRPO steps, and one line per step and eval."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                                 transient=False)
        self.task: Any = None
        self.seen_step: int | None = None
        self.seen_evals: set[int] = set()

    def stage(self, name: str) -> None:
        if name == "stop services" and self.task is not None:
            self.progress.stop()
        self.console.print(f"[bold cyan]==> {name}[/]")

    def info(self, text: str) -> None:
        self.console.print(f"    {text}", highlight=False)

    def trainer_status(self, status: dict[str, Any]) -> None:
        total = int(status.get("total_steps") or 0)
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task("trainer: starting", total=total or None)
        phase = status.get("phase", "?")
        step = int(status.get("step") or 0)
        label = "eval (before)" if phase == "eval" and step == 0 else phase
        self.progress.update(self.task, description=f"trainer: {label}", total=total or None,
                             completed=len(self._done(status)))
        last = status.get("last_step")
        if last and last.get("step") != self.seen_step:
            self.seen_step = last.get("step")
            self.console.print(
                f"    step {last.get('step')}/{total}: reward {last.get('reward_mean', 0):.3f}"
                f" ± {last.get('reward_std', 0):.3f}, success {last.get('success_rate', 0):.2f}"
                f", groups trained {int(last.get('groups_trained', 0))}, "
                f"{last.get('step_seconds', 0):.0f}s", highlight=False)
        ev = status.get("last_eval")
        if ev and ev.get("step") not in self.seen_evals:
            self.seen_evals.add(ev.get("step"))
            self.console.print(
                f"    eval @ step {ev.get('step')}: success {ev.get('success_rate', 0):.1%}, "
                f"reward {ev.get('mean_reward', 0):.3f}, turns {ev.get('mean_turns', 0):.2f}, "
                f"tool errors {ev.get('tool_errors', 0)} (n={ev.get('n')})", highlight=False)

    def _done(self, status: dict[str, Any]) -> list[int]:
        last = status.get("last_step") or {}
        return list(range(int(last.get("step") or 0)))

    def close(self) -> None:
        if self.task is not None:
            self.progress.stop()


def wilson_interval(rate: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (sound at 0 and 1, unlike rate +- 2 SE)."""

    if n <= 0:
        return 0.0, 1.0
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((rate * (1 - rate) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _cell(row: dict[str, Any] | None, key: str, fmt: str) -> str:
    if not row or row.get(key) is None:
        return "-"
    value = row[key]
    try:
        text = fmt.format(int(value) if fmt.endswith("d}") else float(value))
    except (TypeError, ValueError):
        return str(value)
    total = row.get(RATE_DENOMINATORS.get(key, ""))
    if isinstance(total, int | float) and total > 0:
        lo, hi = wilson_interval(float(value), int(total))
        text += f" [{lo:.1%}, {hi:.1%}]"
    return text


def results_table(outcome: DemoOutcome) -> Table:
    before = outcome.report.get("eval_before")
    after = outcome.report.get("eval_after")
    ev = (outcome.report.get("config") or {}).get("eval") or {}
    temperature, samples = ev.get("temperature", 0.0), ev.get("samples", 1)
    sampling = ("greedy" if not temperature else
                f"T={temperature:g}, {samples} sample{'s' if samples > 1 else ''} per scenario")
    title = (f"mcp-rl demo: {outcome.report.get('steps_done')} GRPO steps, held-out val "
             f"({outcome.strategy} scenarios, {sampling}, judge "
             f"{'RULER' if outcome.hosted else 'verifiable'})")
    table = Table(title=title, title_justify="left",
                  caption="rates: [95% Wilson interval]", caption_justify="left")
    table.add_column("metric")
    table.add_column(f"before (step {before['step'] if before else '-'})", justify="right")
    table.add_column(f"after (step {after['step'] if after else '-'})", justify="right")
    for label, key, fmt in ROWS:
        table.add_row(label, _cell(before, key, fmt), _cell(after, key, fmt))
    return table


def print_summary(console: Console, outcome: DemoOutcome, wall_s: float) -> None:
    console.print(results_table(outcome))
    times = ", ".join(f"{k} {v:.0f}s" for k, v in outcome.seconds.items())
    console.print(f"wall time {wall_s:.0f}s ({times})", highlight=False)
    console.print(f"report: {outcome.paths['html']} (open it in a browser)\n"
                  f"        {outcome.paths['md']}\n        {outcome.paths['json']}\n"
                  f"reward curve: {outcome.paths['png']}", highlight=False)
