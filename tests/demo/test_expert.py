"""The scripted expert against the real MCP server, and the SFT rows it leaves.

Real parts only: the company-db MCP server on loopback, scenarios from scenario-gen's ``sql``
strategy, the trainer's agent loop and renderer, the judge's verifiable checker, sqlite3.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from mcprl_demo.expert import Demonstration, demonstrate
from mcprl_demo.scenario_sets import generate_sql_set
from mcprl_demo.sft_data import assistant_spans, describe_rows
from mcprl_mcp_server.loopback import serve_mcp
from mcprl_testing.mcp_server import read_sql
from mcprl_trainer.config import DEFAULT_SYSTEM_PROMPT
from mcprl_trainer.mcp_tools import COMPLETE_TASK
from mcprl_trainer.rendering import ChatRenderer
from mcprl_trainer.rollout import RolloutSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
SETTINGS = RolloutSettings(system_prompt=DEFAULT_SYSTEM_PROMPT, max_turns=6,
                           max_tokens_per_turn=200, max_context=4096,
                           tool_output_max_tokens=512)


@pytest.fixture(scope="module")
def expert_run(tmp_path_factory, tiny_test_model: Path):
    tmp = tmp_path_factory.mktemp("expert")
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_test_model))
    with serve_mcp(tmp, preset="default") as (mcp_url, db_path):
        train, val = asyncio.run(generate_sql_set(mcp_url, tmp / "set", n=60, seed=3,
                                                  val_fraction=0.2, db_seed=42))
        picked: dict[str, object] = {}
        for s in train + val:  # one scenario per template: every answer kind and join shape
            picked.setdefault(s.template or s.id, s)
        scenarios = list(picked.values())[:12]
        demos = asyncio.run(demonstrate(scenarios, mcp_url=mcp_url, renderer=renderer,
                                        settings=SETTINGS, seed=0, concurrency=4))
        noisy = asyncio.run(demonstrate(scenarios[:4], mcp_url=mcp_url, renderer=renderer,
                                        settings=SETTINGS, noise=1.0, seed=0))
    return renderer, db_path, demos, noisy, (train, val)


def test_scenario_set_is_split_without_leaks(expert_run, tmp_path) -> None:
    _, _, _, _, (train, val) = expert_run
    assert train and val
    assert not {s.id for s in train} & {s.id for s in val}
    assert not {e for s in train for e in s.entities} & {e for s in val for e in s.entities}
    assert all(s.metadata["db_seed"] == 42 and s.ground_truth.sql for s in train + val)


def test_expert_solves_through_the_real_tools(expert_run) -> None:
    _, db_path, demos, _, _ = expert_run
    assert len(demos) >= 8
    for demo in demos:
        traj = demo.result.trajectory
        assert traj.finish_reason == "completed", demo.scenario.task
        calls = [m["tool_calls"][0]["function"] for m in traj.messages
                 if m["role"] == "assistant"]
        names = [c["name"] for c in calls]
        assert names[0] == "list_tables" and names[-2] == "run_query"
        assert names[-1] == COMPLETE_TASK
        assert set(names[1:-2]) == {"describe_table"} and len(names) >= 4
        # Tool results are the server's real answers (the expert only read them).
        results = [m["content"] for m in traj.messages if m["role"] == "tool"]
        assert json.loads(results[0]) == ["departments", "employees", "projects"]
        query = json.loads(results[-1])
        assert query["row_count"] == len(query["results"])
        # The judge's verifiable check says correct ...
        assert demo.correct, (demo.scenario.task, traj.final_answer, demo.detail)
        # ... and so does sqlite3 read directly.
        rows = read_sql(db_path, demo.scenario.ground_truth.sql)
        first = rows[0][0]
        if demo.scenario.ground_truth.kind == "number":
            assert float(traj.final_answer) == pytest.approx(first, rel=0.01, abs=0.01)
        else:
            assert str(first) in traj.final_answer


def test_noise_makes_wrong_answers_on_purpose(expert_run) -> None:
    _, _, _, noisy, _ = expert_run
    assert noisy and all(d.noisy and not d.correct for d in noisy)
    assert all(d.result.trajectory.finish_reason == "completed" for d in noisy)


def _masked_text(demo: Demonstration, renderer: ChatRenderer) -> list[str]:
    row = demo.sft_row()
    return [renderer.tokenizer.decode(row["input_ids"][a:b], skip_special_tokens=False)
            for a, b in assistant_spans(row["mask"])]


def test_sft_mask_covers_exactly_the_assistant_tokens(expert_run) -> None:
    renderer, _, demos, _, _ = expert_run
    eos = renderer.tokenizer.eos_token_id
    for demo in demos:
        row = demo.sft_row()
        ids, mask = row["input_ids"], row["mask"]
        assert len(ids) == len(mask) and set(mask) <= {0, 1}
        traj = demo.result.trajectory
        spans = assistant_spans(mask)
        assert len(spans) == traj.num_turns
        # Each span is one whole assistant turn: the Hermes tool call, then <|im_end|>.
        expected = []
        for m in traj.messages:
            if m["role"] != "assistant":
                continue
            fn = m["tool_calls"][0]["function"]
            args = json.dumps(json.loads(fn["arguments"]), ensure_ascii=False)
            expected.append(f'<tool_call>\n{{"name": "{fn["name"]}", "arguments": {args}}}\n'
                            f"</tool_call><|im_end|>")
        assert _masked_text(demo, renderer) == expected
        for a, b in spans:
            assert ids[b - 1] == eos
            # what precedes every turn is the generation prompt (never trained on)
            before = renderer.tokenizer.decode(ids[max(0, a - 4):a], skip_special_tokens=False)
            assert before.endswith("<|im_start|>assistant\n")
        # The prompt is exactly the trainer's rendering of system + task with the tools.
        prompt = renderer.initial_prompt(traj.messages[:2], traj.tools).ids
        assert ids[:len(prompt)] == prompt and not any(mask[:len(prompt)])
        # Tool results (what the model reads) are never trained on.
        unmasked = renderer.tokenizer.decode([t for t, m in zip(ids, mask, strict=True)
                                              if not m], skip_special_tokens=False)
        assert unmasked.count("<tool_response>") == traj.num_turns - 1
        assert "</tool_call>" in unmasked  # only inside the tool schemas' instructions
        assert "run_query" in unmasked
        assert '{"name": "complete_task", "arguments"' not in unmasked


def test_row_statistics(expert_run) -> None:
    _, _, demos, _, _ = expert_run
    stats = describe_rows([d.sft_row() for d in demos])
    assert stats["rows"] == len(demos)
    assert 0 < stats["mean_trained_tokens"] < stats["mean_tokens"]
    assert stats["prompt_tokens"] > 500  # system prompt + tool schemas dominate
    assert 4 <= stats["turns_per_row"] <= 6


def test_guess_noise_skips_the_query(expert_run, tiny_test_model: Path, tmp_path) -> None:
    """``guess`` noise: the expert answers right after describing, without run_query, and
    the made-up answer is wrong."""

    renderer, _, demos, _, _ = expert_run
    scenarios = [d.scenario for d in demos[:4]]
    with serve_mcp(tmp_path, preset="default") as (mcp_url, _):
        guessed = asyncio.run(demonstrate(scenarios, mcp_url=mcp_url, renderer=renderer,
                                          settings=SETTINGS, noise=1.0, noise_kind="guess",
                                          seed=0))
    for demo in guessed:
        names = [m["tool_calls"][0]["function"]["name"]
                 for m in demo.result.trajectory.messages if m["role"] == "assistant"]
        assert names[0] == "list_tables" and names[-1] == COMPLETE_TASK
        assert "run_query" not in names and set(names[1:-1]) == {"describe_table"}
        assert demo.noisy and not demo.correct, demo.result.trajectory.final_answer
