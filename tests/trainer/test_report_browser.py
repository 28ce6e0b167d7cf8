"""The run report in a real browser: headless Chromium (Debian's ``chromium``) opens
``report.html`` from ``file://`` as a user would, and the tests read the DOM.

- a short tiny-model training run on the loopback stack: curves drawn, every rollout
  counted, a tool call with its result visible, filters that narrow the list, the eval side
  by side; a screenshot is kept under ``runs/test-artifacts/`` (ignored by git);
- untrusted text: ``<script>`` and ``</textarea>`` payloads in a model message and in a real
  MCP tool result are shown as text and never run;
- scale: 200 steps x 64 rollouts load and filter in under 2 s.

Without /usr/bin/chromium the tests skip (CI installs it: ``make browser``; there a missing
browser fails them instead).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from mcprl_common.wire import GroundTruth, Scenario
from mcprl_testing.html_report import synthetic_run
from mcprl_trainer.config import RunConfig, save_config
from mcprl_trainer.html_report import REPORT_NAME, rebuild_report, update_report
from mcprl_trainer.run_files import (
    eval_rollouts_path,
    rollout_rows,
    train_rollouts_path,
    write_jsonl,
)

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "runs" / "test-artifacts"
CHROMIUM = Path(os.environ.get("MCPRL_CHROMIUM", "/usr/bin/chromium"))
# What a headless Chromium needs here: no sandbox (root in CI), no GPU, nothing phoned home.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} not installed (make browser installs Debian's chromium)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        # Playwright gives every launch a fresh, temporary profile (--user-data-dir).
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def run_async(coro: Any) -> Any:
    """Run a coroutine to its end in a thread of its own: Playwright's sync API keeps an
    event loop running in the test's thread, where asyncio.run refuses to start."""

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class OpenReport:
    """A report page open in the browser, with every script error it raised."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.errors: list[str] = []
        self.page = browser.new_page(viewport={"width": 1500, "height": 1100})
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("console", lambda msg: msg.type == "error" and self.errors.append(msg.text))
        started = time.perf_counter()
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_selector("body[data-ready='1']", timeout=30_000)
        self.load_seconds = time.perf_counter() - started

    def settle(self) -> None:
        self.page.evaluate("() => window.mcprlReport.settled()")

    def count(self, selector: str) -> int:
        return self.page.locator(selector).count()

    def matches(self) -> int:
        return int(self.page.get_attribute("#match-count", "data-matches") or -1)

    def close(self) -> None:
        self.page.close()


def _screenshot(report: OpenReport, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    report.page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    return path


# ---- a short training run, looked at ----------------------------------------------------

WARM_START = REPO / "demo" / "checkpoints" / "warm-start"


@pytest.fixture(scope="module")
def trained_run(stack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two GRPO steps of the demo's warm-started agent (it calls the MCP tools, unlike the
    random tiny model), evaluated before and after, on the shared loopback stack."""

    from mcprl_common.process import UvicornThread, wait_healthy
    from mcprl_inference.app import create_app as engine_app
    from mcprl_inference.settings import InferenceSettings
    from mcprl_trainer.trainer import Trainer

    if not (WARM_START / "config.json").exists():
        pytest.fail(f"{WARM_START} is missing (it ships with the repo; make warm-start)")
    tmp = tmp_path_factory.mktemp("report-run")
    with UvicornThread(engine_app(InferenceSettings(
            model=str(WARM_START), device="cpu", port=0, max_model_len=8192,
            kv_cache_memory_gb=0.5, max_loras=2, seed=0))) as engine:
        wait_healthy(f"{engine.url}/healthz", timeout_s=120)
        config = RunConfig.model_validate(stack.run_config(
            tmp, name="report", model=str(WARM_START), steps=2, group_size=2,
            groups_per_step=2, policy={"base_url": f"{engine.url}/v1"},
            reward={"mode": "verifiable", "partial_credit": True},  # graded: groups vary
            rollout={"max_turns": 2, "max_tokens_per_turn": 64, "max_context": 4096},
            # Equal-reward groups are trained on too and KL is on, so every curve has points.
            train={"shared_prefix": True, "skip_zero_variance": False, "kl_coef": 0.05},
            eval={"every": 2, "max_scenarios": 2}))
        outcome = run_async(Trainer(config).run())
    assert outcome.steps_done == 2
    assert outcome.report["html"] == config.run_dir / REPORT_NAME
    return config.run_dir


@pytest.mark.integration
@pytest.mark.slow
def test_report_of_a_short_training_run(trained_run: Path, browser) -> None:
    rows = {s: [json.loads(x) for x in train_rollouts_path(trained_run, s).read_text().splitlines()]
            for s in (1, 2)}
    # The trainer recorded what the page shows: advantages, scenario and ground truth.
    for row in rows[1] + rows[2]:
        assert isinstance(row["advantage"], float) and "verifiable" in row["components"]
        assert row["scenario"]["ground_truth"] is not None
    assert all(eval_rollouts_path(trained_run, s).exists() for s in (0, 2))

    report = OpenReport(browser, trained_run / REPORT_NAME)
    try:
        page = report.page
        assert report.errors == []
        assert report.load_seconds < 10
        # Curves: every chart the issue asks for, drawn from the run's numbers.
        for chart in ("reward", "success", "query", "tool-errors", "kl", "clip", "phases",
                      "tokens"):
            assert report.count(f"#chart-{chart} path.line") >= 1, chart
        assert int(page.get_attribute("#chart-reward", "data-points")) >= 2 + 2  # train + val
        assert report.count("#chart-reward polygon.band") == 1
        # Every training rollout is counted: 2 steps x 2 groups x 2 rollouts.
        assert report.matches() == 8 == int(page.get_attribute("#match-count", "data-total"))
        assert report.count(".step-item") == 2
        # The last step is open: its groups, rollouts and the first rollout in full.
        assert report.count(".group") == 2 and report.count(".rollout-item") == 4
        detail = page.locator("#rollout-detail")
        assert detail.locator(".ground-truth").count() == 1
        assert detail.locator(".final-answer").count() == 1
        assert "advantage" in detail.locator(".advantage").inner_text()
        # A rollout whose agent called a server tool: the call, its arguments, its result.
        with_result = next((r for s in (2, 1) for r in rows[s]
                            if any(m["role"] == "tool" for m in r["trajectory"]["messages"])),
                           None)
        assert with_result is not None, "the warm-started agent called no tool"
        step, group, member = with_result["step"], with_result["group"], with_result["member"]
        if step != 2:
            page.click(f".step-item[data-step='{step}']")
            report.settle()
        page.click(f".rollout-item[data-group='{group}'][data-member='{member}']")
        report.settle()
        call = detail.locator(".tool-call", has=page.locator(".tool-result")).first
        name = call.locator(".call-head").inner_text()
        tool_msg = next(m for m in with_result["trajectory"]["messages"] if m["role"] == "tool")
        assert call.locator(".tool-result pre").inner_text().strip()[:40] \
            == tool_msg["content"].strip()[:40]
        assert name.removeprefix("→ ").strip() in {"list_tables", "describe_table", "run_query"}
        errors = with_result["trajectory"]["metadata"]["tool_error_ids"]
        assert detail.locator(".tool-result.error").count() == len(
            [m for m in with_result["trajectory"]["messages"]
             if m["role"] == "tool" and m["tool_call_id"] in errors])

        # Filters: by reward, by error, by scenario, each against the JSONL's own counts.
        every = rows[1] + rows[2]
        page.fill("#f-reward-min", "0.5")
        report.settle()
        assert report.matches() == sum(r["reward"] >= 0.5 for r in every)
        page.fill("#f-reward-min", "")
        page.select_option("#f-error", "with")
        report.settle()
        assert report.matches() == sum(r["trajectory"]["tool_errors"] > 0 for r in every)
        page.select_option("#f-error", "without")
        report.settle()
        assert report.matches() == sum(r["trajectory"]["tool_errors"] == 0 for r in every)
        page.select_option("#f-error", "any")
        first_scenario = page.locator("#f-scenario option").nth(1)
        page.select_option("#f-scenario", first_scenario.get_attribute("value"))
        report.settle()
        picked = [r for r in every if r["scenario"]["task"].startswith(
            first_scenario.inner_text().rsplit(" (", 1)[0].rstrip("…"))]
        assert 0 < report.matches() == len(picked) < 8
        assert report.count(".rollout-item") == sum(r["step"] == max(p["step"] for p in picked)
                                                    for r in picked)
        page.click("#f-reset")
        report.settle()
        assert report.matches() == 8

        # Eval: both val scenarios, before (step 0) and after (step 2) side by side.
        assert report.count(".eval-scenario") == 2
        assert page.locator("#eval-sides .side[data-side='before'] h3").inner_text() \
            .startswith("before: step 0")
        assert page.locator("#eval-sides .side[data-side='after'] h3").inner_text() \
            .startswith("after: step 2")
        assert report.count("#eval-sides .side .rollout") == 2  # eval.samples = 1
        page.click(".eval-scenario >> nth=1")
        report.settle()
        assert report.count("#eval-sides .side .rollout") == 2
        assert report.errors == []
        _screenshot(report, "report-training-run.png")
    finally:
        report.close()


# ---- untrusted text --------------------------------------------------------------------

MODEL_SAYS = ('</textarea><script>window.__pwned = "model"</script>'
              '<img src=x onerror="window.__pwned = \'img\'"> let me query')
TOOL_SQL = "SELECT '</textarea><script>window.__pwned = 1</script><u>bold</u>' AS payload"
ANSWER = '<script>window.__pwned = "answer"</script></textarea>'


@pytest.mark.integration
def test_untrusted_text_is_shown_as_text_and_never_run(stack, tiny_test_model, tmp_path,
                                                       browser) -> None:
    """A model message and a real MCP tool result (the company-db server echoing a SELECT)
    carry <script> and </textarea> payloads; so do the task and its ground truth."""

    from mcprl_common.wire import RewardConfig
    from mcprl_trainer.batch import build_step_batch
    from mcprl_trainer.config import RolloutConfig, TrainConfig
    from mcprl_trainer.groups import GroupRunner, McpTarget
    from mcprl_trainer.judge_client import JudgeClient
    from mcprl_trainer.modeling import load_tokenizer
    from mcprl_trainer.rendering import ChatRenderer
    from mcprl_trainer.rollout import RolloutSettings
    from mcprl_trainer.scripted import ScriptedSampler

    tok = load_tokenizer(str(tiny_test_model))

    def turn(text: str, name: str, args: dict[str, Any]) -> list[int]:
        call = f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'
        return tok(text + call, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    scenario = Scenario(id="sc-payload", task="How many departments? <script>window.__pwned"
                        " = 'task'</script></textarea>",
                        ground_truth=GroundTruth(kind="text", value="</textarea><em>x</em>"))
    sampler = ScriptedSampler([turn(MODEL_SAYS, "run_query", {"sql": TOOL_SQL}),
                               turn("done", "complete_task", {"answer": ANSWER})])
    judge = JudgeClient(stack.judge_url)
    runner = GroupRunner(sampler=sampler, renderer=ChatRenderer(tok), mcp=McpTarget(stack.mcp_url),
                         judge=judge, reward=RewardConfig(mode="verifiable"), concurrency=1)

    async def one_step():
        try:
            return await runner.run([scenario], group_size=1, model="scripted",
                                    settings=RolloutSettings.from_config(RolloutConfig()),
                                    seed_parts=(0, 1))
        finally:
            await judge.aclose()

    batch = run_async(one_step())
    assert not batch.failed
    tool_text = batch.groups[0].results[0].trajectory.messages[3]["content"]
    assert "<script>window.__pwned = 1</script>" in tool_text  # the server echoed it
    step = build_step_batch(batch, TrainConfig(), seed=0, step=1, success_threshold=1.0)
    config = RunConfig.model_validate(stack.run_config(tmp_path, name="payload"))
    save_config(config, config.run_dir)
    write_jsonl(train_rollouts_path(config.run_dir, 1), rollout_rows(1, batch.groups))
    write_jsonl(config.run_dir / "metrics.jsonl", [{"step": 1, **step.metrics}])
    page_path = update_report(config.run_dir, steps=[1])
    assert "<script>window.__pwned" not in page_path.read_text()

    report = OpenReport(browser, page_path)
    try:
        page = report.page
        assert page.evaluate("() => window.__pwned") is None
        assert report.errors == []
        # Only the page's own scripts exist, and none of the payloads' elements.
        assert report.count("script") == 2
        for tag in ("img", "textarea", "u", "em"):  # none of them is ever ours
            assert report.count(f"body {tag}") == 0, tag
        detail = page.locator("#rollout-detail")
        assert MODEL_SAYS in detail.locator(".msg.assistant pre.content").first.inner_text()
        result = detail.locator(".tool-result pre").first.inner_text()
        assert "</textarea><script>window.__pwned = 1</script><u>bold</u>" in result
        assert ANSWER in detail.locator(".final-answer").inner_text()
        assert "</textarea><em>x</em>" in detail.locator(".ground-truth").inner_text()
        assert "<script>window.__pwned = 'task'</script>" in page.inner_text("#group-list")
        assert "<script>" in page.locator("#f-scenario option").nth(1).inner_text()
        _screenshot(report, "report-untrusted-text.png")
    finally:
        report.close()


# ---- scale -----------------------------------------------------------------------------

def test_200_steps_of_64_rollouts_load_and_filter_under_2s(tmp_path, browser) -> None:
    run_dir = synthetic_run(tmp_path, steps=200, groups=8, group_size=8, evals=(0, 200))
    started = time.perf_counter()
    rebuild_report(run_dir)
    rebuild_s = time.perf_counter() - started
    started = time.perf_counter()
    update_report(run_dir, steps=[200])  # what the trainer adds to a step
    update_s = time.perf_counter() - started
    page_kb = (run_dir / REPORT_NAME).stat().st_size / 1024
    step_kb = (run_dir / "report-data" / "train-0200.js").stat().st_size / 1024

    report = OpenReport(browser, run_dir / REPORT_NAME)
    try:
        assert report.errors == []
        assert report.matches() == 200 * 64
        timed = report.page.evaluate("""async () => {
          const r = window.mcprlReport, out = {};
          const pick = async (name, id, value) => {
            const t0 = performance.now();
            const input = document.getElementById(id);
            input.value = value;
            input.dispatchEvent(new Event(input.tagName === 'INPUT' ? 'input' : 'change'));
            await r.settled();
            out[name] = performance.now() - t0;
            out[name + '_matches'] = +document.getElementById('match-count').dataset.matches;
          };
          const first = document.querySelectorAll('#f-scenario option')[1].value;
          await pick('scenario', 'f-scenario', first);
          await pick('error', 'f-error', 'with');
          await pick('reward', 'f-reward-min', '1');
          const t0 = performance.now();
          document.querySelector('.step-item').click();
          await r.settled();
          out.open_step = performance.now() - t0;
          return out;
        }""")
        filters_ms = timed["scenario"] + timed["error"] + timed["reward"] + timed["open_step"]
        print(json.dumps({"rollouts": 200 * 64, "rebuild_s": round(rebuild_s, 2),
                          "update_one_step_s": round(update_s, 3), "page_kb": round(page_kb),
                          "step_file_kb": round(step_kb), "load_s": round(report.load_seconds, 3),
                          "filters_ms": {k: round(v, 1) for k, v in timed.items()}}))
        assert 0 < timed["reward_matches"] <= timed["error_matches"] <= timed["scenario_matches"]
        assert timed["scenario_matches"] < 200 * 64
        assert report.count(".rollout-item") > 0
        assert report.load_seconds + filters_ms / 1000 < 2.0
        assert update_s < 2.0  # per-step cost for the trainer stays small at 200 steps
        _screenshot(report, "report-scale.png")
    finally:
        report.close()
