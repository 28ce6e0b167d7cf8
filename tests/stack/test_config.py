"""StackSettings and the service table: what runs, in which order, with which environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcprl_stack.config import StackSettings
from mcprl_stack.local_stack import LocalStack
from mcprl_stack.services import SERVICES, start_order

pytestmark = pytest.mark.timeout(30)


def test_start_order_puts_dependencies_first() -> None:
    levels = start_order(["judge", "trainer", "scenario-gen", "inference", "mcp-server"])
    position = {name: i for i, level in enumerate(levels) for name in level}
    for name in position:
        for dep in SERVICES[name].depends_on:
            if dep in position:
                assert position[dep] < position[name], (dep, name, levels)
    assert set(levels[0]) == {"inference", "mcp-server"}  # no deps: started together
    assert levels[-1] == ["trainer"]


def test_dependencies_not_selected_are_expected_elsewhere() -> None:
    # a judge pointed at a hosted model needs no local engine
    assert start_order(["judge"]) == [["judge"]]


def test_unknown_service_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown service"):
        StackSettings(services=["mcp-server", "vllm"])
    with pytest.raises(ValueError, match="unknown service"):
        start_order(["nope"])


def test_trainer_needs_a_run_config() -> None:
    with pytest.raises(ValueError, match="train_config"):
        StackSettings(services=["trainer"])


def test_services_from_a_comma_separated_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACK_SERVICES", "mcp-server, judge")
    assert StackSettings().services == ["mcp-server", "judge"]


def test_from_env_reads_the_services_own_names() -> None:
    environ = {"MCP_PORT": "9903", "JUDGE_PORT": "9920", "INFERENCE_MODEL": "/m/tiny",
               "MCP_URL": "http://elsewhere:1/mcp"}
    config = StackSettings.from_env(environ)
    assert config.port_of("mcp-server") == 9903
    assert config.port_of("judge") == 9920
    assert config.port_of("inference") == 8000  # the usual port when unset
    assert config.model == "/m/tiny"
    assert config.mcp_url == "http://elsewhere:1/mcp"
    # explicit values win over the services' variables
    assert StackSettings.from_env(environ, model="/m/other").model == "/m/other"


def _static(stack: LocalStack) -> LocalStack:
    for name in stack.config.services:
        stack.ports[name] = stack.config.port_of(name)
        stack.urls[name] = f"http://127.0.0.1:{stack.ports[name]}"
    stack.served_model = "served-name"
    return stack


def test_wiring_uses_compose_variable_names(tmp_path: Path) -> None:
    config = StackSettings(services=["mcp-server", "inference", "scenario-gen", "judge"],
                         runs_dir=tmp_path, inherit_env=False, model="models/tiny-test")
    stack = _static(LocalStack(config))
    gen = stack.env_for("scenario-gen")
    assert gen["GENERATOR_BASE_URL"] == "http://127.0.0.1:8000/v1"
    assert gen["GENERATOR_MODEL"] == "served-name"
    assert gen["MCP_URL"] == "http://127.0.0.1:8903/mcp"
    assert gen["SCENARIO_GEN_PORT"] == "8910" and gen["SCENARIO_GEN_HOST"] == "127.0.0.1"
    assert Path(gen["SCENARIO_GEN_DATA_DIR"]).is_relative_to(tmp_path.resolve())
    judge = stack.env_for("judge")
    assert judge["JUDGE_BASE_URL"] == "http://127.0.0.1:8000/v1"
    assert judge["JUDGE_MODEL"] == "served-name"
    assert stack.env_for("inference")["INFERENCE_MODEL"] == "models/tiny-test"
    assert stack.env_for("mcp-server")["MCP_DB_PATH"].endswith("company.db")


def test_callers_environment_overrides_defaults_but_not_ports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_BASE_URL", "https://judge.example/v1")
    monkeypatch.setenv("JUDGE_PORT", "1")
    config = StackSettings(services=["inference", "judge"], runs_dir=tmp_path)
    env = _static(LocalStack(config)).env_for("judge")
    assert "JUDGE_BASE_URL" not in env  # the child inherits the caller's value
    assert env["JUDGE_PORT"] == "8920"  # the stack decides where it listens
    config = StackSettings(services=["inference", "judge"], runs_dir=tmp_path,
                         env={"JUDGE_MODEL": "pinned"})
    assert _static(LocalStack(config)).env_for("judge")["JUDGE_MODEL"] == "pinned"


def test_external_mcp_url_wins(tmp_path: Path) -> None:
    config = StackSettings(services=["mcp-server", "scenario-gen"], runs_dir=tmp_path,
                         inherit_env=False, mcp_url="http://far:9/mcp")
    stack = _static(LocalStack(config))
    assert stack.env_for("scenario-gen")["MCP_URL"] == "http://far:9/mcp"
    assert stack.client_env()["MCP_URL"] == "http://far:9/mcp"


def test_pipeline_can_point_at_the_inventory_server(tmp_path: Path) -> None:
    config = StackSettings(services=["inventory-mcp", "scenario-gen"], runs_dir=tmp_path,
                         inherit_env=False, mcp="inventory-mcp")
    stack = _static(LocalStack(config))
    assert stack.env_for("scenario-gen")["MCP_URL"] == "http://127.0.0.1:8904/mcp"


def test_trainer_runs_as_a_job_with_its_config(tmp_path: Path) -> None:
    run_config = tmp_path / "run.yaml"
    run_config.write_text("name: x\n")
    config = StackSettings(services=["inference", "judge", "trainer"], runs_dir=tmp_path,
                         inherit_env=False, train_config=run_config, model="m")
    stack = _static(LocalStack(config))
    argv = stack._argv("trainer")
    assert Path(argv[0]).name == "mcprl-train"
    assert argv[1:] == ["--config", str(run_config.resolve())]
    assert SERVICES["trainer"].job and not SERVICES["judge"].job
    env = stack.env_for("trainer")
    assert env["POLICY_BASE_URL"] == "http://127.0.0.1:8000/v1"
    assert env["POLICY_MODEL"] == "served-name"
    assert env["TRAINER_MODEL"] == "m"  # trains the weights the engine serves
    assert env["JUDGE_URL"] == "http://127.0.0.1:8920"
    assert env["TRAINER_PORT"] == "8930"
