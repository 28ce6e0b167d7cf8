"""The HTTP API end to end on loopback: create, poll, fetch; bad input -> 4xx JSON."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from mcprl_common.process import UvicornThread, free_port
from mcprl_common.settings import UpstreamSettings
from mcprl_scenario_gen.app import create_app
from mcprl_scenario_gen.settings import ScenarioGenSettings
from mcprl_testing.mcp_server import read_sql
from mcprl_testing.scenario_gen import wait_finished

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture
def api(settings: ScenarioGenSettings) -> Iterator[httpx.Client]:
    settings = settings.model_copy(update={"max_scenarios": 500})
    generator = UpstreamSettings(base_url=f"http://127.0.0.1:{free_port()}/v1", model="none",
                                 max_retries=0, timeout_s=5)
    with UvicornThread(create_app(settings, generator=generator)) as srv, httpx.Client(
            base_url=srv.url, timeout=30) as client:
        yield client


def test_create_poll_fetch_and_metrics(api: httpx.Client, company) -> None:
    url, db = company
    resp = api.post("/v1/scenario-sets", json={
        "mcp_url": url, "strategy": "sql", "n": 30, "seed": 1, "val_fraction": 0.2,
        "holdout_templates": True})
    assert resp.status_code == 202, resp.text
    created = resp.json()
    assert resp.headers["location"] == created["links"]["self"]
    status = wait_finished(api, created["id"])
    assert status["status"] == "succeeded", status
    manifest = status["manifest"]
    assert manifest["counts"]["train"] + manifest["counts"]["val"] == 30
    assert manifest["tools_hash"].startswith("sha256:") and manifest["server_url"] == url
    assert status["progress"]["tool_calls"] > 30

    train = api.get(f"/v1/scenario-sets/{created['id']}/scenarios",
                    params={"split": "train"}).json()
    val = api.get(f"/v1/scenario-sets/{created['id']}/scenarios", params={"split": "val"}).json()
    assert train["count"] == manifest["counts"]["train"] and val["count"] == 6
    assert not {s["template"] for s in train["data"]} & {s["template"] for s in val["data"]}
    one = train["data"][0]
    assert read_sql(db, one["ground_truth"]["sql"])  # the stored SQL runs on the real DB
    art = api.get(f"/v1/scenario-sets/{created['id']}/scenarios",
                  params={"split": "val", "format": "art"}).json()
    assert all(set(item) == {"task", "difficulty"} for item in art["data"])

    listed = api.get("/v1/scenario-sets").json()["data"]
    assert created["id"] in {m["id"] for m in listed}
    metrics = api.get("/metrics").text
    assert 'mcprl_scenario_gen_scenarios_total{strategy="sql"} 30.0' in metrics
    assert 'mcprl_scenario_gen_duration_seconds_count{status="succeeded",strategy="sql"} 1.0' \
        in metrics
    # Finished sets cannot be cancelled; they can be deleted.
    assert api.post(f"/v1/scenario-sets/{created['id']}/cancel").status_code == 409
    assert api.delete(f"/v1/scenario-sets/{created['id']}").status_code == 204
    assert api.get(f"/v1/scenario-sets/{created['id']}").status_code == 404


@pytest.mark.parametrize("body,param,words", [
    ({"n": 501}, "n", "larger than the maximum of 500"),
    ({"n": 0}, "n", "greater than or equal to 1"),
    ({"strategy": "magic"}, "strategy", "unknown strategy 'magic'"),
    ({"val_fraction": 1.5}, "val_fraction", "less than or equal"),
    ({"difficulty_mix": {"7": 1}}, "difficulty_mix", "difficulty keys must be 1-5"),
    ({"model": "gpt"}, "model", "apply to the llm strategy"),
    ({"surprise": 1}, "surprise", "Extra inputs"),
    ({"n": "30"}, "n", "valid integer"),  # the schema's types, not lax coercion
    ({"val_fraction": True}, "val_fraction", "valid number"),
    ({"holdout_entities": 1}, "holdout_entities", "valid boolean"),
])
def test_bad_bodies_are_400_naming_the_field(api: httpx.Client, company, body, param,
                                             words) -> None:
    resp = api.post("/v1/scenario-sets", json={"mcp_url": company[0], "strategy": "sql",
                                               **body})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_bad_servers_are_400_with_clear_messages(api: httpx.Client, other_server,
                                                 empty_server) -> None:
    dead = f"http://127.0.0.1:{free_port()}/mcp"
    cases = [
        ({"mcp_url": dead}, "mcp_url", "is unreachable"),
        ({"mcp_url": "ftp://example/mcp"}, "mcp_url", "must be http(s)"),
        ({"mcp_url": empty_server}, "mcp_url", "offers no tools"),
        ({"mcp_url": other_server, "strategy": "sql"}, "strategy",
         "lacks list_tables, describe_table, run_query"),
    ]
    for body, param, words in cases:
        started = time.monotonic()
        resp = api.post("/v1/scenario-sets", json={"strategy": "sql", "n": 5, **body})
        assert resp.status_code == 400, resp.text
        assert time.monotonic() - started < 10
        error = resp.json()["error"]
        assert error["param"] == param and words in error["message"], error
    assert api.get("/v1/scenario-sets").json()["data"] == []  # nothing was queued


def test_mcp_url_defaults_to_the_service_setting(settings: ScenarioGenSettings, company) -> None:
    no_default = settings.model_copy(update={"default_mcp_url": None})
    with UvicornThread(create_app(no_default)) as srv:
        resp = httpx.post(f"{srv.url}/v1/scenario-sets", json={"n": 5}, timeout=30)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "mcp_url"
    with_default = settings.model_copy(update={"default_mcp_url": company[0]})
    with UvicornThread(create_app(with_default)) as srv, httpx.Client(
            base_url=srv.url, timeout=30) as client:
        resp = client.post("/v1/scenario-sets", json={"n": 5})
        assert resp.status_code == 202, resp.text
        status = wait_finished(client, resp.json()["id"])
        assert status["manifest"]["server_url"] == company[0]


def test_unknown_ids_and_splits(api: httpx.Client) -> None:
    assert api.get("/v1/scenario-sets/ss-nope").status_code == 404
    assert api.get("/v1/scenario-sets/ss-nope/scenarios").status_code == 404
    assert api.post("/v1/scenario-sets/ss-nope/cancel").status_code == 404
    resp = api.get("/v1/scenario-sets/ss-nope/scenarios", params={"split": "test"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "split"
    health = api.get("/healthz").json()
    assert health["status"] == "ok" and health["data_dir_writable"] is True


def test_bearer_token_is_passed_to_the_server(settings: ScenarioGenSettings, tmp_path) -> None:
    from mcprl_mcp_server.loopback import serve_mcp

    with serve_mcp(tmp_path / "auth", auth_token="t0ken") as (url, _), UvicornThread(
            create_app(settings)) as srv, httpx.Client(base_url=srv.url, timeout=30) as client:
        denied = client.post("/v1/scenario-sets", json={"mcp_url": url, "n": 5})
        assert denied.status_code == 400 and "HTTP 401" in denied.json()["error"]["message"]
        ok = client.post("/v1/scenario-sets", json={"mcp_url": url, "n": 5,
                                                    "auth_token": "t0ken"})
        assert ok.status_code == 202, ok.text
        status = wait_finished(client, ok.json()["id"])
        assert status["status"] == "succeeded"
        assert "t0ken" not in (settings.data_dir / ok.json()["id"] / "manifest.json").read_text()
