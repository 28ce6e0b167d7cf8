"""`make compose-test`: the CPU stack built and run for real on a Docker engine.

Every image is built; ``docker compose -f compose.yaml -f compose.cpu.yaml up`` runs until each
healthcheck passes; a scenario set is made through scenario-gen's API; the ``train`` profile
runs 2 GRPO steps and its adapter is served by name from the inference container; the stack's
own Prometheus has had every target up and answers every query of the Grafana dashboard; the
inventory example's image as ``MCP_SERVER_IMAGE`` trains the same way; ``make down`` leaves
nothing running. Phase times and image sizes go to runs/compose-test/summary.json.

Marked ``docker``: ``make test`` leaves these out (``-m "not docker"`` in pyproject.toml) and
`make compose-test` selects them; without a reachable engine they are skipped. The project
name is its own (``mcprl-compose-test``): a user's ``mcp-rl`` project is never touched. What a
user would put in .env (the set id, the run's length) goes in an override file instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastmcp import Client

from mcprl_common.wire import RewardConfig, Scenario, ScoreGroupRequest, Trajectory
from mcprl_stack.compose import (
    ComposeStack,
    engine_reachable,
    image_size_mb,
    run_in_image,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]  # the first one builds every image
REPO = Path(__file__).resolve().parents[2]
SUMMARY = REPO / "runs/compose-test/summary.json"
# service -> (its packages, as folder and import name)
IMAGES = {
    "mcp-server": {"common": "mcprl_common", "mcp-server": "mcprl_mcp_server"},
    "inventory-mcp": {"common": "mcprl_common",
                      "examples/inventory-mcp": "mcprl_example_inventory"},
    "scenario-gen": {"common": "mcprl_common", "scenario-gen": "mcprl_scenario_gen"},
    "judge": {"common": "mcprl_common", "judge": "mcprl_judge"},
    "inference": {"common": "mcprl_common", "inference": "mcprl_inference"},
    "trainer": {"common": "mcprl_common", "trainer": "mcprl_trainer"},  # no engine inside
}
TORCH_IMAGES = ("inference", "trainer")
CPU_IMAGE_LIMIT_MB = 2000
RUNNING = ("mcp-server", "inventory-mcp", "inference", "scenario-gen", "judge", "prometheus")
# Dashboard series our stack cannot have, and why.
NO_SERIES = {"vllm:kv_cache_usage_perc": "vLLM only: our engine has no paged KV-cache pool"}
INVENTORY_PROMPT = (
    "You are an agent that answers questions about a warehouse inventory by calling tools. "
    "Find codes and SKUs with list_warehouses and search_items, then look up stock and "
    "movements. When you know the answer, call complete_task with the final answer only.")
# What a user would write in .env for these runs (the trainer's part is added per run).
OVERRIDE = {"services": {
    "mcp-server": {"environment": {"INVENTORY_ALLOWED_HOSTS": "mcp-server"}},
    # Small, bounded outputs: the 5M warm start writes scenarios and judges in seconds.
    "scenario-gen": {"environment": {"SCENARIO_GEN_LLM_BATCH_SIZE": "4",
                                     "SCENARIO_GEN_LLM_MAX_TOKENS": "600",
                                     "SCENARIO_GEN_LLM_TASK_MAX_CHARS": "80",
                                     "SCENARIO_GEN_LLM_MAX_REPAIRS": "1"}},
    "judge": {"environment": {"JUDGE_MAX_OUTPUT_TOKENS": "400",
                              "JUDGE_EXPLANATION_MAX_CHARS": "40"}},
}}
PHASES: dict[str, float] = {}


@contextmanager
def phase(name: str) -> Iterator[None]:
    t0 = time.monotonic()
    try:
        yield
    finally:
        PHASES[name] = round(time.monotonic() - t0, 1)


def _version(folder: str, module: str) -> str:
    init = REPO / folder / "src" / module / "__init__.py"
    found = re.search(r'^__version__ = "([^"]+)"', init.read_text(), re.M)
    return found.group(1) if found else ""


def _lock() -> dict[str, str]:
    """The lock as the images apply it: constraints.txt, the image pins, the torch pin."""

    pins: dict[str, str] = {}
    lines = [*(REPO / "constraints.txt").read_text().splitlines(),
             *(REPO / "docker/constraints-image.txt").read_text().splitlines(),
             re.search(r"^TORCH_PIN \?= (\S+)", (REPO / "Makefile").read_text(), re.M).group(1)]
    for line in lines:
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[_norm(name)] = version.strip()
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeStack]:
    version = engine_reachable()
    if version is None:
        pytest.skip("no Docker engine reachable (docker version / docker compose version)")
    folder = tmp_path_factory.mktemp("compose")
    (folder / "compose.test.yaml").write_text(yaml.safe_dump(OVERRIDE))
    (folder / "compose.train.yaml").write_text(yaml.safe_dump({"services": {}}))
    stack = ComposeStack(REPO, files=("compose.yaml", "compose.cpu.yaml",
                                      str(folder / "compose.test.yaml"),
                                      str(folder / "compose.train.yaml")))
    stack.compose("down", "-v", "--remove-orphans", timeout_s=180)  # a previous run's leftovers
    yield stack
    stack.compose("down", "-v", "--remove-orphans", timeout_s=180, check=False)
    _write_summary(stack, version)


def _write_summary(stack: ComposeStack, engine: str) -> None:
    sizes = {}
    for service in IMAGES:
        try:
            sizes[service] = round(image_size_mb(stack.image(service)), 1)
        except Exception:  # a summary of what exists: an image not built is left out
            continue
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps({
        "engine": engine, "bases": os.environ.get("MCPRL_COMPOSE_BASES", "as configured"),
        "phases_s": {"bases": float(os.environ.get("MCPRL_COMPOSE_BASES_S", 0)), **PHASES},
        "images_mb": sizes}, indent=2))


@pytest.fixture(scope="module")
def built(compose: ComposeStack) -> dict[str, str]:
    """Every image of the stack, built; service -> image."""

    with phase("build"):
        compose.compose("build", timeout_s=3000)
    return {service: compose.image(service) for service in IMAGES}


@pytest.fixture(scope="module")
def running(compose: ComposeStack, built: dict[str, str]) -> ComposeStack:
    with phase("up"):
        compose.compose("up", "-d", "--wait", "--wait-timeout", "400", *RUNNING, timeout_s=450)
    return compose


def _make_set(stack: ComposeStack, body: dict[str, Any], timeout_s: float = 300) -> dict:
    url = stack.url("scenario-gen")
    created = httpx.post(f"{url}/v1/scenario-sets", json=body, timeout=30)
    assert created.status_code == 202, created.text
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = httpx.get(f"{url}/v1/scenario-sets/{created.json()['id']}", timeout=10).json()
        if status["status"] not in ("pending", "running"):
            assert status["status"] == "succeeded", status
            return status
        time.sleep(1)
    raise TimeoutError(f"scenario set still running after {timeout_s}s")


def _train(stack: ComposeStack, run: str, set_id: str, steps: int = 2,
           **settings: str) -> dict[str, Any]:
    """The ``train`` profile's trainer, as ``up -d trainer`` with the run's settings where a
    user has them (.env: here the last override file); its report once it exits."""

    env = {"TRAINER_NAME": run, "TRAINER_SCENARIOS__SET_ID": set_id,
           "TRAINER_STEPS": str(steps), "OMP_NUM_THREADS": "2", **settings}
    Path(stack.files[-1]).write_text(yaml.safe_dump(
        {"services": {"trainer": {"environment": env}}}))
    stack.compose("up", "-d", "--no-recreate", "trainer", timeout_s=300)
    code = stack.wait_exit("trainer", timeout_s=900)
    assert code == 0, stack.logs("trainer")
    report = stack.compose("exec", "-T", "inference", "cat", f"/adapters/{run}/report.json",
                           timeout_s=60).stdout
    stack.compose("rm", "-f", "-s", "trainer", timeout_s=120)
    return json.loads(report)


# -- the images ----------------------------------------------------------------------------

SOURCE_CHECK = """
import hashlib, importlib, json, pathlib, sys
out = {}
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    root = pathlib.Path(module.__file__).parent
    files = {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in root.rglob("*.py")}
    out[name] = {"version": getattr(module, "__version__", None), "files": files}
print(json.dumps(out))
"""


@pytest.mark.parametrize("service", list(IMAGES))
def test_image_carries_the_real_source(built: dict[str, str], service: str) -> None:
    """Each package in the image imports with its ``__version__`` and is the repository's
    source file for file: an empty ``__init__.py`` left in build/lib by the dependency layer's
    stub once crashed the judge and the trainer (``cannot import name '__version__'``)."""

    modules = IMAGES[service]
    found = json.loads(run_in_image(built[service], "python", "-c", SOURCE_CHECK,
                                    *modules.values()))
    for folder, module in modules.items():
        root = REPO / folder / "src" / module
        source = {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                  for p in root.rglob("*.py")}
        assert found[module]["files"] == source, f"{service}: {module} differs from the source"
        assert found[module]["version"] == (_version(folder, module) or None), service


def test_pins_hold_in_every_image(built: dict[str, str]) -> None:
    lock = _lock()
    for service, image in built.items():
        # pip freeze's format, name==version even for torch installed from a wheel file
        frozen = run_in_image(image, "pip", "list", "--format=freeze", "--exclude-editable")
        for line in frozen.splitlines():
            name, _, version = line.partition("==")
            key = _norm(name)
            if key.startswith("mcprl-") or key == "pip":
                continue
            assert key in lock, f"{service}: {line} is not in the lock"
            assert version.split("+")[0] == lock[key], f"{service}: {line}, lock {lock[key]}"


def test_cpu_images_carry_torch_cpu_build_under_2gb(built: dict[str, str]) -> None:
    for service in TORCH_IMAGES:
        out = run_in_image(built[service], "python", "-c",
                           "import torch, importlib.metadata as m; print(torch.__version__, "
                           "torch.version.cuda, sum(d.metadata['Name'].startswith('nvidia') "
                           "or d.metadata['Name'] == 'triton' for d in m.distributions()))")
        version, cuda, gpu_wheels = out.split()
        assert version.endswith("+cpu") and cuda == "None" and gpu_wheels == "0", out
        size = image_size_mb(built[service])
        assert size < CPU_IMAGE_LIMIT_MB, f"{service}: {size:.0f} MB"


# -- the running stack ---------------------------------------------------------------------

def test_every_service_turns_healthy(running: ComposeStack) -> None:
    states = running.states()
    for service in RUNNING:
        assert states[service]["state"] == "running", states[service]
        assert states[service]["health"] == "healthy", (service, states[service])
    assert states["init-volumes"]["exit_code"] == "0"


@pytest.fixture(scope="module")
def sql_run(running: ComposeStack) -> dict[str, Any]:
    with phase("scenario_set"):
        status = _make_set(running, {"strategy": "sql", "n": 48, "seed": 0,
                                     "val_fraction": 0.33, "holdout_entities": True})
    with phase("train_2_steps"):
        report = _train(running, "compose-cpu", status["id"])
    return {"set": status, "report": report}


def test_scenario_set_made_through_the_api(sql_run: dict[str, Any]) -> None:
    manifest = sql_run["set"]["manifest"]
    assert manifest["server_url"] == "http://mcp-server:8903/mcp"  # compose's MCP_URL
    assert manifest["counts"]["train"] >= 24 and manifest["counts"]["val"] >= 8


def test_train_profile_learns_and_the_adapter_is_served(
        running: ComposeStack, sql_run: dict[str, Any]) -> None:
    report = sql_run["report"]
    assert report["steps_done"] == 2, report
    history = report["history"]
    # The warm start's groups carry reward variance, so GRPO trains on some of them (with the
    # random tiny model every group scored the same and nothing trained).
    assert sum(h["groups_trained"] for h in history) > 0, history

    url = running.url("inference")
    models = {m["id"]: m for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
    assert "compose-cpu" in models, sorted(models)
    resp = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "model": "compose-cpu", "max_tokens": 8,
        "messages": [{"role": "user", "content": "How many departments are there?"}]})
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == "compose-cpu"
    listing = running.compose("exec", "-T", "inference", "ls", "/adapters/compose-cpu",
                              timeout_s=60).stdout
    assert "report.json" in listing


async def _own_mcp_requests(url: str) -> dict[str, Any]:
    async with Client(url, timeout=30) as client:
        tools = {t.name for t in await client.list_tools()}
        good = await client.call_tool("run_query", {"sql": "SELECT COUNT(*) AS n FROM employees"})
        bad = await client.call_tool("run_query", {"sql": "SELECT nope FROM nowhere"},
                                     raise_on_error=False)
    return {"tools": tools, "good": good, "bad": bad}


def _prometheus(stack: ComposeStack, path: str, **params: str) -> Any:
    resp = httpx.get(stack.url("prometheus") + path, params=params, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()["data"]


def _prometheus_sees(stack: ComposeStack, selector: str, timeout_s: float = 120) -> None:
    """Poll the stack's Prometheus until ``selector`` has two samples (scrapes are 15 s
    apart; a rate needs two), so the dashboard can show it after the server is swapped."""

    query = f"count_over_time({selector}[5m])"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = _prometheus(stack, "/api/v1/query", query=query)["result"]
        if any(float(r["value"][1]) >= 2 for r in result):
            return
        time.sleep(3)
    raise TimeoutError(f"Prometheus has not two samples of {selector} after {timeout_s:.0f}s")


def test_own_requests_to_the_published_services(running: ComposeStack,
                                                sql_run: dict[str, Any]) -> None:
    """A user's own clients on the published ports: an MCP query and a failing one (a tool
    error), and a score-group request naming a judge model the engine does not serve (a 4xx
    naming it); Prometheus then has the failures the dashboard's error panels show."""

    found = asyncio.run(_own_mcp_requests(running.url("mcp-server") + "/mcp"))
    assert {"list_tables", "run_query"} <= found["tools"]
    assert not found["good"].is_error and found["good"].structured_content["results"]
    assert found["bad"].is_error and "nowhere" in found["bad"].content[0].text

    scenario = Scenario(id="own-1", task="How many employees are there?")
    messages = [{"role": "user", "content": scenario.task},
                {"role": "assistant", "content": "150"}]
    body = ScoreGroupRequest(scenario=scenario, judge_model="no-such-model",
                             reward=RewardConfig(mode="ruler"), use_cache=False,
                             trajectories=[Trajectory(messages=messages, final_answer="150")] * 2)
    resp = httpx.post(running.url("judge") + "/v1/score-group", timeout=60,
                      json=body.model_dump(mode="json"))
    assert 400 <= resp.status_code < 500, resp.text
    assert "no-such-model" in resp.text

    _prometheus_sees(running, 'mcprl_mcp_tool_calls_total{outcome!="ok"}')
    _prometheus_sees(running, "mcprl_judge_failures_total")


@pytest.fixture(scope="module")
def inventory_run(running: ComposeStack, sql_run: dict[str, Any],
                  built: dict[str, str]) -> dict[str, Any]:
    """The inventory example's image as the stack's MCP server, as a user swaps it in."""

    swap = {"MCP_SERVER_IMAGE": built["inventory-mcp"], "MCP_SERVER_PORT": "8904",
            "MCP_URL": "http://mcp-server:8904/mcp",
            "MCP_SERVER_HEALTHCHECK": "python -c \"import urllib.request; urllib.request."
                                      "urlopen('http://127.0.0.1:8904/healthz', timeout=4)\""}
    running.variables.update(swap)
    with phase("swap_mcp_server"):
        running.compose("up", "-d", "--wait", "--wait-timeout", "300", *RUNNING, timeout_s=360)
        status = _make_set(running, {"strategy": "llm", "n": 4, "seed": 1,
                                     "val_fraction": 0.25, "json_schema": "on"})
    with phase("train_inventory"):
        report = _train(running, "compose-inventory", status["id"], steps=1,
                        TRAINER_REWARD__MODE="ruler",
                        TRAINER_ROLLOUT__SYSTEM_PROMPT=INVENTORY_PROMPT,
                        TRAINER_ROLLOUT__MAX_TURNS="3", TRAINER_ROLLOUT__MAX_TOKENS_PER_TURN="64")
    return {"set": status, "report": report}


def test_swapped_mcp_server_image_trains_the_same_way(
        running: ComposeStack, inventory_run: dict[str, Any]) -> None:
    assert running.image("mcp-server") == running.variables["MCP_SERVER_IMAGE"]
    manifest = inventory_run["set"]["manifest"]
    assert manifest["server_url"] == "http://mcp-server:8904/mcp"
    assert manifest["strategy"] == "llm"
    report = inventory_run["report"]
    assert report["steps_done"] == 1, report
    tools = httpx.get(running.url("mcp-server") + "/healthz", timeout=10)
    assert tools.status_code == 200


def test_prometheus_had_every_target_up_and_every_dashboard_query_has_a_series(
        running: ComposeStack, sql_run: dict[str, Any], inventory_run: dict[str, Any]) -> None:
    """Over the whole run (both trainings, the user's failing MCP call included)."""
    with phase("prometheus_checks"):
        # The RULER step's judge calls are the run's last: the judge counted their tokens,
        # and Prometheus needs two scrapes of the counter before a rate of it has a value.
        judge_metrics = httpx.get(running.url("judge") + "/metrics", timeout=10).text
        assert 'mcprl_judge_upstream_tokens_total{type="prompt"}' in judge_metrics
        _prometheus_sees(running, "mcprl_judge_upstream_tokens_total")
        jobs = {t["labels"]["job"] for t in
                _prometheus(running, "/api/v1/targets")["activeTargets"]}
        ups = _prometheus(running, "/api/v1/query", query="max by (job) (max_over_time(up[30m]))")
        up = {r["metric"]["job"]: float(r["value"][1]) for r in ups["result"]}
        assert jobs == set(up), (jobs, up)
        assert {job for job, v in up.items() if v != 1.0} == set(), up

        board = json.loads((REPO / "monitoring/grafana/dashboards/mcp-rl.json").read_text())
        now = time.time()
        empty = []
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"].replace("$__rate_interval", "1m")
                if any(name in expr for name in NO_SERIES):
                    continue
                data = _prometheus(running, "/api/v1/query_range", query=expr,
                                   start=str(now - 1800), end=str(now), step="15")
                if not data["result"]:
                    empty.append(f"{panel['title']}: {expr}")
        assert empty == [], "dashboard queries without a series:\n" + "\n".join(empty)


def test_make_down_leaves_nothing(running: ComposeStack,
                                  inventory_run: dict[str, Any]) -> None:
    with phase("down"):
        res = subprocess.run(["make", "down"], cwd=REPO, env=running.env(), capture_output=True,
                             text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert running.container_ids() == []
    assert running.networks() == []
    assert running.volumes(), "named volumes are kept by make down"
