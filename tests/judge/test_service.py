"""The judge over HTTP against a scripted third-party provider: structured output and its
fallback, retries on miscounts, 429/5xx backoff, 503 when down, the cache, bad inputs."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.timeout(60)


def test_scores_group_with_json_schema(provider, judge_factory, scenario, helpers) -> None:
    provider.script = [{"content": helpers.scores_json([0.9, 0.2])}]
    body = helpers.group_body(scenario, ["5", "I do not know", "5"])  # 1st and 3rd identical
    with judge_factory(base_url=provider.base_url) as url:
        resp = helpers.post_group(url, body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert [s["score"] for s in data["scores"]] == [0.9, 0.2, 0.9]
    assert data["scores"][1]["explanation"].startswith("ok 2")
    assert data["scores"][0]["components"]["ruler"] == 0.9
    assert data["judge_model"] == "fake-judge" and data["cached"] is False
    assert data["usage"] == {"prompt_tokens": 100, "completion_tokens": 20, "cost_usd": 0.0,
                             "upstream_calls": 1}
    (sent,) = provider.requests
    assert sent["model"] == "fake-judge"
    schema = sent["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["scores"]["required"] == ["1", "2"]  # deduplicated
    assert '<trajectory id="3">' not in sent["messages"][1]["content"]


def test_per_request_model_rubric_and_cost(provider, judge_factory, scenario, helpers) -> None:
    provider.script = [{"content": helpers.scores_json([0.4, 0.6])}]
    body = helpers.group_body(scenario, ["5", "4"], judge_model="other/model",
                              rubric="Prefer brevity above all.")
    with judge_factory(base_url=provider.base_url, cost_per_prompt_token_usd=1e-6,
                       cost_per_completion_token_usd=2e-6) as url:
        data = helpers.post_group(url, body).json()
    assert data["judge_model"] == "other/model"
    assert provider.requests[0]["model"] == "other/model"
    assert "Prefer brevity above all." in provider.requests[0]["messages"][0]["content"]
    assert data["usage"]["cost_usd"] == pytest.approx(100e-6 + 40e-6)


def test_wrong_score_count_is_sent_back_and_retried(provider, judge_factory, scenario,
                                                    helpers) -> None:
    provider.script = [{"content": helpers.scores_json([0.5])},
                       {"content": helpers.scores_json([0.3, 0.8])}]
    with judge_factory(base_url=provider.base_url, structured_output="none") as url:
        resp = helpers.post_group(url, helpers.group_body(scenario, ["5", "6"]))
    assert resp.status_code == 200, resp.text
    assert [s["score"] for s in resp.json()["scores"]] == [0.3, 0.8]
    assert resp.json()["usage"]["upstream_calls"] == 2
    retry_messages = provider.requests[1]["messages"]
    assert retry_messages[-1]["role"] == "user" and "missing ids 2" in retry_messages[-1][
        "content"]
    assert "response_format" not in provider.requests[0]  # structured output off


def test_unusable_answers_give_502_after_bounded_retries(provider, judge_factory, scenario,
                                                         helpers) -> None:
    provider.script = [{"content": "I'd rather write a poem."}]
    with judge_factory(base_url=provider.base_url, structured_output="none",
                       max_parse_retries=2) as url:
        resp = helpers.post_group(url, helpers.group_body(scenario, ["5", "6"]))
        metrics = httpx.get(f"{url}/metrics").text
    assert resp.status_code == 502
    assert "no usable answer in 3 attempts" in resp.json()["error"]["message"]
    assert len(provider.requests) == 3
    assert helpers.metric_value(metrics, "mcprl_judge_failures_total",
                                'kind="invalid_output"') == 3
    assert helpers.metric_value(metrics, "mcprl_judge_requests_total",
                                'outcome="upstream_error"') == 1


def test_auto_falls_back_when_provider_rejects_json_schema(provider, judge_factory, scenario,
                                                           helpers) -> None:
    def no_schema(body: dict[str, Any]) -> dict[str, Any]:
        if "response_format" in body:
            return {"status": 400, "message": "response_format json_schema is not supported"}
        return {"content": "Sure:\n```json\n" + helpers.scores_json([0.1, 0.7]) + "\n```"}

    provider.script = [no_schema]
    with judge_factory(base_url=provider.base_url, structured_output="auto") as url:
        first = helpers.post_group(url, helpers.group_body(scenario, ["5", "6"]))
        second = helpers.post_group(url, helpers.group_body(scenario, ["7", "8"]))
    assert first.status_code == 200 and second.status_code == 200, first.text
    assert [s["score"] for s in first.json()["scores"]] == [0.1, 0.7]
    # 1st group: rejected + fallback; 2nd group: straight to text (remembered per model)
    assert ["response_format" in r for r in provider.requests] == [True, False, False]


def test_json_schema_mode_reports_rejection_clearly(provider, judge_factory, scenario,
                                                    helpers) -> None:
    provider.script = [{"status": 400, "message": "unknown field response_format"}]
    with judge_factory(base_url=provider.base_url, structured_output="json_schema") as url:
        resp = helpers.post_group(url, helpers.group_body(scenario, ["5", "6"]))
    assert resp.status_code == 502
    assert "JUDGE_STRUCTURED_OUTPUT" in resp.json()["error"]["message"]
    assert len(provider.requests) == 1


def test_429_backs_off_honouring_retry_after(provider, judge_factory, scenario,
                                             helpers) -> None:
    provider.script = [{"status": 429, "message": "slow down", "headers": {"Retry-After": "0.1"}},
                       {"status": 502, "message": "bad gateway"},
                       {"content": helpers.scores_json([1, 0])}]
    with judge_factory(base_url=provider.base_url, max_retries=2) as url:
        resp = helpers.post_group(url, helpers.group_body(scenario, ["5", "6"]))
    assert resp.status_code == 200, resp.text
    assert len(provider.requests) == 3


def test_persistent_5xx_gives_503_with_retry_after(provider, judge_factory, scenario,
                                                   helpers) -> None:
    provider.script = [{"status": 503, "message": "overloaded", "headers": {"Retry-After": "7"}}]
    with judge_factory(base_url=provider.base_url, max_retries=2) as url:
        resp = helpers.post_group(url, helpers.group_body(scenario, ["5", "6"]))
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "7"
    assert "after 3 attempts" in resp.json()["error"]["message"]
    assert len(provider.requests) == 3


def test_unreachable_upstream_gives_503(judge_factory, scenario, helpers) -> None:
    from mcprl_common.process import free_port

    with judge_factory(base_url=f"http://127.0.0.1:{free_port()}/v1", max_retries=1) as url:
        resp = helpers.post_group(url, helpers.group_body(scenario, ["5", "6"]))
        metrics = httpx.get(f"{url}/metrics").text
    assert resp.status_code == 503 and resp.headers["retry-after"] == "3"
    assert "connection error" in resp.json()["error"]["message"]
    assert helpers.metric_value(metrics, "mcprl_judge_requests_total",
                                'outcome="upstream_unavailable"') == 1


def test_unknown_per_request_model_is_a_400(provider, judge_factory, scenario, helpers) -> None:
    provider.script = [{"status": 404, "message": "model not found"}]
    body = helpers.group_body(scenario, ["5", "6"], judge_model="nope/nope")
    with judge_factory(base_url=provider.base_url) as url:
        resp = helpers.post_group(url, body)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "judge_model"


def test_cache_avoids_second_upstream_call(provider, judge_factory, scenario, helpers) -> None:
    provider.script = [{"content": helpers.scores_json([0.25, 0.75])}]
    body = helpers.group_body(scenario, ["5", "6"])
    with judge_factory(base_url=provider.base_url) as url:
        first = helpers.post_group(url, body).json()
        again = helpers.post_group(url, body).json()
        weighted = helpers.post_group(url, {**body, "reward": {"mode": "weighted"}}).json()
        assert len(provider.requests) == 1
        fresh = helpers.post_group(url, {**body, "use_cache": False}).json()
        metrics = httpx.get(f"{url}/metrics").text
    assert len(provider.requests) == 2
    assert first["cached"] is False and again["cached"] is True and fresh["cached"] is False
    assert again["scores"] == first["scores"] and again["usage"]["upstream_calls"] == 0
    # the weights changed, the judgement did not: mode re-uses it
    assert weighted["cached"] is True
    assert weighted["scores"][0]["score"] == pytest.approx(0.5 * 0.25 + 0.5 * 1.0)
    assert helpers.metric_value(metrics, "mcprl_judge_cache_hits_total") == 2
    assert helpers.metric_value(metrics, "mcprl_judge_cache_misses_total") == 2


async def test_concurrent_identical_groups_share_one_call(provider, judge_factory, scenario,
                                                          helpers) -> None:
    provider.script = [{"content": helpers.scores_json([0.5, 0.6]), "delay": 0.5}]
    body = helpers.group_body(scenario, ["5", "6"])
    with judge_factory(base_url=provider.base_url, cache_enabled=False) as url:
        async with httpx.AsyncClient(timeout=30) as client:
            resps = await asyncio.gather(
                *(client.post(f"{url}/v1/score-group", json=body) for _ in range(4)))
    assert all(r.status_code == 200 for r in resps)
    assert len(provider.requests) == 1
    assert all(r.json()["scores"][1]["score"] == 0.6 for r in resps)


async def test_concurrency_limit_holds_upstream_calls(provider, judge_factory, scenario,
                                                      helpers) -> None:
    provider.script = [{"content": helpers.scores_json([0.5, 0.6]), "delay": 0.2}]
    bodies = [helpers.group_body(scenario, [str(i), "x"]) for i in range(3)]
    with judge_factory(base_url=provider.base_url, max_concurrency=1) as url:
        async with httpx.AsyncClient(timeout=30) as client:
            resps = await asyncio.gather(
                *(client.post(f"{url}/v1/score-group", json=b) for b in bodies))
    assert [r.status_code for r in resps] == [200, 200, 200]
    assert len(provider.requests) == 3 and provider.max_inflight == 1


def test_metrics_and_health(provider, judge_factory, scenario, helpers) -> None:
    provider.script = [{"content": helpers.scores_json([0.3, 0.9])}]
    with judge_factory(base_url=provider.base_url) as url:
        assert helpers.post_group(url, helpers.group_body(scenario, ["5", "6"])).status_code == 200
        health = httpx.get(f"{url}/healthz").json()
        defaults = httpx.get(f"{url}/v1/defaults").json()
        text = httpx.get(f"{url}/metrics").text
    assert health["status"] == "ok" and health["judge_model"] == "fake-judge"
    assert defaults["mode"] == "ruler" and "reaches the goal" in defaults["rubric"]
    value = helpers.metric_value
    assert value(text, "mcprl_judge_requests_total", 'outcome="ok"') == 1
    assert value(text, "mcprl_judge_upstream_tokens_total", 'type="prompt"') == 100
    assert value(text, "mcprl_judge_upstream_tokens_total", 'type="completion"') == 20
    assert value(text, "mcprl_judge_score_count") == 2
    assert value(text, "mcprl_judge_request_duration_seconds_count") == 1
    assert "mcprl_judge_cost_usd_total" in text and "mcprl_judge_cache_hits_total" in text


@pytest.mark.parametrize(
    ("patch", "status", "words"),
    [
        (lambda b: b.update(trajectories=[]), 400, "at least 1"),
        (lambda b: b.update(trajectories=b["trajectories"][:1]), 400, "at least 2"),
        (lambda b: b.update(trajectories=b["trajectories"] * 3), 413, "at most 4"),
        (lambda b: b["trajectories"][1]["messages"].append({"role": "robot", "content": "x"}),
         400, "trajectories[1].messages[6].role"),
        (lambda b: b["trajectories"][0]["messages"].append(
            {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}),
         400, "function name"),
        (lambda b: b["trajectories"][0]["messages"].append({"role": "user", "content": 5}),
         400, "content"),
        (lambda b: b["trajectories"][0].update(messages="hello"), 400, "messages"),
        (lambda b: b.update(reward={"mode": "vibes"}), 400, "reward.mode"),
        (lambda b: b.update(reward={"ruler_weight": "0.5"}), 400, "reward.ruler_weight"),
        (lambda b: b.update(use_cache=0), 400, "use_cache"),
        (lambda b: b["scenario"].update(ground_truth=None) or b.update(
            reward={"mode": "verifiable"}), 400, "ground_truth"),
        (lambda b: b.update(rubric="  "), 400, "rubric"),
        (lambda b: b.pop("scenario"), 400, "scenario"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_problem(provider, judge_factory, scenario, helpers,
                                               patch, status, words) -> None:
    body = helpers.group_body(scenario, ["5", "6"])
    patch(body)
    with judge_factory(base_url=provider.base_url, max_group_size=4) as url:
        resp = helpers.post_group(url, body)
    assert resp.status_code == status, resp.text
    assert words in resp.json()["error"]["message"]
    assert provider.requests == []


def test_malformed_json_body_is_a_400(judge_factory, provider) -> None:
    with judge_factory(base_url=provider.base_url) as url:
        resp = httpx.post(f"{url}/v1/score-group", content=b"{not json",
                          headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "error" in resp.json()


def test_group_of_one_in_verifiable_mode_needs_no_judge(provider, judge_factory, scenario,
                                                        helpers) -> None:
    body = helpers.group_body(scenario, ["There are 5 engineers."],
                              reward={"mode": "verifiable"})
    with judge_factory(base_url=provider.base_url) as url:
        data = helpers.post_group(url, body).json()
    assert data["scores"][0]["score"] == 1.0 and data["judge_model"] is None
    assert data["usage"]["upstream_calls"] == 0 and provider.requests == []


def test_default_mode_setting_applies_when_request_names_none(provider, judge_factory,
                                                              scenario, helpers) -> None:
    body = helpers.group_body(scenario, ["5"])
    with judge_factory(base_url=provider.base_url, default_mode="verifiable") as url:
        resp = helpers.post_group(url, body)
        explicit = helpers.post_group(url, {**body, "reward": {"mode": "ruler"}})
    assert resp.status_code == 200 and resp.json()["scores"][0]["score"] == 1.0
    assert explicit.status_code == 400


def test_api_key_never_reaches_logs_or_clients(provider, judge_factory, scenario, helpers,
                                               caplog) -> None:
    import logging

    from mcprl_common.logging import JsonFormatter, PlainFormatter

    key = "judge-secret-Zq81xK2"  # no sk- prefix: redaction patterns alone would miss it
    provider.script = [{"status": 401,
                        "message": f"Incorrect API key provided: {key}. Check your key."}]
    caplog.set_level(logging.DEBUG)
    with judge_factory(base_url=provider.base_url, api_key=key, log_level="debug") as url:
        resp = helpers.post_group(url, helpers.group_body(scenario, ["5", "6"]))
    assert resp.status_code == 502
    assert "JUDGE_API_KEY" in resp.json()["error"]["message"]
    assert key not in resp.text
    assert provider.headers[0]["authorization"] == f"Bearer {key}"  # it was used upstream
    assert caplog.records, "expected the failure to be logged"
    json_fmt, plain_fmt = JsonFormatter("judge"), PlainFormatter("%(message)s")
    for record in caplog.records:
        assert key not in json_fmt.format(record)
        assert key not in plain_fmt.format(record)
    assert any("credentials" in r.getMessage() for r in caplog.records)
    assert json.dumps([r.__dict__ for r in caplog.records], default=str).count(key) == 0
