"""Verifiable rewards for real ``sql`` scenarios: scenario-gen builds them from the real MCP
server; the answers are written by hand from direct sqlite3 reads of the same database (right
ones in several phrasings, wrong ones that look plausible) and the judge must tell them
apart without any judge model."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcprl_common.process import UvicornThread, free_port
from mcprl_common.settings import UpstreamSettings
from mcprl_common.wire import GroundTruth, Scenario
from mcprl_judge.answers import normalise
from mcprl_mcp_server.loopback import serve_mcp
from mcprl_scenario_gen.app import create_app as create_scenario_app
from mcprl_scenario_gen.settings import ScenarioGenSettings as ScenarioSettings
from mcprl_testing.judge import sql_trajectory
from mcprl_testing.mcp_server import read_sql
from mcprl_testing.scenario_gen import wait_finished

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def sql_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Scenario], Path]]:
    """Real ``sql`` scenarios generated from the real company-db server, and its database."""

    tmp = tmp_path_factory.mktemp("sqlworld")
    settings = ScenarioSettings(data_dir=tmp / "scenarios", checkpoint_every_s=0.0,
                                mcp_connect_timeout_s=5.0, mcp_timeout_s=15.0)
    generator = UpstreamSettings(base_url=f"http://127.0.0.1:{free_port()}/v1", model="none",
                                 max_retries=0, timeout_s=5)  # the sql strategy needs no LLM
    with serve_mcp(tmp / "mcp") as (mcp_url, db_path), UvicornThread(
            create_scenario_app(settings, generator=generator)) as gen, httpx.Client(
            base_url=gen.url, timeout=30) as client:
        resp = client.post("/v1/scenario-sets", json={"mcp_url": mcp_url, "strategy": "sql",
                                                      "n": 40, "seed": 7, "val_fraction": 0.2})
        assert resp.status_code == 202, resp.text
        set_id = resp.json()["id"]
        status = wait_finished(client, set_id, timeout_s=90)
        assert status["status"] == "succeeded", status
        scenarios = [Scenario.model_validate(s)
                     for split in ("train", "val")
                     for s in client.get(f"/v1/scenario-sets/{set_id}/scenarios",
                                         params={"split": split}).json()["data"]]
        yield scenarios, db_path


def pick(scenarios: list[Scenario], per_kind: int = 3) -> list[Scenario]:
    chosen: list[Scenario] = []
    for kind in ("number", "text", "set", "list"):
        chosen += [s for s in scenarios if s.ground_truth and s.ground_truth.kind == kind
                   and s.ground_truth.sql][:per_kind]
    return chosen


def reference(db_path: Path, truth: GroundTruth) -> Any:
    """The answer read straight from the database with sqlite3 (not through MCP)."""

    assert truth.sql is not None
    rows = read_sql(db_path, truth.sql)
    if truth.kind == "number":
        return float(rows[0][0])
    if truth.kind == "text":
        return str(rows[0][0])
    names = [str(r[0]) for r in rows]
    if truth.kind == "list":  # ranking SQL fetches k + 1 rows to detect ties
        return names[: len(truth.value)]  # type: ignore[arg-type]
    return names


def decoys(db_path: Path, avoid: list[str]) -> list[str]:
    """Plausible wrong entities: real names from the same database."""

    taken = {normalise(a) for a in avoid}
    pool = [str(r[0]) for sql in ("SELECT name FROM departments", "SELECT location FROM "
                                  "departments", "SELECT name FROM employees",
                                  "SELECT name FROM projects")
            for r in read_sql(db_path, sql)]
    return sorted({p for p in pool if normalise(p) not in taken
                   and not any(normalise(p) in normalise(a) or normalise(a) in normalise(p)
                               for a in avoid)})


def answers(db_path: Path, truth: GroundTruth, rng: random.Random) -> tuple[list[str], list[str]]:
    """(right answers, wrong answers) in prose, from the direct database read."""

    ref = reference(db_path, truth)
    if truth.kind == "number":
        value = float(ref)
        right = [f"{value:,.2f}", f"The answer is {value:g}.", f"It comes to about {value:,.3f}"]
        wrong = [f"{value * 1.5 + 7:,.2f}", "I could not find it in the database."]
        return right, wrong
    if truth.kind == "text":
        other = rng.choice(decoys(db_path, [ref]))
        return [ref, f"It is {ref}.", f"The answer: **{ref.upper()}**"], [other, f"It is {other}."]
    names = list(ref)
    wrong_name = rng.choice(decoys(db_path, names))
    if truth.kind == "set":
        shuffled = rng.sample(names, len(names))
        right = [", ".join(shuffled), "They are:\n" + "\n".join(f"- {n}" for n in names)]
        wrong = [", ".join([*names, wrong_name])]
        if len(names) > 1:
            wrong.append(" and ".join(shuffled[1:]))
        return right, wrong
    right = ["\n".join(f"{i}. {n}" for i, n in enumerate(names, 1)), ", then ".join(names)]
    wrong = [", ".join([*names[:-1], wrong_name])]
    if len(names) > 1:
        wrong.append(", ".join(reversed(names)))
    return right, wrong


def agrees(truth: GroundTruth, ref: Any) -> bool:
    if truth.kind == "number":
        return abs(float(ref) - float(truth.value)) <= max(  # type: ignore[arg-type]
            truth.abs_tol, truth.rel_tol * abs(float(truth.value)), 0.006)  # type: ignore[arg-type]
    if truth.kind == "text":
        return normalise(str(ref)) == normalise(str(truth.value))
    expected = [normalise(str(v)) for v in truth.value]  # type: ignore[union-attr]
    got = [normalise(str(v)) for v in ref]
    return got == expected if truth.kind == "list" else sorted(got) == sorted(expected)


def test_sql_ground_truth_matches_direct_database_reads(sql_world) -> None:
    scenarios, db_path = sql_world
    chosen = pick(scenarios)
    assert {s.ground_truth.kind for s in chosen} == {"number", "text", "set", "list"}, [
        s.ground_truth.kind for s in scenarios if s.ground_truth]
    for s in chosen:
        assert agrees(s.ground_truth, reference(db_path, s.ground_truth)), s.model_dump()


def test_verifiable_scores_right_and_wrong_answers(sql_world, judge_factory) -> None:
    scenarios, db_path = sql_world
    rng = random.Random(5)
    checked = 0
    with judge_factory(base_url=f"http://127.0.0.1:{free_port()}/v1") as url:  # no judge model
        for scenario in pick(scenarios):
            truth = scenario.ground_truth
            right, wrong = answers(db_path, truth, rng)
            result = json.dumps(read_sql(db_path, truth.sql)[:5])
            group = [sql_trajectory(scenario.task, [(truth.sql, result)], a) for a in right + wrong]
            # the agent that never called complete_task but said it in its last words
            last_words = sql_trajectory(scenario.task, [(truth.sql, result)], None)
            last_words.messages.append({"role": "assistant", "content": right[0]})
            group.append(last_words)
            body = {"scenario": scenario.model_dump(), "reward": {"mode": "verifiable"},
                    "trajectories": [t.model_dump() for t in group]}
            resp = httpx.post(f"{url}/v1/score-group", json=body, timeout=30)
            assert resp.status_code == 200, resp.text
            data = resp.json()
            verdicts = [s["components"]["verifiable"] for s in data["scores"]]
            expected = [1.0] * len(right) + [0.0] * len(wrong) + [1.0]
            assert verdicts == expected, (scenario.task, truth, right + wrong, data["scores"])
            for s, want in zip(data["scores"], expected, strict=True):
                assert s["score"] == want  # verifiable mode; no penalties triggered
                assert (s["components"]["verifiable_partial"] == 1.0) == (want == 1.0)
            assert data["usage"]["upstream_calls"] == 0
            checked += 1
    assert checked >= 6
