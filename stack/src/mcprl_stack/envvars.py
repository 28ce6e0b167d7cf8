"""Every environment variable the services read, derived from their code.

Sources, per service package:

- the pydantic-settings classes in ``<package>/settings.py`` (prefix + field name, or the
  field's alias);
- ``upstream_settings("PREFIX_")`` calls anywhere in the package (an OpenAI-compatible
  upstream: ``PREFIX_BASE_URL``, ``PREFIX_MODEL``, ``PREFIX_API_KEY`` ...);
- literal ``os.environ[...]`` / ``os.environ.get(...)`` / ``os.getenv(...)`` reads;
- the trainer's run config: its well-known aliases (``POLICY_BASE_URL``, ``MCP_URL`` ...)
  and ``TRAINER_<FIELD>`` / ``TRAINER_<SECTION>__<FIELD>`` overrides.

``mcprl-stack env-example`` renders ``.env.example`` from this; the tests check that the
committed file names every variable, so it stays complete as the services grow.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from mcprl_common.settings import UpstreamSettings

# compose service name -> import package (order = order in .env.example)
PACKAGES: dict[str, str] = {
    "mcp-server": "mcprl_mcp_server",
    "inference": "mcprl_inference",
    "scenario-gen": "mcprl_scenario_gen",
    "judge": "mcprl_judge",
    "trainer": "mcprl_trainer",
    "inventory-mcp": "mcprl_example_inventory",
    "stack": "mcprl_stack",
}
_SETTINGS_MODULES = ("settings", "config")
_ENV_FUNCS = {("os", "getenv"), ("environ", "get"), ("os.environ", "get")}


@dataclass(frozen=True)
class EnvVar:
    name: str
    service: str
    default: str
    description: str
    secret: bool = False


def _fmt_default(value: Any) -> str:
    if value is PydanticUndefined:
        return ""
    if isinstance(value, SecretStr):
        return ""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value) if value else ""
    return str(value)


def _default(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        try:
            return field.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return PydanticUndefined
    return field.default


def _is_secret(field: FieldInfo) -> bool:
    return "SecretStr" in repr(field.annotation)


def _field_names(prefix: str, name: str, field: FieldInfo) -> list[str]:
    alias = field.validation_alias
    if isinstance(alias, str):
        return [alias.upper()]
    if isinstance(alias, AliasChoices):
        return [c.upper() for c in alias.choices if isinstance(c, str)]
    if field.alias:
        return [field.alias.upper()]
    return [f"{prefix}{name}".upper()]


def settings_vars(cls: type[BaseSettings], service: str, prefix: str | None = None
                  ) -> list[EnvVar]:
    """The variables one pydantic-settings class reads."""

    prefix = cls.model_config.get("env_prefix", "") if prefix is None else prefix
    out = []
    for name, field in cls.model_fields.items():
        for var in _field_names(prefix, name, field):
            out.append(EnvVar(var, service, _fmt_default(_default(field)),
                              field.description or "", _is_secret(field)))
    return out


def _source_files(package: str) -> list[Path]:
    mod = importlib.import_module(package)
    root = Path(inspect.getfile(mod)).parent
    return sorted(root.rglob("*.py"))


def _literal_env_reads(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            target = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
            attr = func.attr if isinstance(func, ast.Attribute) else ""
            if (target, attr) in _ENV_FUNCS or (target == "os.environ" and attr == "get"):
                names.add(node.args[0].value)
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ" \
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            names.add(node.slice.value)
    return {n for n in names if n.isupper()}


def _upstream_prefixes(tree: ast.AST) -> set[str]:
    prefixes: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            fname = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            arg = node.args[0]
            if fname == "upstream_settings" and isinstance(arg, ast.Constant) \
                    and isinstance(arg.value, str):
                prefixes.add(arg.value)
    return prefixes


def _trainer_vars(service: str) -> list[EnvVar]:
    """The trainer's run config: a pydantic-settings class whose sections are nested models
    (``TRAINER_<SECTION>__<FIELD>``), plus the project-wide aliases it reads."""

    config = importlib.import_module("mcprl_trainer.config")
    out: list[EnvVar] = []
    run_config: type[BaseModel] = config.RunConfig
    prefix: str = getattr(config, "ENV_PREFIX", "TRAINER_")
    aliases: dict[str, tuple[str, ...]] = getattr(config, "ENV_ALIASES", {})

    def field_at(path: tuple[str, ...]) -> FieldInfo | None:
        model: Any = run_config
        field = None
        for part in path:
            if not (inspect.isclass(model) and issubclass(model, BaseModel)):
                return None
            field = model.model_fields.get(part)
            if field is None:
                return None
            model = field.annotation
        return field

    for var, path in aliases.items():
        field = field_at(path)
        out.append(EnvVar(var, service, _fmt_default(_default(field)) if field else "",
                          (field.description or "") if field else "", bool(field and
                          _is_secret(field))))
    for name, field in run_config.model_fields.items():
        ann = field.annotation
        if inspect.isclass(ann) and issubclass(ann, BaseModel):
            for sub, sub_field in ann.model_fields.items():
                out.append(EnvVar(f"{prefix}{name}__{sub}".upper(), service,
                                  _fmt_default(_default(sub_field)), sub_field.description or "",
                                  _is_secret(sub_field)))
        else:
            out.append(EnvVar(f"{prefix}{name}".upper(), service, _fmt_default(_default(field)),
                              field.description or "", _is_secret(field)))
    return out


def service_vars(service: str) -> list[EnvVar]:
    """Every variable one service reads (empty if its package is not installed)."""

    package = PACKAGES[service]
    try:
        importlib.import_module(package)
    except ImportError:
        return []
    found: dict[str, EnvVar] = {}

    def add(items: list[EnvVar]) -> None:
        for item in items:
            if item.name not in found or not found[item.name].description:
                found[item.name] = item

    covered: set[type] = set()
    if service == "trainer":
        add(_trainer_vars(service))
        covered.add(importlib.import_module("mcprl_trainer.config").RunConfig)
    for mod_name in _SETTINGS_MODULES:
        try:
            mod = importlib.import_module(f"{package}.{mod_name}")
        except ImportError:
            continue
        for obj in vars(mod).values():
            if inspect.isclass(obj) and issubclass(obj, BaseSettings) \
                    and obj.__module__ == mod.__name__ and obj not in covered:
                add(settings_vars(obj, service))
    for path in _source_files(package):
        tree = ast.parse(path.read_text(), str(path))
        for prefix in sorted(_upstream_prefixes(tree)):
            add(settings_vars(UpstreamSettings, service, prefix))
        for name in sorted(_literal_env_reads(tree)):
            add([EnvVar(name, service, "", "")])
    return list(found.values())


def all_vars() -> dict[str, list[EnvVar]]:
    return {service: service_vars(service) for service in PACKAGES}
