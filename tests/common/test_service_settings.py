"""Every service configures itself the same way (GUIDE's table): one settings class per
service, its env prefix, its usual port, 127.0.0.1 by default, a description on every field
(``.env.example`` is generated from them), nested sections included."""

from __future__ import annotations

import importlib
import typing
from collections.abc import Iterator

import pytest
from pydantic import BaseModel
from pydantic_settings import BaseSettings

pytestmark = pytest.mark.timeout(60)

# (settings module, class, env prefix, default port) as in the README's configuration table.
SERVICES = {
    "mcp-server": ("mcprl_mcp_server.settings", "McpServerSettings", "MCP_", 8903),
    "inference": ("mcprl_inference.settings", "InferenceSettings", "INFERENCE_", 8000),
    "scenario-gen": ("mcprl_scenario_gen.settings", "ScenarioGenSettings", "SCENARIO_GEN_", 8910),
    "judge": ("mcprl_judge.settings", "JudgeSettings", "JUDGE_", 8920),
    "inventory-mcp": ("mcprl_example_inventory.settings", "InventorySettings", "INVENTORY_", 8904),
}


def _settings_class(service: str) -> type[BaseSettings]:
    module, name, _, _ = SERVICES[service]
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, BaseSettings), f"{module}.{name} is not a pydantic-settings class"
    return cls


def _models_in(annotation: object) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def _undocumented(cls: type[BaseModel], path: str = "") -> list[str]:
    """Dotted names of fields without a description, nested models included."""

    out: list[str] = []
    for name, field in cls.model_fields.items():
        dotted = f"{path}{name}"
        if not (field.description or "").strip():
            out.append(dotted)
        for sub in _models_in(field.annotation):
            out.extend(_undocumented(sub, f"{dotted}."))
    return out


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_settings_prefix_port_host_and_descriptions(service: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, prefix, port = SERVICES[service]
    cls = _settings_class(service)
    assert cls.model_config.get("env_prefix") == prefix
    assert cls.model_fields["port"].default == port
    assert cls.model_fields["host"].default == "127.0.0.1"
    assert _undocumented(cls) == [], f"{service}: fields without a description"

    # The prefix is what the environment is read with: <PREFIX>PORT / <PREFIX>HOST win.
    for var in (f"{prefix}PORT", f"{prefix}HOST"):
        monkeypatch.delenv(var, raising=False)
    defaults = cls()
    assert (defaults.host, defaults.port) == ("127.0.0.1", port)
    monkeypatch.setenv(f"{prefix}PORT", "1234")
    monkeypatch.setenv(f"{prefix}HOST", "0.0.0.0")
    from_env = cls()
    assert (from_env.host, from_env.port) == ("0.0.0.0", 1234)


def test_trainer_config_prefix_port_host_and_descriptions() -> None:
    """The trainer's run config is a pydantic model read from YAML + ``TRAINER_*``."""

    from mcprl_trainer import config

    assert config.ENV_PREFIX == "TRAINER_"
    assert config.ENV_ALIASES["TRAINER_PORT"] == ("status", "port")
    assert config.ENV_ALIASES["TRAINER_HOST"] == ("status", "host")
    status = config.StatusConfig()
    assert (status.host, status.port) == ("127.0.0.1", 8930)
    assert _undocumented(config.RunConfig) == []

    env = {"TRAINER_PORT": "1234", "TRAINER_HOST": "0.0.0.0"}
    run = config.load_config(env=env, overrides={"model": "m", "scenarios": {
        "dir": "sets", "set_id": "s"}})
    assert (run.status.host, run.status.port) == ("0.0.0.0", 1234)


def test_the_check_finds_an_undocumented_field() -> None:
    class Inner(BaseModel):
        documented: int = 0

    class Outer(BaseModel):
        inner: Inner | None = None

    assert _undocumented(Outer) == ["inner", "inner.documented"]


def test_one_settings_class_per_module_named_after_its_service() -> None:
    """``<Service>Settings``, never a bare ``Settings`` (stack's too; old names are aliases)."""

    import inspect

    modules = {m: name for m, name, _, _ in SERVICES.values()}
    modules["mcprl_stack.config"] = "StackSettings"
    for module_name, expected in modules.items():
        module = importlib.import_module(module_name)
        own = {obj.__name__ for _, obj in inspect.getmembers(module, inspect.isclass)
               if issubclass(obj, BaseSettings) and obj.__module__ == module_name}
        assert own == {expected}, (module_name, own)
